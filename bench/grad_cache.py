"""Cached gradients on the CPU: a worker's peak memory and step time for SIFTER-SimCSE on MiniLM (the
papers' setting: [CLS] + MLP, max length 32, three views), side by side in one run:

* batch 512 cached at mini-batch 32 (``train.grad_cache.mini_batch=32``),
* batch 512 plain,
* batch 32 plain.

Each variant runs in a fresh process (its peak RSS is its own: ``ru_maxrss``; the RSS after the model is
built is subtracted to give what the step itself holds), on the same sentences (the WikiSplit sample with
SIFTER's Y and Z views from spaCy), the same weights and seed, for a warm-up step and ``--steps`` timed
steps, with torch on ``--threads`` threads. The variants run in rounds, in the order A B C then C B A, so
none is favoured by the machine's drift; each figure is the median over rounds. The cached and plain
512 steps' losses are printed beside each other (the same loss: the same batch, no dropout difference at
step 1 beyond the mini-batched masks).

    python bench/grad_cache.py [--steps 2] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_results

VARIANTS = {"cached 512 (mini-batch 32)": (512, 32), "plain 512": (512, None), "plain 32": (32, None)}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def views(n: int) -> dict[str, list[str]]:
    """The first ``n`` WikiSplit sentences with SIFTER's Y (the rule: tree layers or a triple) and Z views."""
    import random

    from orchestrator.data.augment import backbone_view, deletion_view
    from orchestrator.data.parsing import SpacyParser

    texts = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:n]
    parses = SpacyParser().parse_batch(texts)
    rng = random.Random(0)
    return {
        "text": texts,
        "backbone_view": [backbone_view(p, rng, source="rule") for p in parses],
        "deletion_view": [deletion_view(p) for p in parses],
    }


def one_variant(rows: dict, batch: int, mini_batch: int | None, steps: int, threads: int) -> dict:
    import torch

    from trainers import common
    from trainers.sifter_simcse import ContrastiveConfig, build_model, compute_loss

    torch.set_num_threads(threads)
    train = {
        "batch_size": batch,
        "lr": 3e-5,
        **({"grad_cache": {"mini_batch": mini_batch}} if mini_batch else {}),
    }
    cfg = ContrastiveConfig.model_validate(
        {
            "model": {"name_or_path": "default", "max_length": 32, "pooling": "cls"},
            "train": train,
            "scaling": {"num_workers": 1},
        }
    )
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    model.train()
    stepper = common.make_stepper(model, cfg, rows_per_worker=batch * (steps + 1))
    base = rss_mb()
    times, losses = [], []
    for i in range(steps + 1):
        chunk = {k: v[i * batch : (i + 1) * batch] for k, v in rows.items()}
        t0 = time.perf_counter()
        loss, logs = compute_loss(stepper.model, tok, chunk, cfg)
        stepper.step(loss)
        times.append(time.perf_counter() - t0)
        losses.append(logs["loss"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "step_s": statistics.median(times[1:]),
        "peak_rss_mb": peak,
        "rss_after_build_mb": base,
        "step_peak_mb": peak - base,
        "first_loss": losses[0],
        "sequences_per_step": 3 * batch,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # a child process: run one variant, print JSON
    ap.add_argument("--rows", help=argparse.SUPPRESS)  # the child's sentences and views (JSON)
    args = ap.parse_args()
    if args.variant:
        batch, mini = VARIANTS[args.variant]
        rows = json.loads(Path(args.rows).read_text())
        print(json.dumps(one_variant(rows, batch, mini, args.steps, args.threads)))
        return

    t_start = time.perf_counter()
    rows_file = Path(tempfile.mkdtemp()) / "rows.json"  # parsed once, here: the children hold no parser
    rows_file.write_text(json.dumps(views(512 * (args.steps + 1))))
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for v in order:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--variant",
                    v,
                    "--rows",
                    str(rows_file),
                    "--steps",
                    str(args.steps),
                    "--threads",
                    str(args.threads),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(v, runs[v][-1], flush=True)
    med = {v: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for v, rs in runs.items()}
    c, p512, p32 = (med[v] for v in VARIANTS)
    ratios = {
        "cached512_vs_plain32_peak_rss": c["peak_rss_mb"] / p32["peak_rss_mb"],
        "cached512_vs_plain32_step_memory": c["step_peak_mb"] / p32["step_peak_mb"],
        "cached512_vs_plain512_peak_rss": c["peak_rss_mb"] / p512["peak_rss_mb"],
        "cached512_vs_plain512_step_time": c["step_s"] / p512["step_s"],
    }
    wall = time.perf_counter() - t_start
    cmd = f"python bench/grad_cache.py --steps {args.steps} --rounds {args.rounds} --threads {args.threads}"
    rows = "\n".join(
        f"| {v} | {m['sequences_per_step']:.0f} | {m['peak_rss_mb']:.0f} | {m['step_peak_mb']:.0f} | "
        f"{m['step_s']:.2f} | {m['first_loss']:.4f} |"
        for v, m in med.items()
    )
    md = f"""# Cached gradients (GradCache) on the CPU: memory and step time

Command: `{cmd}` ({wall / 60:.1f} min on {__import__("os").cpu_count()} cores). SIFTER-SimCSE on MiniLM
([CLS] + MLP, max length 32, X/Y/Z views of the WikiSplit sample), one worker, torch on {args.threads} threads;
each variant in a fresh process, rounds A B C / C B A, medians over {args.rounds} rounds of {args.steps} timed
steps after a warm-up step. Peak RSS is the process's (`ru_maxrss`); "step memory" is the peak less the RSS
once the model and optimiser were built.

| variant | sequences / step | peak RSS MB | step memory MB | step s | loss at step 1 |
|---|---:|---:|---:|---:|---:|
{rows}

- cached 512 / plain 32, peak RSS: **{ratios["cached512_vs_plain32_peak_rss"]:.2f}×** (target ≤ 1.5×);
  step memory alone: {ratios["cached512_vs_plain32_step_memory"]:.2f}×
- cached 512 / plain 512, peak RSS: {ratios["cached512_vs_plain512_peak_rss"]:.2f}×
- cached 512 / plain 512, step time: **{ratios["cached512_vs_plain512_step_time"]:.2f}×** (target ≤ 1.4×: the
  extra forward costs about a third)

The cached and plain 512 steps see the same batch: their step-1 losses agree (dropout masks are drawn per
mini-batch in the cached step, so they are close, not equal). On a GPU the same comparison reads CUDA's
`max_memory_allocated` (`bench/gpu.sh`).
"""
    write_results(
        "grad_cache_cpu", {"command": cmd, "wall_s": wall, "runs": runs, "median": med, "ratios": ratios}, md
    )


if __name__ == "__main__":
    main()
