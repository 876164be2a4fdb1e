"""Training-step throughput, side by side in one run (same MiniLM, batch, max length, steps, seed):

1. our SimCSE step (trainers/sifter_simcse.py) vs sentence-transformers' MultipleNegativesRankingLoss
   SimCSE (anchor = positive = the sentence, dropout makes the views), both in a plain loop;
   then the STS-B test Spearman each reaches (both CLS pooling, as SimCSE evaluates);
2. our step inside Ray Train (1 worker, DDP-free) vs the same step in a bare PyTorch loop.

    python bench/train_throughput.py [--steps 30] [--batch 32]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import random
import time

import torch
from _common import ROOT, write_results


def corpus(n: int) -> list[str]:
    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()
    random.Random(0).shuffle(lines)
    return lines[:n]


def stsb(encode) -> float:
    from orchestrator.evaluation import sts

    class E:
        def encode(self, s, desc=""):
            return encode(list(s))

    return sts.evaluate_data(E(), sts.load_task("stsb"))["spearman"]["all"]


BREAKDOWN: dict[str, dict] = {}  # where a training loop's time goes: bare loop vs Ray Train (trainers/common.py)


def ours(texts, steps, batch, max_len, seed):
    from orchestrator.evaluation.encode import HFEncoder
    from trainers.sifter_simcse import ContrastiveConfig, build_model, compute_loss

    cfg = ContrastiveConfig(method="simcse", dropout=0.1, lambda_xx=1, lambda_xy=0, lambda_xz=0, lambda_yz=0,
                            model={"name_or_path": "default", "max_length": max_len, "pooling": "cls"})
    torch.manual_seed(seed)
    model, tok = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    model.train()
    t0 = time.perf_counter()
    spent = {"time_ingest_s": 0.0, "time_forward_s": 0.0, "time_backward_step_s": 0.0}
    for i in range(steps):
        ta = time.perf_counter()
        b = texts[i * batch:(i + 1) * batch]
        tb = time.perf_counter()
        loss, _ = compute_loss(model, tok, {"text": b, "backbone_view": b, "deletion_view": b}, cfg)
        tc = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        opt.step()
        td = time.perf_counter()
        spent["time_ingest_s"] += tb - ta
        spent["time_forward_s"] += tc - tb
        spent["time_backward_step_s"] += td - tc
    dt = time.perf_counter() - t0
    BREAKDOWN.setdefault("bare", spent)
    enc = HFEncoder(model.encoder, tok, pooling="cls_before_pooler", batch_size=128, max_length=128)
    return dt, stsb(lambda s: enc.encode(s))


def sentence_transformers_mnrl(texts, steps, batch, max_len, seed):
    from sentence_transformers import SentenceTransformer, losses, models

    from orchestrator.models import default_model_path

    torch.manual_seed(seed)
    word = models.Transformer(str(default_model_path()), max_seq_length=max_len)
    word.auto_model.config.hidden_dropout_prob = 0.1
    for m in word.auto_model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.1
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_embedding_dimension(), "cls")], device="cpu")
    loss_fn = losses.MultipleNegativesRankingLoss(st, scale=20.0)  # scale 20 = 1/τ with τ = 0.05
    opt = torch.optim.AdamW(st.parameters(), lr=3e-5)
    st.train()
    t0 = time.perf_counter()
    for i in range(steps):
        b = texts[i * batch:(i + 1) * batch]
        feats = [st.tokenize(b), st.tokenize(b)]
        loss = loss_fn(feats, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    st.max_seq_length = 128
    return dt, stsb(lambda s: st.encode(s, batch_size=128, convert_to_numpy=True))


def ray_train_one_worker(steps, batch, max_len, seed, tmp):
    from orchestrator.data.corpus import CorpusConfig, run_pipeline
    from orchestrator.drivers.cluster import init_ray
    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer, fit
    from trainers.sifter_simcse import ContrastiveConfig

    init_ray()
    shards = f"{tmp}/aug"
    run_pipeline(CorpusConfig(input=str(ROOT / "data" / "corpus" / "wikisplit_sample.txt"), limit=steps * batch + batch,
                              parser={"workers": 1, "cpus_per_worker": 0.5}), shards, progress=False)
    cfg = ContrastiveConfig(method="simcse", dropout=0.1, lambda_xx=1, lambda_xy=0, lambda_xz=0, lambda_yz=0,
                            model={"name_or_path": "default", "max_length": max_len, "pooling": "cls"},
                            train={"lr": 3e-5, "batch_size": batch, "max_steps": steps, "eval_steps": steps, "seed": seed},
                            scaling={"num_workers": 1, "cpus_per_worker": 2}, run={"storage": f"{tmp}/runs"})
    method = get_method("simcse")
    t0 = time.perf_counter()
    outcome = fit(build_trainer(method, cfg, shards, name="bench"), method, cfg)
    total = time.perf_counter() - t0
    BREAKDOWN["ray"] = {k: v for k, v in outcome.history[-1].items() if k.startswith("time_")}
    return outcome.history[-1]["train_s"], total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    torch.set_num_threads(2)
    texts = corpus(args.steps * args.batch)
    t_ours, sp_ours = ours(texts, args.steps, args.batch, args.max_length, args.seed)
    t_st, sp_st = sentence_transformers_mnrl(texts, args.steps, args.batch, args.max_length, args.seed)
    t_bare, _ = ours(texts, args.steps, args.batch, args.max_length, args.seed)  # the bare loop, again, for noise
    import tempfile

    t_ray_loop, t_ray_total = ray_train_one_worker(args.steps, args.batch, args.max_length, args.seed, tempfile.mkdtemp())
    s = args.steps
    res = {
        "steps": s, "batch": args.batch, "max_length": args.max_length, "threads": 2,
        "ours_s": t_ours, "ours_bare_rerun_s": t_bare, "st_mnrl_s": t_st,
        "ratio_ours_over_st_steps_per_s": t_st / t_ours,
        "stsb_test_spearman": {"ours": sp_ours, "st_mnrl": sp_st},
        "ray_train_1_worker_loop_s": t_ray_loop, "ray_train_1_worker_total_s": t_ray_total,
        "ratio_ray_over_bare_steps_per_s": min(t_ours, t_bare) / t_ray_loop,
        "breakdown_s": BREAKDOWN,
    }
    parts = [("time_ingest_s", "waiting for the batch (Ray Data ingest; bare: list slice)"),
             ("time_forward_s", "the loss: tokenization + forward"),
             ("time_backward_step_s", "backward + optimizer step")]
    bare, ray_ = BREAKDOWN["bare"], BREAKDOWN["ray"]
    rows = [f"| {label} | {bare[k] / s * 1000:.0f} | {ray_.get(k, float('nan')) / s * 1000:.0f} | "
            f"{(ray_.get(k, float('nan')) - bare[k]) / s * 1000:+.0f} |" for k, label in parts]
    other_b = t_ours - sum(bare[k] for k, _ in parts)
    other_r = t_ray_loop - sum(ray_.get(k, 0.0) for k, _ in parts)
    rows.append(f"| the rest of the loop (reports, live logging, bookkeeping) | {other_b / s * 1000:.0f} | "
                f"{other_r / s * 1000:.0f} | {(other_r - other_b) / s * 1000:+.0f} |")
    rows.append(f"| **per step** | **{t_ours / s * 1000:.0f}** | **{t_ray_loop / s * 1000:.0f}** | "
                f"**{(t_ray_loop - t_ours) / s * 1000:+.0f}** |")
    breakdown_md = "\n".join(["", "### Where a step's time goes (ms per step, first bare run vs Ray Train, same data, "
                               "same threads)", "", "| part | bare loop | Ray Train, 1 worker | Ray − bare |",
                               "|---|---:|---:|---:|", *rows])
    md = f"""# Training step throughput (MiniLM-L6, batch {args.batch}, max length {args.max_length}, {s} steps, 2 threads)

