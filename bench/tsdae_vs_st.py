"""Our TSDAE (trainers/tsdae.py) vs sentence-transformers' ``DenoisingAutoEncoderLoss``, side by side.

Same MiniLM start, same tweets (PIT-2015 dev sentences, seeded order), same noisy inputs (each
step's noisy sentences are drawn once with our ``tsdae_noise`` at ratio 0.6 = 60% of words
*deleted*, and fed to both; ST's own example would keep 60% instead), same batch, steps, seed,
optimiser (AdamW, constant lr), CLS pooling, tied decoder. The two training loops run in lockstep
(one step of ours, one of theirs) so machine noise hits both alike; the ratio is of the summed
step times. Then each encoder is evaluated by the same code: TwitterPara AP (PIT-2015 test, Twitter
URL test) and STS-B test Spearman, with the untrained MiniLM as the reference row.

    python bench/tsdae_vs_st.py [--steps 100] [--batch 8] [--threads 2]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import random
import time

import torch
from _common import ROOT, write_results


def sentences(n: int) -> list[str]:
    lines = (ROOT / "data" / "corpus" / "twitterpara_pit2015_dev_sentences.txt").read_text().splitlines()
    lines = [ln for ln in lines if len(ln.split()) >= 3]
    random.Random(0).shuffle(lines)
    return lines[:n]


def evaluate(encoder, tok) -> dict:
    from orchestrator.evaluation import sts
    from orchestrator.evaluation.domain import TwitterParaEvaluator
    from orchestrator.evaluation.encode import HFEncoder

    enc = HFEncoder(encoder, tok, pooling="cls_before_pooler", batch_size=128, max_length=64)
    out = TwitterParaEvaluator()(enc)
    out["stsb_spearman"] = sts.evaluate_data(enc, sts.load_task("stsb"))["spearman"]["all"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss

    from orchestrator.models import default_model_path, load_encoder
    from trainers.tsdae import TSDAEConfig, build_model, noisy_batch

    cfg = TSDAEConfig.model_validate({"model": {"max_length": 48}})
    torch.manual_seed(0)
    ours, tok = build_model(cfg)
    torch.manual_seed(0)
    word = st_models.Transformer(str(default_model_path()), max_seq_length=48)
    st = SentenceTransformer(
        modules=[word, st_models.Pooling(word.get_word_embedding_dimension(), "cls")], device="cpu"
    )
    theirs = DenoisingAutoEncoderLoss(st, tie_encoder_decoder=True)
    theirs.decoder.load_state_dict(ours.decoder.state_dict())  # same LM-head init for both
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=args.lr)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=args.lr)
    ours.train(), theirs.train()

    data = sentences(args.steps * args.batch)
    rng = random.Random(42)
    t_ours = t_theirs = 0.0
    losses = {"ours": [], "st": []}
    tk = dict(padding=True, truncation=True, max_length=48, return_tensors="pt", return_token_type_ids=False)
    for step in range(args.steps):
        batch = data[step * args.batch : (step + 1) * args.batch]
        noisy = noisy_batch(batch, 0.6, rng)
        torch.manual_seed(1000 + step)
        t0 = time.perf_counter()
        n, tg = tok(noisy, **tk), tok(batch, **tk)
        loss = ours(n["input_ids"], n["attention_mask"], tg["input_ids"], tg["attention_mask"])
        opt_ours.zero_grad()
        loss.backward()
        opt_ours.step()
        t_ours += time.perf_counter() - t0
        losses["ours"].append(loss.item())
        torch.manual_seed(1000 + step)
        t0 = time.perf_counter()
        feats = [st.tokenize(noisy), st.tokenize(batch)]
        loss = theirs(feats, None)
        opt_theirs.zero_grad()
        loss.backward()
        opt_theirs.step()
        t_theirs += time.perf_counter() - t0
        losses["st"].append(loss.item())
        if step % 20 == 0:
            print(f"step {step}: ours {losses['ours'][-1]:.3f}  st {losses['st'][-1]:.3f}")

    base, base_tok = load_encoder("default")
    results = {
        "untrained MiniLM": evaluate(base, base_tok),
        "ours (trainers/tsdae.py)": evaluate(ours.encoder, tok),
        "sentence-transformers DenoisingAutoEncoderLoss": evaluate(st[0].auto_model, tok),
    }
    ratio = (args.steps / t_ours) / (args.steps / t_theirs)
    lines = [
        f"# TSDAE: ours vs sentence-transformers ({args.steps} steps, batch {args.batch}, {args.threads} threads)",
        "",
        "Same MiniLM, tweets, noisy inputs (60% of words deleted), optimiser and seed; loops in lockstep. "
        "Command: `python bench/tsdae_vs_st.py`.",
        "",
        f"Step throughput: ours {args.steps / t_ours:.2f} steps/s, ST {args.steps / t_theirs:.2f} steps/s → "
        f"**ours/ST = {ratio:.2f}×**. Mean loss of the last 20 steps: ours {sum(losses['ours'][-20:]) / 20:.3f}, "
        f"ST {sum(losses['st'][-20:]) / 20:.3f}.",
        "",
        "| model | PIT-2015 test AP | Twitter URL AP | TwitterPara AP (mean) | STS-B test Spearman |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['twitterpara_pit_ap'] * 100:.2f} | {r['twitterpara_url_ap'] * 100:.2f} | "
            f"{r['twitterpara_ap'] * 100:.2f} | {r['stsb_spearman'] * 100:.2f} |"
        )
    lines += [
        "",
        "Scale: a few hundred tweets, CPU; the point is equal maths and speed, not the paper's numbers "
        "(TSDAE trains 100k steps). All scores ×100, CLS pooling (`cls_before_pooler`).",
    ]
    write_results(
        "tsdae_vs_st",
        {
            "steps": args.steps,
            "batch": args.batch,
            "threads": args.threads,
            "steps_per_s": {"ours": args.steps / t_ours, "st": args.steps / t_theirs},
            "ratio_ours_over_st": ratio,
            "losses": losses,
            "results": results,
        },
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
