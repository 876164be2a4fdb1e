"""Encode speed of an exported encoder three ways, side by side in one run: the PyTorch sentence-transformers
folder, its ONNX fp32 copy and its int8 copy (``export.onnx: [fp32, int8]``, ``orchestrator/onnx_export.py``), on
the packaged MiniLM. Throughput: the 2,551 distinct STS-B test sentences at batch 64 (best of 3 passes); latency:
one sentence a call (median and 95th percentile of 200 calls, after 20 warm-up calls). Every way uses the same
threads (all cores). Also each copy's cosine with the PyTorch embeddings (mean, lowest).

    python bench/onnx_encode.py [--repeats 3] [--calls 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import write_results


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def latencies(fn, sentence: str, calls: int) -> tuple[float, float]:
    for _ in range(20):
        fn([sentence])
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn([sentence])
        out.append(time.perf_counter() - t0)
    return float(np.median(out)) * 1000, float(np.percentile(out, 95)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    from orchestrator.evaluation import sts
    from orchestrator.export import export_encoder
    from orchestrator.models import load_encoder
    from orchestrator.onnx_export import FILES, OnnxEncoder, write_onnx

    folder = Path(tempfile.mkdtemp()) / "model"
    model, tok = load_encoder("default")
    export_encoder(
        model,
        tok,
        folder,
        pooling="mean",
        max_seq_length=128,
        write_more=lambda f: write_onnx(f, ["fp32", "int8"]),
    )
    data = sts.load_task("stsb")
    texts = list(dict.fromkeys(data.sentence1 + data.sentence2))
    st = SentenceTransformer(str(folder), device="cpu")
    ways = {
        "PyTorch (sentence-transformers)": lambda t: st.encode(t, batch_size=64),
        "ONNX fp32": OnnxEncoder(folder, "fp32", batch_size=64).encode,
        "ONNX int8": OnnxEncoder(folder, "int8", batch_size=64).encode,
    }
    reference = ways["PyTorch (sentence-transformers)"](texts)
    rows, runs = [], []
    for name, fn in ways.items():
        emb = fn(texts)
        cos = (emb * reference).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(reference, axis=1)
        seconds = timed(lambda fn=fn: fn(texts), args.repeats)
        p50, p95 = latencies(fn, "A man is playing a guitar on the stage.", args.calls)
        size = (
            sum(p.stat().st_size for p in folder.glob("*.safetensors"))
            if "PyTorch" in name
            else ((folder / "onnx" / FILES["fp32" if "fp32" in name else "int8"]).stat().st_size)
        )
        runs.append(
            {
                "way": name,
                "sentences_per_s": len(texts) / seconds,
                "latency_p50_ms": p50,
                "latency_p95_ms": p95,
                "cosine_mean": float(cos.mean()),
                "cosine_min": float(cos.min()),
                "file_mb": size / 1e6,
            }
        )
    base = runs[0]
    for r in runs:
        rows.append(
            f"| {r['way']} | {r['sentences_per_s']:,.0f} | {r['sentences_per_s'] / base['sentences_per_s']:.2f}x | "
            f"{r['latency_p50_ms']:.1f} | {r['latency_p95_ms']:.1f} | {r['cosine_mean']:.4f} | {r['cosine_min']:.4f} | "
            f"{r['file_mb']:.0f} |"
        )
    md = "\n".join(
        [
            "# Encode speed: PyTorch vs ONNX fp32 vs ONNX int8 (packaged MiniLM, CPU)",
            "",
            f"Command: `python bench/onnx_encode.py --repeats {args.repeats} --calls {args.calls}`. Throughput: "
            f"{len(texts):,} distinct STS-B test sentences at batch 64, best of {args.repeats}; latency: one "
            f"sentence a call, {args.calls} calls. Cosine: with the PyTorch embeddings of the same sentences.",
            "",
            "| way | sentences/s | vs PyTorch | latency p50 ms | p95 ms | cosine mean | cosine lowest | weights MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    write_results("onnx_encode", {"runs": runs, "sentences": len(texts)}, md)


if __name__ == "__main__":
    main()
