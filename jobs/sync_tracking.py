"""Log the runs that finished while the MLflow tracking server was unreachable.

A training job that cannot reach the server after training keeps the whole run (params, every
evaluation's metrics, the test report, the exported model's path) in ``<run storage>/tracking-pending/``
(``outputs/tracking-pending`` for the smoke presets; an s3:// prefix on a cluster); this command logs
each one into its run - idempotently - and removes its file once it is in MLflow. An outage stops it
with one line and a non-zero exit (the rest stay pending); a record the server refuses (an invalid
value, a run deleted meanwhile) is moved to ``rejected/`` beside them and the others are still logged;
the exit is then non-zero and each refused record is named.

    python jobs/sync_tracking.py [--tracking-uri URI] [--storage DIR|s3://...] [--pending DIR|s3://...]
"""

from __future__ import annotations

import argparse
import sys

import _bootstrap

from orchestrator import outbox
from orchestrator.drivers.cli import HelpFormatter
from orchestrator.drivers.registry import log_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: env, else embedded ./mlruns)")
    ap.add_argument("--storage", default="outputs", help="the run storage whose tracking-pending/ to log")
    ap.add_argument("--pending", help="the pending folder itself (default: <storage>/tracking-pending)")
    args = ap.parse_args()
    done, refused = outbox.sync_pending(
        args.tracking_uri, args.pending or outbox.pending_dir(args.storage), log_model
    )
    for path, run_id in done:
        print(f"logged {path} as run {run_id}")
    print(f"{len(done)} pending run(s) logged")
    for path, reason in refused:
        print(f"error: {reason}; the record is kept in {path} and not retried", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    _bootstrap.run(main)
