"""Runs the bad-input catalogue's job commands as real processes, without paying the import of torch,
transformers, MLflow and Ray once per case (~10 s each on 2 cores): this process imports what the jobs
import, then forks one child per case. Each child is an ordinary process running ``python jobs/x.py
ARGS`` from that point on - its own argv, working directory, stdout/stderr file descriptors and exit
code - so what the catalogue checks (exit status 2, one ``error:`` line, no traceback) is what a user
would see. A child that raises anything else prints the traceback, as the interpreter would, and exits 1.

    python tests/catalogue_runner.py CASES.json RESULTS.json [--serial]
``--serial``: one case at a time, in order (cases that build on the state the one before left); else two at once.
CASES.json: [{"name", "cmd": [job path, args...], "cwd"}]; RESULTS.json: [{"name", "rc", "stderr", "stdout"}].
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"
sys.path[:0] = [str(JOBS), str(ROOT)]

import _bootstrap  # noqa: E402,F401 - the jobs' environment defaults (offline hub, no usage stats)

import orchestrator  # noqa: E402 - its ENVIRONMENT_DEFAULTS, set again in a child given a whole environment
import orchestrator.drivers.compare  # noqa: E402,F401 - the jobs' heavy imports, once, before forking
import orchestrator.drivers.sweep_job  # noqa: E402,F401
import orchestrator.drivers.train_job  # noqa: E402,F401
import orchestrator.models  # noqa: E402,F401

TIMEOUT_S = 120


def child(
    cmd: list[str],
    cwd: str,
    err_path: str,
    out_path: str | None = None,
    env: dict[str, str] | None = None,
    new_session: bool = False,
) -> None:
    """In the forked child: become ``python cmd...`` and never return (stderr to ``err_path``, stdout to
    ``out_path`` - the same file: one stream, as ``stderr=STDOUT`` - else beside it). ``env``: the process's whole
    environment (the package's defaults added, as its import adds them); ``new_session``: its own process group."""
    code = 1
    try:
        if new_session:
            os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # a job never reads its stdin
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        out = out_path or err_path + ".out"
        os.dup2(fd if out == err_path else os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            for key, value in orchestrator.ENVIRONMENT_DEFAULTS.items():
                os.environ.setdefault(key, value)
        os.chdir(cwd)
        sys.argv = list(cmd)
        sys.path[0] = str(Path(cmd[0]).parent)
        try:
            runpy.run_path(cmd[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at exit (a job gives back its claim on its name)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    results, running, pending = [], {}, list(cases)
    at_once = 1 if "--serial" in sys.argv[3:] else 2  # two: most cases wait on nothing
    workdir = Path(tempfile.mkdtemp(prefix="catalogue-"))
    while pending or running:
        while pending and len(running) < at_once:
            case = pending.pop(0)
            err = str(workdir / f"{len(results) + len(running)}.err")
            pid = os.fork()
            if pid == 0:
                child(case["cmd"], case["cwd"], err)
            running[pid] = (case, err, time.time())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for p, (_, _, t0) in list(running.items()):
                if time.time() - t0 > TIMEOUT_S:
                    os.kill(p, 9)
            time.sleep(0.05)
            continue
        case, err, _ = running.pop(pid)
        results.append(
            {
                "name": case["name"],
                "rc": os.waitstatus_to_exitcode(status),
                "stderr": Path(err).read_text(errors="replace"),
                "stdout": Path(err + ".out").read_text(errors="replace"),
            }
        )
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
