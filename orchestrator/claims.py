"""One run per name at a time: a job claims its ``--name`` in run storage before any work, with one atomic
create (local ``O_EXCL``, S3 conditional write), and gives the claim back when it ends.

A second job of that name is refused in one line naming the owner (host, pid, start time). A claim whose owner
is gone (killed; a machine lost) stays behind: ``--take-over`` runs under the name anyway, and says whose claim
it took - the same for ``--resume``. Whether an owner on another host still runs cannot be told from here, so
the flag is always the user's call, never a guess."""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import uuid

from orchestrator import storage
from orchestrator.errors import ConfigError

_HELD: dict[str, str] = {}  # claim URI → this process's token


def claim_uri(storage_root: str, name: str) -> str:
    return storage.join(storage_root, "claims", f"{name}.json")


def _alive(owner: dict) -> bool | None:
    """Whether the owner's process still runs: known only on its own host (None elsewhere)."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True  # a process we may not signal is still a process; a record we cannot read: assume it runs
    return True


def _describe(owner: dict) -> str:
    return (
        f"{owner.get('job', 'a job')} on {owner.get('host', '?')}, pid {owner.get('pid', '?')}, "
        f"started {owner.get('started', '?')}"
    )


def claim(storage_root: str, name: str, *, job: str, take_over: bool = False) -> None:
    """Claim ``name`` under ``storage_root`` for this process until it exits, or raise one line naming the
    owner. ``take_over``: run under a claim whose owner is gone (refused while its owner still runs here)."""
    uri = claim_uri(storage_root, name)
    token = uuid.uuid4().hex
    record = {
        "job": job,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "token": token,
    }
    data = json.dumps(record).encode()
    if not storage.create_exclusive(uri, data):
        try:
            owner = json.loads(storage.read_bytes(uri))
        except Exception:  # noqa: BLE001 - being written, or released meanwhile: an owner not known
            owner = {}
        if owner.get("token") in _HELD.values():  # this process holds it already (a sweep, then its confirm)
            return
        alive = _alive(owner)
        if alive or not take_over:
            state = {True: "still running", False: "no longer running", None: "on another host"}[alive]
            hint = (
                "wait for it to end, or pick another --name"
                if alive
                else "if it no longer runs, pass --take-over to run under this name"
            )
            raise ConfigError(f"--name {name!r} is claimed by {_describe(owner)} ({state}; {uri}): {hint}")
        storage.write_bytes(uri, data)
        print(f"--take-over: the claim on {name!r} of {_describe(owner)} is now this job's", flush=True)
    _HELD[uri] = token
    if len(_HELD) == 1:
        atexit.register(release_all)


def release_all() -> None:
    """Give back every claim this process holds (at exit; before ``os._exit`` too). A claim another job took
    over meanwhile is left as it is."""
    for uri, token in list(_HELD.items()):
        try:
            if json.loads(storage.read_bytes(uri)).get("token") == token:
                storage.remove(uri)
        except Exception:  # noqa: BLE001, S110 - at exit: a claim left behind is recoverable with --take-over
            pass
        _HELD.pop(uri, None)
