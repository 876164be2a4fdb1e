"""Run job commands as real processes forked from one that imported the jobs' libraries once
(tests/catalogue_runner.py): ~6-10 s of imports saved per command on 2 cores. :func:`run_forked` runs a batch
of short commands; :class:`JobServer` starts long ones one at a time (tests/job_server.py), each handed back as
a :class:`ForkedJob` that reads like the ``subprocess.Popen`` the end-to-end tests used."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_forked(
    cases: list[tuple[str, list[str], str]],
    workdir: Path,
    *,
    serial: bool = False,
    jobs: JobServer | None = None,
) -> dict[str, dict]:
    """``cases``: (name, [job path, args...], cwd). Returns name → {"rc", "stderr", "stdout"}; ``serial`` runs them
    one after the other, in order (cases that build on what the one before left), else two at once. ``jobs``: the
    session's job server forks them (no import paid here), else a catalogue runner of their own."""
    if jobs is not None:
        return _run_on(jobs, cases, 1 if serial else 2)
    spec, out = Path(workdir) / "forked_cases.json", Path(workdir) / "forked_results.json"
    spec.write_text(json.dumps([{"name": n, "cmd": cmd, "cwd": str(cwd)} for n, cmd, cwd in cases]))
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "catalogue_runner.py"), str(spec), str(out)]
        + (["--serial"] if serial else []),
        capture_output=True,
        text=True,
        timeout=600,
        # a laptop's jobs: the session's cluster not named, so a case that got past its checks would start a Ray
        # of its own (which the catalogue looks for), and resources are checked against the local machine
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    if serial:
        assert [r["name"] for r in got] == [n for n, _, _ in cases]  # in order, one at a time
    return {r["name"]: r for r in got}


def _run_on(jobs: JobServer, cases: list, at_once: int) -> dict[str, dict]:
    """:func:`run_forked`'s cases forked by ``jobs``, ``at_once`` at a time, in order, each within 120 s."""
    # as run_forked's runner: a laptop's jobs, the session's cluster not named
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    got, running = {}, []

    def finish_first() -> None:
        name, job = running.pop(0)
        out, err = job.communicate(120)
        got[name] = {"name": name, "rc": job.returncode, "stderr": err, "stdout": out}

    for name, cmd, cwd in cases:
        running.append((name, jobs.start(cmd, cwd=Path(cwd), env=env, stderr_apart=True)))
        if len(running) == at_once:
            finish_first()
    while running:
        finish_first()
    return got


class JobServer:
    """tests/job_server.py, started once (a session fixture): ``start(cmd, ...)`` forks ``python cmd...``."""

    def __init__(self, workdir: Path):
        self.workdir, self.socket = Path(workdir), str(Path(workdir) / "jobs.sock")
        self.count = itertools.count()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "job_server.py"), self.socket], stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while not Path(self.socket + ".ready").exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the job server did not start"
            time.sleep(0.1)

    def start(
        self,
        cmd: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        stderr_apart: bool = False,
        new_session: bool = False,
    ) -> ForkedJob:
        """``python cmd...`` (``cmd[0]`` a job's path) in ``cwd`` with ``env`` (default: this process's); stdout
        and stderr one stream unless ``stderr_apart``."""
        base = self.workdir / f"job-{next(self.count)}"
        out, err = f"{base}.out", (f"{base}.err" if stderr_apart else None)
        request = {
            "cmd": [str(c) for c in cmd],
            "cwd": str(cwd),
            "env": dict(os.environ if env is None else env),
            "out": out,
            "err": err,
            "new_session": new_session,
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.socket)
            conn.sendall((json.dumps(request) + "\n").encode())
            pid = json.loads(conn.makefile().readline())["pid"]
        return ForkedJob(pid, out, err)

    def run(
        self, cmd: list, *, cwd=None, env=None, timeout: float | None = None, **_: object
    ) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, capture_output=True, text=True, ...)`` for a job's command (``cmd`` may start with
        ``sys.executable``): its exit code, stdout and stderr apart."""
        cmd = [str(c) for c in cmd]
        job = self.start(
            cmd[1:] if cmd[0] == sys.executable else cmd,
            cwd=Path(cwd or Path.cwd()),
            env=env,
            stderr_apart=True,
        )
        out, err = job.communicate(timeout)
        return subprocess.CompletedProcess(cmd, job.returncode, out, err)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class _Text:
    def __init__(self, path: str):
        self.path = path

    def read(self) -> str:
        return Path(self.path).read_text(errors="replace") if Path(self.path).exists() else ""


class ForkedJob:
    """A forked job as the tests read a ``subprocess.Popen``: ``pid``, ``poll``, ``wait``, ``communicate``,
    ``kill``, ``returncode``, ``stdout.read()`` (its output so far). Its exit status is the server's (it reaps)."""

    def __init__(self, pid: int, out: str, err: str | None):
        self.pid, self.returncode = pid, None
        self.stdout, self.stderr = _Text(out), (_Text(err) if err else None)

    def poll(self) -> int | None:
        rc = Path(self.stdout.path + ".rc")
        if self.returncode is None and rc.exists():
            self.returncode = int(rc.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"job {self.pid}", timeout)
            time.sleep(0.1)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Wait for the end (killed past ``timeout``, as ``subprocess.run`` kills): (stdout, stderr or None)."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.stdout.read(), (self.stderr.read() if self.stderr else None)

    @property
    def ended_at(self) -> float:
        """When it ended (the server wrote its exit status then): its duration, whenever a test reads it."""
        return Path(self.stdout.path + ".rc").stat().st_mtime

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
