"""Log the runs that finished while the MLflow tracking server was unreachable.

A training job that cannot reach the server after training keeps the whole run (params, every
evaluation's metrics, the test report, the exported model's path) in ``outputs/tracking-pending/``;
this command logs each one and removes its file once it is in MLflow.

    python jobs/sync_tracking.py [--tracking-uri URI] [--pending DIR]
"""

from __future__ import annotations

import argparse

import _bootstrap

from orchestrator.drivers import publish


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: env, else embedded ./mlruns)")
    ap.add_argument("--pending", default=str(publish.PENDING_DIR))
    args = ap.parse_args()
    done = publish.sync_pending(args.tracking_uri, args.pending)
    for path, run_id in done:
        print(f"logged {path} as run {run_id}")
    print(f"{len(done)} pending run(s) logged")
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
