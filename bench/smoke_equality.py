"""Compare every figure two smoke sweeps wrote: ``python bench/smoke_equality.py DIR_BEFORE DIR_AFTER``.

Each DIR is a sweep's report folder (the ``report:`` line of ``jobs/sifter_sweep.py`` names it). Every number in
its ``trials.json``, ``summary.json``, ``base.json`` and ``leaderboard.json`` is compared, leaving out timings, paths and run ids (keys
below); the script prints each difference and the count of identical figures, and exits 1 on any difference.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FILES = ("trials.json", "summary.json", "base.json", "leaderboard.json")
SKIP = re.compile(
    r"(time|_s$|seconds|duration|path|dir|uri|run_id|trial_id|logdir|date|report|host|pid|node)", re.I
)


def leaves(obj, prefix=""):
    """(dotted key, number) for every number under ``obj``, the skipped keys left out."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not SKIP.search(str(k)):
                yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{prefix}[{i}]")
    elif isinstance(obj, bool) or obj is None:
        return
    elif isinstance(obj, int | float):
        yield prefix, obj


def figures(folder: Path) -> dict[str, float]:
    out = {}
    for name in FILES:
        path = folder / name
        if path.exists():
            out.update({f"{name}:{k}": v for k, v in leaves(json.loads(path.read_text()))})
    return out


def main(before: str, after: str) -> int:
    a, b = figures(Path(before)), figures(Path(after))
    diffs = [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for key, x, y in diffs:
        print(f"differs: {key}: {x} -> {y}")
    print(
        f"{len(set(a) & set(b)) - sum(1 for k, x, y in diffs if x is not None and y is not None)} of "
        f"{len(set(a) | set(b))} figures identical"
    )
    return 1 if diffs else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="the first sweep's report folder")
    ap.add_argument("after", help="the second sweep's report folder")
    args = ap.parse_args()
    sys.exit(main(args.before, args.after))
