"""Evaluation encoding: batches sorted by token count vs by characters (sentence-transformers' order), side by side.

The same MiniLM (mean pooling), the same sentences - the unique sentences of the 7 STS test sets and
of STS-B dev, as every STS evaluation encodes them - at the evaluation's batch size and max length,
on the same threads. Each round runs both orders, the first of the pair alternating between rounds.
Reports the wall time of each, the tokens each pads its batches to, and how far the two orders'
embeddings and STS figures are apart (padding is masked: only float rounding may differ).

    python bench/encode_order.py [--rounds 2] [--threads 2] [--batch 128] [--max-length 64]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import time

import numpy as np
import torch
from _common import write_results


def padded_tokens(enc, sentences: list[str]) -> int:
    """Tokens the batches hold with padding (what the model computes over) in ``enc``'s order."""
    lengths = np.asarray(
        [len(x) for x in enc.tokenizer(sentences, truncation=True, max_length=enc.max_length)["input_ids"]]
    )
    order = np.argsort([-n for n in enc.lengths(sentences)], kind="stable")
    return int(
        sum(
            lengths[order[i : i + enc.batch_size]].max() * len(order[i : i + enc.batch_size])
            for i in range(0, len(sentences), enc.batch_size)
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from orchestrator.evaluation import sts
    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import default_model_path, load_encoder

    model, tok = load_encoder(str(default_model_path()))
    tasks = [*sts.SEVEN_TASKS, "stsb_dev"]
    data = {t: sts.load_task(t) for t in tasks}
    unique = {t: list(dict.fromkeys(d.sentence1 + d.sentence2)) for t, d in data.items()}
    encoders = {
        k: HFEncoder(model, tok, pooling="mean", batch_size=args.batch, max_length=args.max_length, sort_by=k)
        for k in ("chars", "tokens")
    }
    real = sum(
        len(x)
        for u in unique.values()
        for x in tok(u, truncation=True, max_length=args.max_length)["input_ids"]
    )
    padded = {k: sum(padded_tokens(e, u) for u in unique.values()) for k, e in encoders.items()}
    walls: dict[str, list[float]] = {k: [] for k in encoders}
    results: dict[str, dict] = {}
    embeddings: dict[str, dict] = {}
    for r in range(args.rounds):
        for k in ("chars", "tokens") if r % 2 == 0 else ("tokens", "chars"):
            t0 = time.perf_counter()
            embeddings[k] = {t: encoders[k].encode(u) for t, u in unique.items()}
            walls[k].append(time.perf_counter() - t0)
            print(f"round {r + 1}: {k} {walls[k][-1]:.1f} s", flush=True)
    for k, e in encoders.items():  # the figures: the STS harness on each order
        results[k] = {t: sts.evaluate_data(e, d) for t, d in data.items()}

    emb_diff = max(float(np.abs(embeddings["chars"][t] - embeddings["tokens"][t]).max()) for t in tasks)
    metric_diff = {
        t: max(
            abs(results["chars"][t][m]["all"] - results["tokens"][t][m]["all"])
            for m in ("pearson", "spearman")
        )
        for t in tasks
    }
    mean = {k: float(np.mean(v)) for k, v in walls.items()}
    out = {
        "command": "python bench/encode_order.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "sentences": sum(len(u) for u in unique.values()),
        "real_tokens": real,
        "padded_tokens": padded,
        "wall_s": walls,
        "mean_wall_s": mean,
        "speedup": mean["chars"] / mean["tokens"],
        "max_abs_embedding_diff": emb_diff,
        "max_abs_metric_diff": metric_diff,
        "figures": {
            k: {t: {m: results[k][t][m]["all"] for m in ("pearson", "spearman")} for t in tasks}
            for k in results
        },
    }
    rows = "\n".join(
        f"| {k} | {padded[k]:,} | {padded[k] / real:.2f} | {mean[k]:.1f} | "
        f"{', '.join(f'{w:.1f}' for w in walls[k])} |"
        for k in ("chars", "tokens")
    )
    md = f"""# Evaluation encoding: batches by token count vs by characters

Command: `{out["command"]}` (MiniLM, mean pooling, {args.threads} thread(s); the {out["sentences"]:,} unique
sentences of the 7 STS test sets and STS-B dev, each set encoded as the STS harness does; {args.rounds} rounds,
the order that runs first alternating). Machine: {os.cpu_count()} CPUs.

| batches sorted by | tokens computed (with padding) | / real tokens ({real:,}) | mean wall s | each round, s |
|---|---:|---:|---:|---|
{rows}

Token order is **{out["speedup"]:.2f}x** the speed of character order. Largest difference between the two orders'
embeddings: {emb_diff:.1e} (absolute, one coordinate); largest difference in any set's Pearson or Spearman
(`all`): {max(metric_diff.values()):.1e}.
"""
    write_results("encode_order", out, md)


if __name__ == "__main__":
    main()
