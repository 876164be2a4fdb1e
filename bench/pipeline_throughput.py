"""Throughput of the corpus pipeline: 2 parser actors on Ray Data (one streaming execution) vs a
single-process loop over the same cleaning, parser and augmentations, on the same 10,000 WikiSplit
sentences, in one run.

Both sides run the parser single-threaded (OMP_NUM_THREADS=1; Ray gives each 1-CPU actor one
thread), so the ratio measures the parallelism of the pipeline, not BLAS threads. Neither side is
favoured by going first: both are warmed on a small input, then measured in the order
single, Ray, Ray, single, and each side's two runs are averaged.

    python bench/pipeline_throughput.py [--n 10000] [--reps 2]   (another --n writes pipeline_throughput_<n/1000>k)
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import SHARED, write_results


def single_process(sentences: list[str], cfg) -> tuple[float, float, int]:
    """(total s, parse + augment s, rows kept): clean + dedup/shuffle + parse + augment in a loop,
    the parser loaded inside the timing as each Ray actor loads its own (no file output)."""
    from orchestrator.data.cleaning import clean_records
    from orchestrator.data.corpus import augment_rows, shuffle_key
    from orchestrator.data.parsing import SpacyParser

    t0 = time.perf_counter()
    rows = clean_records([(s, None) for s in sentences], cfg)
    texts = sorted({r["text"] for r in rows if not r["skip"]}, key=lambda t: shuffle_key(t, cfg.seed))
    parser = SpacyParser(batch_size=256)
    t_parse0 = time.perf_counter()
    written = 0
    for i in range(0, len(texts), 256):
        batch = texts[i : i + 256]
        out = augment_rows(batch, [shuffle_key(t, cfg.seed) for t in batch], parser, cfg)
        written += sum(1 for s in out["skip"] if not s)
    end = time.perf_counter()
    return end - t0, end - t_parse0, written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()

    sources = [
        SHARED / "corpus" / "wikisplit_complex_sentences.txt",
        SHARED / "corpus" / "wikisplit_split_sentences.txt",
    ]
    sentences = [s for src in sources for s in src.read_text(encoding="utf-8").splitlines()][
        : args.n
    ]  # 15k, then 30k
    tmp = Path(tempfile.mkdtemp())
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    warm = tmp / "warm.txt"
    warm.write_text("\n".join(sentences[:300]) + "\n")

    from orchestrator.data.corpus import CorpusConfig, run_pipeline
    from orchestrator.drivers.cluster import init_ray

    settings = dict(
        max_words=64, shard_rows=5000, parser={"workers": 2, "cpus_per_worker": 1, "batch_size": 256}
    )
    cfg = CorpusConfig(input=str(corpus), **settings)
    init_ray()  # a local Ray with 4 logical CPUs on this 2-core machine; started before any timing
    import ray

    single_process(sentences[:300], cfg)  # warm both: imports, spaCy's files, Ray Data's first execution
    run_pipeline(CorpusConfig(input=str(warm), **settings), str(tmp / "warm-out"), progress=False)

    singles, rays, manifests = [], [], []
    for rep in range(args.reps):
        for side in ("single", "ray") if rep % 2 == 0 else ("ray", "single"):
            if side == "single":
                total, parse, written = single_process(sentences, cfg)
                singles.append({"total_s": total, "parse_augment_s": parse})
            else:
                t0 = time.perf_counter()
                m = run_pipeline(cfg, str(tmp / f"out{rep}"), progress=False)
                rays.append({"total_s": time.perf_counter() - t0, **m["timings_s"]})
                manifests.append(m)
    ray.shutdown()

    n = manifests[0]["written"]
    assert all(m["written"] == n for m in manifests) and n == written, (n, written)
    mean = lambda rows, k: statistics.mean(r[k] for r in rows)  # noqa: E731
    s_total, s_parse = mean(singles, "total_s"), mean(singles, "parse_augment_s")
    r_total, r_window, r_first = (
        mean(rays, "total_s"),
        mean(rays, "parse_window_s"),
        mean(rays, "until_first_parse_s"),
    )
    res = {
        "sentences_in": len(sentences),
        "sentences_written": n,
        "reps": args.reps,
        "order": "warm both, then single, ray, ray, single (ABBA), means",
        "single_process": {
            "runs": singles,
            "total_s": s_total,
            "parse_augment_s": s_parse,
            "sent_per_s": n / s_total,
        },
        "ray_2_actors": {"runs": rays, "total_s": r_total, "sent_per_s": n / r_total},
        "ratio_ray_over_single": s_total / r_total,
        "parse_window_ratio": s_parse / r_window,
    }
    runs = lambda rows: " / ".join(f"{r['total_s']:.1f}" for r in rows)  # noqa: E731
    md = f"""# Corpus pipeline throughput ({len(sentences):,} WikiSplit sentences, spaCy sm, {os.cpu_count()} cores)

Command: `.venv/bin/python bench/pipeline_throughput.py --n {args.n} --reps {args.reps}` (both sides in one
run: warmed on 300 sentences, then single, Ray, Ray, single; means of each side's runs)

| pipeline | wall s (runs) | sentences/s |
|---|---:|---:|
| single process loop (clean + dedup + parse + augment, no file output) | {s_total:.1f} ({runs(singles)}) | {n / s_total:.1f} |
| Ray Data, 2 parser actors, one streaming execution (read + clean + sort + dedup + parse + augment + parquet + manifest) | {r_total:.1f} ({runs(rays)}) | {n / r_total:.1f} |
| **ratio Ray / single, whole pipeline** | | **{res["ratio_ray_over_single"]:.2f}x** |
| parse + augment, steady state: single {s_parse:.1f} s vs the 2 actors' first-batch-start → last-batch-end window {r_window:.1f} s | | **{res["parse_window_ratio"]:.2f}x** |

Where the Ray side's time goes (means): {r_first:.1f} s from the start to the first parsed batch (read,
clean, the sort, the dedup actor, while the parser actors load spaCy), {r_window:.1f} s parsing,
{mean(rays, "after_last_parse_s"):.1f} s after the last parsed batch (the last write, the manifest).

The pipeline is one streaming execution: nothing is materialized between stages, the only barrier is
the sort that an exact global dedup and the seeded shuffle need, and every count in the manifest comes
from what the writers report (tally rows that travel with the data). The parser actors start while
the input is read and sorted. Why the ratio stays under 2 on 2 cores: the two actors share the 2 cores
with Ray's own processes (GCS, raylet, dashboard and its agent, the driver's streaming executor).
"""
    write_results(
        "pipeline_throughput" if args.n == 10000 else f"pipeline_throughput_{args.n // 1000}k", res, md
    )


if __name__ == "__main__":
    main()
