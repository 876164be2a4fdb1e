"""Run job commands as real processes forked from one that imported the jobs' libraries once
(tests/catalogue_runner.py): ~6-10 s of imports saved per command on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_forked(
    cases: list[tuple[str, list[str], str]], workdir: Path, *, serial: bool = False
) -> dict[str, dict]:
    """``cases``: (name, [job path, args...], cwd). Returns name → {"rc", "stderr", "stdout"}; ``serial`` runs them
    one after the other, in order (cases that build on what the one before left), else two at once."""
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
