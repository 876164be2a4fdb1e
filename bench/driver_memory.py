"""Peak memory of the driver process while the corpus pipeline runs, on the smoke corpus's size
(3,000 sentences) and on ten times it (30,000), each in a fresh process with its own local Ray,
alternating sizes (smoke, 10x, smoke, 10x) so that neither side is favoured by running first.

The driver must hold a few numbers, not rows: the pipeline is one streaming execution, and its
counts are the sum of what each parquet write task reports (#22.2). The target (#18): peak driver RSS on 10x the
smoke corpus within 20% of the smoke corpus's.

    python bench/driver_memory.py [--small 3000] [--factor 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, SHARED, write_results

SOURCES = [
    SHARED / "corpus" / "wikisplit_split_sentences.txt",
    SHARED / "corpus" / "wikisplit_complex_sentences.txt",
]


def child(n: int, corpus: str) -> None:
    """One measurement: the pipeline over the n sentences in ``corpus``; prints a JSON line."""
    os.environ["RAY_ADDRESS"] = "local"
    sys.path.insert(0, str(ROOT))
    tmp = Path(tempfile.mkdtemp())
    from orchestrator.data.corpus import CorpusConfig, run_pipeline
    from orchestrator.drivers.cluster import init_ray

    init_ray(quiet=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB: imports + Ray client
    t0 = time.perf_counter()
    manifest = run_pipeline(
        CorpusConfig(input=corpus, max_words=32, min_words=3, parser={"workers": 2, "cpus_per_worker": 1}),
        str(tmp / "out"),
        progress=False,
    )
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "n": n,
                "rows": manifest["written"],
                "rss_before_mib": round(before, 1),
                "rss_peak_mib": round(peak, 1),
                "wall_s": round(wall, 1),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=3000)
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(int(args.child[0]), args.child[1])
    lines = [line for src in SOURCES for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    tmp = Path(tempfile.mkdtemp())
    files = {}
    for n in (args.small, args.small * args.factor):
        if len(lines) < n:
            sys.exit(f"only {len(lines)} sentences in {SOURCES}; {n} needed")
        files[n] = tmp / f"corpus-{n}.txt"
        files[n].write_text("\n".join(lines[:n]) + "\n")
    del lines
    sizes = [args.small, args.small * args.factor] * args.repeats
    runs = []
    for n in sizes:
        res = subprocess.run(
            [sys.executable, __file__, "--child", str(n), str(files[n])],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if res.returncode != 0:
            sys.exit(res.stderr[-3000:])
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(runs[-1], flush=True)
    small = [r for r in runs if r["n"] == args.small]
    large = [r for r in runs if r["n"] != args.small]
    peak_s, peak_l = max(r["rss_peak_mib"] for r in small), max(r["rss_peak_mib"] for r in large)
    growth = lambda rs: max(r["rss_peak_mib"] - r["rss_before_mib"] for r in rs)  # noqa: E731
    ratio = peak_l / peak_s
    md = [
        f"# Driver memory of the corpus pipeline: {args.small:,} vs {args.small * args.factor:,} sentences",
        "",
        f"Command: `python bench/driver_memory.py --small {args.small} --factor {args.factor} --repeats "
        f"{args.repeats}` (each run a fresh process with its own local Ray, sizes alternating; 2 parser actors, "
        "spaCy sm, WikiSplit sentences from `../shared/data/corpus`). RSS = the driver's peak resident set "
        "(`getrusage`), MiB; 'before' = after imports and `ray.init`, before the pipeline.",
        "",
        "| sentences | rows written | RSS before | RSS peak | peak − before | wall s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['n']:,} | {r['rows']:,} | {r['rss_before_mib']:.0f} | {r['rss_peak_mib']:.0f} | "
        f"{r['rss_peak_mib'] - r['rss_before_mib']:.0f} | {r['wall_s']:.1f} |"
        for r in runs
    ]
    verdict = "within" if ratio <= 1.2 else "NOT within"
    md += [
        "",
        f"**Peak driver RSS, {args.factor}× corpus / smoke corpus: {ratio:.2f}×** ({peak_l:.0f} vs "
        f"{peak_s:.0f} MiB; largest growth during the pipeline {growth(large):.0f} vs {growth(small):.0f} MiB) "
        f"— {verdict} the 20% target.",
    ]
    write_results("driver_memory", {"runs": runs, "ratio_peak": ratio, "target": 1.2}, "\n".join(md))


if __name__ == "__main__":
    main()
