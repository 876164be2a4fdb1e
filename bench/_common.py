"""Small helpers shared by the benchmarks: results go to bench/results/<name>.{json,md}."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SHARED = Path(
    os.environ.get("SIEVE_SHARED_DATA", ROOT.parent / "shared" / "data")
)  # the data beside the repo
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def write_results(name: str, data: dict, markdown: str, folder: Path = RESULTS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "machine": machine(), **data}
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (folder / f"{name}.md").write_text(markdown.rstrip() + "\n")
    print(markdown)
