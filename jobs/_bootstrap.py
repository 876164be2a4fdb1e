"""Shared start-up for every entry point in jobs/ (kept tiny on purpose).

``python jobs/x.py`` puts ``jobs/`` on ``sys.path``, not the repo root, and on a Ray cluster
the project is a ``--working-dir`` copy rather than an installed package; so the repo root is
put on the path here, and ``orchestrator`` imported: its ``__init__`` sets the environment defaults.
``run(main)`` turns a :class:`SieveError` into one line on stderr and
exit code 2, with no traceback.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import orchestrator  # noqa: E402,F401 - on the path only now; its import sets the environment defaults


def run(main) -> None:
    from orchestrator.errors import SieveError  # here, not at the top: sys.path gets the repo root above
    from orchestrator.uris import redact

    # `kill` / `ray job stop` (SIGTERM) ends a job as Ctrl-C does: its MLflow run is closed and its claim on
    # its name given back on the way out (the default would end the process on the spot)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        code = main()
    except SieveError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)  # no URI's password, whoever wrote the message
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt
