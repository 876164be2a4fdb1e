"""Hard-negative mining: ``jobs/mine_negatives.py``'s pipeline (encoder actors on a private local Ray, the corpus
streamed) beside sentence-transformers' ``util.mine_hard_negatives`` (one process), on the same 1,000 QQP duplicate
pairs, the same model (the packaged MiniLM), the same filters (3 negatives, relative margin 0.05), against a corpus of
10,000 and of 100,000 distinct passages (WikiSplit sentences, SST-2 training phrases, CrisisLexT26 tweets, first
seen first). Each measurement is a fresh process; its peak RSS is that process's (for ours: the driver, which must
hold the queries' top-k, not the corpus - the target: at 100k within 1.2x of its figure at 10k). Passages/s is the
corpus size over the whole call (model loads and actor start-up included). Whether both return the same rows is
checked on every pair of runs.

    python bench/mine_negatives.py [--sizes 10000 100000] [--pairs 1000] [--actors 1] [--cpus-per-actor 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, SHARED, write_results

SETTINGS = {"num_negatives": 3, "relative_margin": 0.05}


def passages(n: int) -> list[str]:
    """The first ``n`` distinct non-empty lines of the sources, in order."""
    seen: dict[str, None] = {}

    def take(texts):
        for t in texts:
            t = t.strip()
            if t and t not in seen:
                seen[t] = None
                if len(seen) >= n:
                    return True
        return False

    def column(path: Path, name: str):
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                yield row.get(name) or ""

    sources = [
        (SHARED / "corpus" / "wikisplit_split_sentences.txt").read_text(encoding="utf-8").splitlines(),
        (SHARED / "corpus" / "wikisplit_complex_sentences.txt").read_text(encoding="utf-8").splitlines(),
        column(SHARED / "sst2" / "train.tsv", "sentence"),
        column(SHARED / "tweets" / "crisislext26" / "crisislext26.tsv", "text"),
    ]
    for texts in sources:
        if take(texts):
            break
    if len(seen) < n:
        sys.exit(f"only {len(seen)} distinct passages in the sources, {n} asked for")
    return list(seen)


def pairs(n: int) -> list[list[str]]:
    sys.path.insert(0, str(ROOT))
    from orchestrator.data.labelled import read_table

    path = str(ROOT / "data" / "paraphrase" / "qqp-train-duplicates.tsv")
    return [v for _, v in read_table(path, ("sentence1", "sentence2"), limit=n, where={"label": ["1"]})]


class Peaks(threading.Thread):
    """This process's peak resident memory, sampled every 0.2 s from /proc: all of it (VmRSS), its private pages
    (RssAnon) and the shared ones it has touched (RssShmem: Ray's object store, mapped into a driver that reads
    blocks)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssShmem": 0}
        self.start()

    def sample(self) -> None:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in self.peak:
                self.peak[key] = max(self.peak[key], int(value.split()[0]) // 1024)

    def run(self) -> None:
        while True:
            self.sample()
            time.sleep(0.2)


def child(tool: str, corpus: str, pairs_file: str, out: str, actors: int, cpus: float) -> None:
    """One measurement in this process; prints a JSON line."""
    sys.path.insert(0, str(ROOT))
    rows = json.loads(Path(pairs_file).read_text())
    texts = Path(corpus).read_text(encoding="utf-8").splitlines()
    n = len(texts)
    del texts
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peaks = Peaks()
    t0 = time.perf_counter()
    if tool == "sieve":
        os.environ["RAY_ADDRESS"] = "local"
        from orchestrator.data.negatives import MineConfig, check, mine
        from orchestrator.drivers.cluster import init_ray

        tsv = Path(out).with_suffix(".tsv")
        tsv.write_text("q\tpos\n" + "".join(f"{a}\t{p}\n" for a, p in rows), encoding="utf-8")
        cfg = MineConfig(
            pairs={"path": str(tsv), "anchor_column": "q", "positive_column": "pos"},
            corpus={"path": corpus, "format": "text"},
            actors=actors,
            cpus_per_actor=cpus,
            output=out,
            **SETTINGS,
        )
        init_ray(quiet=True)
        mine(cfg, check(cfg))
        import pyarrow.parquet as pq

        got = pq.read_table(out).to_pydict()
        result = [got["anchor"], got["positive"], *(got[f"negative_{m}"] for m in (1, 2, 3))]
    else:
        from datasets import Dataset
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.util import mine_hard_negatives

        from orchestrator.models import resolve_model_source

        model = SentenceTransformer(str(resolve_model_source("default")), device="cpu")
        ds = Dataset.from_dict({"q": [a for a, _ in rows], "pos": [p for _, p in rows]})
        corpus_texts = Path(corpus).read_text(encoding="utf-8").splitlines()
        got = mine_hard_negatives(
            ds, model, corpus=corpus_texts, output_format="n-tuple", batch_size=64, verbose=False, **SETTINGS
        ).to_dict()
        result = [got["q"], got["pos"], *(got[f"negative_{m}"] for m in (1, 2, 3))]
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peaks.sample()
    Path(out).with_suffix(".rows.json").write_text(json.dumps(result))
    print(
        json.dumps(
            {
                "tool": tool,
                "n": n,
                "rss_before_mib": round(before, 1),
                "rss_peak_mib": round(peak, 1),
                "anon_peak_mib": peaks.peak["RssAnon"],
                "shmem_peak_mib": peaks.peak["RssShmem"],
                "wall_s": round(wall, 1),
                "passages_per_s": round(n / wall, 1),
                "rows": len(result[0]),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--actors", type=int, default=1)
    ap.add_argument("--cpus-per-actor", type=float, default=2)
    ap.add_argument(
        "--render", help="redraw the table from this run's JSON (bench/results/mine_negatives.json)"
    )
    ap.add_argument("--child", nargs=4, metavar=("TOOL", "CORPUS", "PAIRS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, args.actors, args.cpus_per_actor)
        return
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        args.pairs = saved["pairs"]
        render(saved["runs"], args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="mine-bench-"))
    pairs_file = tmp / "pairs.json"
    pairs_file.write_text(json.dumps(pairs(args.pairs)))
    runs = []
    for n in args.sizes:
        corpus = tmp / f"corpus-{n}.txt"
        corpus.write_text("\n".join(passages(n)) + "\n", encoding="utf-8")
        same = {}
        for tool in ("sieve", "sentence-transformers"):
            out = tmp / f"{tool}-{n}.parquet"
            cmd = [
                sys.executable,
                __file__,
                "--actors",
                str(args.actors),
                "--cpus-per-actor",
                str(args.cpus_per_actor),
                "--child",
                tool,
                str(corpus),
                str(pairs_file),
                str(out),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not line:
                sys.exit(f"{tool} at {n}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
            runs.append(json.loads(line[-1]))
            same[tool] = json.loads(out.with_suffix(".rows.json").read_text())
            print(runs[-1], flush=True)
        runs[-1]["same_rows"] = runs[-2]["same_rows"] = same["sieve"] == same["sentence-transformers"]
    render(runs, args)


def render(runs: list[dict], args) -> None:
    """The Markdown table and the JSON (``--render FILE.json`` redraws the table from a run's JSON)."""
    by = {(r["tool"], r["n"]): r for r in runs}
    sizes = sorted({r["n"] for r in runs})
    small, large = sizes[0], sizes[-1]
    lines = [
        "# Hard-negative mining: `jobs/mine_negatives.py` beside `sentence_transformers.util.mine_hard_negatives`",
        "",
        f"Command: `python bench/mine_negatives.py --sizes {' '.join(map(str, sizes))} --pairs {args.pairs} "
        f"--actors {args.actors} --cpus-per-actor {args.cpus_per_actor:g}`; {os.cpu_count()} CPU cores, no GPU, "
        f"{time.strftime('%Y-%m-%d')}. {args.pairs} QQP duplicate pairs, MiniLM (packaged), 3 negatives, relative "
        "margin 0.05; each run a fresh process. Peak memory is that process's (ours: the driver; its encoder actors "
        "are other processes, each holding a model and one block): all of it (VmRSS), its private pages (RssAnon) "
        "and the shared pages it touched (RssShmem: Ray's object store, bounded by the store's size, not by the "
        "corpus). Passages/s: corpus size over the whole call, start-up included.",
        "",
        "| tool | passages | passages/s | wall s | peak RSS MiB | private MiB | shared MiB | same rows as the other |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        *(
            f"| {r['tool']} | {r['n']:,} | {r['passages_per_s']:,.1f} | {r['wall_s']} | {r['rss_peak_mib']:,.0f} | "
            f"{r.get('anon_peak_mib', '–')} | {r.get('shmem_peak_mib', '–')} | {'yes' if r['same_rows'] else 'NO'} |"
            for r in runs
        ),
        "",
    ]
    for tool in ("sieve", "sentence-transformers"):
        a, b = by[(tool, small)], by[(tool, large)]
        lines.append(
            f"- {tool}: peak RSS at {large:,} / at {small:,} passages = **{b['rss_peak_mib'] / a['rss_peak_mib']:.2f}x**"
            f" (private memory: {b['anon_peak_mib'] / a['anon_peak_mib']:.2f}x)"
        )
    speed = by[("sieve", large)]["passages_per_s"] / by[("sentence-transformers", large)]["passages_per_s"]
    lines.append(f"- passages/s at {large:,}, ours / sentence-transformers': **{speed:.2f}x**")
    write_results(
        "mine_negatives", {"runs": runs, "settings": SETTINGS, "pairs": args.pairs}, "\n".join(lines)
    )


if __name__ == "__main__":
    main()
