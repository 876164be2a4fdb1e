"""A server that forks job processes from one that imported the jobs' libraries once (the catalogue runner's
imports and its ``child``): the end-to-end tests start ``python jobs/x.py ARGS`` through it without paying ~8 s
of imports on 2 cores per start. Each child is an ordinary process from the fork on - its own pid, argv,
working directory, environment (the request's, whole), output files, process group when asked, exit code - and
the server reaps it and writes its exit status beside its output (``-N``: killed by signal N).

    python tests/job_server.py SOCKET      # one JSON request per connection, answered with {"pid": N}
A request: {"cmd": [job path, args...], "cwd", "env", "out", "err" (null: into "out"), "new_session"}.
Stopped by SIGTERM: children still running are killed with it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

from catalogue_runner import child  # the jobs' heavy imports happen here, once


def main() -> None:
    path = sys.argv[1]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    running: dict[int, str] = {}  # pid -> where its exit status goes

    def stop(signum, frame):
        for pid in running:
            for kill in (os.killpg, os.kill):  # its group when it has one of its own
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    Path(path + ".ready").write_text("")
    while True:
        while running:  # reap at once: a killed job's claim must read "no longer running" right away
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            rc_path = running.pop(pid)
            Path(rc_path + ".tmp").write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(rc_path + ".tmp", rc_path)
        if not select.select([server], [], [], 0.05)[0]:
            continue
        conn, _ = server.accept()
        with conn:
            req = json.loads(conn.makefile().readline())
            out = req["out"]
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                child(req["cmd"], req["cwd"], req["err"] or out, out, req["env"], req["new_session"])
            running[pid] = out + ".rc"
            conn.sendall((json.dumps({"pid": pid}) + "\n").encode())


if __name__ == "__main__":
    main()