Command: `.venv/bin/python bench/train_throughput.py --steps {s} --batch {args.batch}` (one run, side by side)

| implementation | wall s | steps/s | STS-B test Spearman ×100 after {s} steps |
|---|---:|---:|---:|
| ours: SimCSE step (`trainers/sifter_simcse.py`), plain loop | {t_ours:.1f} | {s / t_ours:.2f} | {sp_ours * 100:.2f} |
| sentence-transformers MNRL SimCSE (CLS pooling, scale 20), plain loop | {t_st:.1f} | {s / t_st:.2f} | {sp_st * 100:.2f} |
| **ratio ours / ST** (steps/s) | | **{t_st / t_ours:.2f}x** | |
| ours, bare loop (re-run) | {t_bare:.1f} | {s / t_bare:.2f} | |
| ours inside Ray Train, 1 worker (training loop only; run total {t_ray_total:.1f} s incl. start-up + final eval) | {t_ray_loop:.1f} | {s / t_ray_loop:.2f} | |
| **ratio Ray Train / bare** (steps/s) | | **{res['ratio_ray_over_bare_steps_per_s']:.2f}x** | |

Both SimCSE implementations compute the same loss (in-batch InfoNCE over two dropout views, τ = 0.05);
ours forwards both views in one batch, ST forwards them separately. The Spearman numbers start from
the same MiniLM; the untrained model scores 73.50 with CLS pooling (bench/results/sts_default_cls_before_pooler.json).
""" + breakdown_md
    write_results("train_throughput", res, md)


if __name__ == "__main__":
    main()
