"""GPU measurements for a lent machine (no internet: models are random-init from config).

Every method's own training step (SIFTER-SimCSE, TSDAE, Siamese, SIFTER-LSTM, ParaBART: each recipe's
loss, tokenisation and extra modules) at BERT-base size: samples/s, tokens/s, peak memory. For
BERT-base and BERT-large configs: SimCSE and SIFTER step throughput and model FLOPs
utilisation in bf16 at batch 64 and 512 (max length 32), the same for sentence-transformers'
MNRL SimCSE, and peak GPU memory of a large variant under DeepSpeed ZeRO 0 / 2 / 3 (with
optimizer offload for 2 and 3, since a single GPU has no peers to partition across).
Writes bench/results/gpu.{json,md}. Run through bench/gpu.sh.

    python bench/gpu_bench.py [--quick]    # --quick: CPU smoke of the script itself (tiny config)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from _common import write_results

PEAK_BF16_TFLOPS = float(os.environ.get("SIEVE_PEAK_TFLOPS", "989"))  # H100/H200 SXM dense bf16
TOKENIZER = Path(__file__).resolve().parent / "assets" / "tokenizer"  # MiniLM's files; its weights stay home


def bench_tokenizer():
    """BERT's uncased WordPiece tokenizer (``bench/assets/tokenizer``): what the random-init models read."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True)


def bert_config(size: str):
    from transformers import BertConfig

    if size == "tiny":
        return BertConfig(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
        )
    if size == "base":
        return BertConfig(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
        )
    return BertConfig(
        vocab_size=30522,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
    )


def flops_per_token(cfg, seq: int) -> float:
    """Training FLOPs per token: 6 × non-embedding params + attention scores (12·L·h·seq)."""
    h, L, i = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    params = L * (4 * h * h + 2 * h * i)
    return 6 * params + 12 * L * h * seq


def random_batch(n: int, seq: int, device):
    ids = torch.randint(1000, 30000, (n, seq), device=device)
    ids[:, 0] = 101
    return ids, torch.ones_like(ids)


WARMUP = 3  # calls before timing; the dry run (--quick) makes it 1: it checks the script, it times nothing


def time_steps(one, steps: int, device) -> float:
    """Seconds per call of ``one`` after 3 warm-up calls (CUDA synchronised)."""
    for _ in range(WARMUP):
        one()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def step_throughput(model_fn, views: int, batch: int, seq: int, steps: int, device, cfg) -> dict:
    from trainers.sifter_simcse import info_nce

    model = model_fn().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids, mask = random_batch(batch * views, seq, device)

    def one():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0].float()
        e = out.view(views, batch, -1)
        loss = sum(
            info_nce(e[a], e[b], 0.05) for a, b in ([(0, 1)] if views == 2 else [(0, 1), (0, 2), (1, 2)])
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    dt = time_steps(one, steps, device)
    tokens = batch * views * seq
    achieved = flops_per_token(cfg, seq) * tokens / dt / 1e12
    return {
        "step_s": dt,
        "sentences_per_s": batch / dt,
        "tflops": achieved,
        "mfu": achieved / PEAK_BF16_TFLOPS,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def cached_step(cfg, batch: int, mini_batch: int, seq: int, steps: int, device) -> dict:
    """A SIFTER step (three views) at ``batch`` with cached gradients (``trainers/grad_cache.py``): the
    batch encoded ``mini_batch`` sequences at a time; step time and peak memory."""
    from transformers import BertModel

    from trainers.grad_cache import CachedEmbeddings, CachedLoss
    from trainers.sifter_simcse import info_nce

    model = BertModel(cfg, add_pooling_layer=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids, mask = random_batch(batch * 3, seq, device)

    def encode(i, m):
        return model(input_ids=i, attention_mask=m).last_hidden_state[:, 0].float()

    def one():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            cache = CachedEmbeddings(encode, ids, mask, mini_batch)
        e = cache.embeddings.view(3, batch, -1)
        loss = info_nce(e[0], e[1], 0.05) + info_nce(e[0], e[2], 0.05) + info_nce(e[1], e[2], 0.05)
        opt.zero_grad(set_to_none=True)
        CachedLoss(loss, cache).backward(lambda surrogate, last: surrogate.backward())
        opt.step()

    dt = time_steps(one, steps, device)
    achieved = flops_per_token(cfg, seq) * batch * 3 * seq * (4 / 3) / dt / 1e12  # the extra forward counted
    return {
        "step_s": dt,
        "sentences_per_s": batch / dt,
        "tflops": achieved,
        "mfu": achieved / PEAK_BF16_TFLOPS,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def st_mnrl(cfg, batch, seq, steps, device) -> dict:
    import tempfile

    from sentence_transformers import SentenceTransformer, losses, models
    from transformers import BertModel

    d = tempfile.mkdtemp()
    BertModel(cfg).save_pretrained(d)
    bench_tokenizer().save_pretrained(d)
    word = models.Transformer(d, max_seq_length=seq)
    st = SentenceTransformer(modules=[word, models.Pooling(cfg.hidden_size, "cls")], device=str(device))
    loss_fn = losses.MultipleNegativesRankingLoss(st)
    opt = torch.optim.AdamW(st.parameters(), lr=1e-5)
    ids, mask = random_batch(batch, seq, device)
    feats = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    def one():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = loss_fn([dict(feats), dict(feats)], None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    dt = time_steps(one, steps, device)
    achieved = flops_per_token(cfg, seq) * batch * 2 * seq / dt / 1e12
    return {
        "step_s": dt,
        "sentences_per_s": batch / dt,
        "tflops": achieved,
        "mfu": achieved / PEAK_BF16_TFLOPS,
    }


def zero_memory(cfg, stage: int, batch: int, seq: int, device) -> dict:
    """Peak memory of a SIFTER step under DeepSpeed ZeRO ``stage`` on this single GPU."""
    import deepspeed
    from transformers import BertModel

    from trainers.sifter_simcse import info_nce

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    model = BertModel(cfg, add_pooling_layer=False)
    zero = {"stage": stage}
    if stage >= 2:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    ds_cfg = {
        "train_micro_batch_size_per_gpu": batch,
        "zero_optimization": zero,
        "bf16": {"enabled": device.type == "cuda"},
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    ids, mask = random_batch(batch * 3, seq, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(3):
        out = engine(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0].float().view(3, batch, -1)
        loss = (
            info_nce(out[0], out[1], 0.05) + info_nce(out[0], out[2], 0.05) + info_nce(out[1], out[2], 0.05)
        )
        engine.backward(loss)
        engine.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    res = {
        "stage": stage,
        "step_s": (time.perf_counter() - t0) / 3,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }
    del engine
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return res


# ---------------------------------------------------------------- every method's own training step (#22.3)
def random_encoder_folder(cfg) -> str:
    """A random-init BERT of ``cfg``'s size with MiniLM's vocabulary, saved as a model folder: what each
    recipe's ``build_model`` loads (no weights of that size exist offline)."""
    import tempfile

    from transformers import BertModel

    d = tempfile.mkdtemp(prefix="sieve-gpu-bench-")
    BertModel(cfg, add_pooling_layer=False).save_pretrained(d)
    bench_tokenizer().save_pretrained(d)
    return d


def method_steps(folder: str, batch: int, heads: int, device) -> dict:
    """{method: (module to optimise, one-step loss closure, texts encoded per step)}, each built by its
    recipe (``trainers/<method>.py``) with its own loss, on the same real sentences."""
    import json
    import random
    from pathlib import Path

    from orchestrator.data.paraphrase import Vocab, parse_tokens
    from trainers import parabart, siamese, sifter_lstm, sifter_simcse, tsdae

    lines = (
        (Path(__file__).resolve().parents[1] / "data" / "corpus" / "wikisplit_sample.txt")
        .read_text()
        .splitlines()
    )
    texts = lines[:batch]
    enc = {"name_or_path": folder, "max_length": 64}
    out = {}

    cfg = sifter_simcse.ContrastiveConfig.model_validate({"model": {**enc, "pooling": "cls"}})
    model, tok = sifter_simcse.build_model(cfg)
    views = {
        "text": texts,
        "backbone_view": [t + " " + " ".join(t.split()[:4]) for t in texts],
        "deletion_view": [
            " ".join(w for w in t.split() if w.lower() not in ("a", "an", "the", "and")) for t in texts
        ],
    }
    out["sifter-simcse (3 views)"] = (
        model,
        lambda m=model, c=cfg, t=tok: sifter_simcse.compute_loss(m, t, views, c, device)[0],
        views["text"] + views["backbone_view"] + views["deletion_view"],
        tok,
    )

    cfg = tsdae.TSDAEConfig.model_validate({"model": {**enc, "pooling": "cls"}})
    model, tok = tsdae.build_model(cfg)
    rng = random.Random(0)
    out["tsdae (encoder + tied decoder)"] = (
        model,
        lambda m=model, c=cfg, t=tok: tsdae.compute_loss(m, t, texts, c, rng, device)[0],
        texts * 2,
        tok,
    )

    cfg = siamese.SiameseConfig.model_validate(
        {
            "model": {**enc, "pooling": "mean"},
            "train_sets": [{"name": "x", "path": "data/tweets/sanders.tsv"}],
        }
    )
    model, tok = siamese.build_model(cfg)
    pairs = {
        "text_a": texts,
        "text_b": texts[1:] + texts[:1],
        "label": [float(i % 2) for i in range(len(texts))],
    }
    out["siamese (pairs, cosine MSE)"] = (
        model,
        lambda m=model, c=cfg, t=tok: siamese.compute_loss(m, t, pairs, c, None, device)[0],
        pairs["text_a"] + pairs["text_b"],
        tok,
    )

    cfg = sifter_lstm.SifterLSTMConfig.model_validate({"embeddings_from": folder})
    model, batcher, _ = sifter_lstm.build_model(cfg, word_set={"good", "bad", "great", "poor"})
    labels = [i % 2 for i in range(len(texts))]
    out["sifter-lstm (384-d, BERT-size embeddings)"] = (
        model,
        lambda m=model, c=cfg, b=batcher: sifter_lstm.compute_loss(m, b, texts, labels, c, device)[0],
        texts,
        batcher.tokenizer,
    )

    parse = "(S (NP (DT) (NN)) (VP (VBD) (PP (IN) (NP (DT) (NN)))) (.))"
    rows = {
        "src": texts,
        "tgt": texts[1:] + texts[:1],
        "tgt_parse": [parse] * len(texts),
        "src_bag": [json.dumps({"S": 0.2, "NP": 0.4, "VP": 0.2, "PP": 0.2})] * len(texts),
    }
    cfg = parabart.ParaBARTConfig.model_validate({"model": {**enc, "pooling": "mean"}, "syntax_heads": heads})
    syntax, tags = Vocab.build([parse_tokens(parse)]), Vocab.build([["S", "NP", "VP", "PP"]])
    model, tok = parabart.build_model(cfg, syntax, tags)
    dis = parabart.discriminator(model).to(device)
    opt_dis = parabart.discriminator_optimizer(dis, cfg)
    batcher = parabart.Batch(tok, syntax, tags, cfg)
    out["parabart (E_sem + E_syn + decoder, adversary on)"] = (
        model,
        lambda m=model, c=cfg: parabart.main_loss(
            m, dis, batcher(rows, train=True, device=device), c, adversary_on=True, opt_dis=opt_dis
        )[0],
        rows["src"] + rows["tgt"],
        tok,
    )
    return out


def every_method(cfg, batch: int, steps: int, device) -> list[dict]:
    """Each recipe's own training step (its loss, its tokenisation, its extra modules): samples/s,
    tokens/s (the non-padding tokens it encodes per step), peak memory; bf16 autocast on a GPU."""
    results = []
    folder = random_encoder_folder(cfg)
    for name, (model, loss_of, encoded, tok) in method_steps(
        folder, batch, cfg.num_attention_heads, device
    ).items():
        model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        tokens = sum(min(len(ids), 64) for ids in tok([str(t) for t in encoded])["input_ids"])

        def one(model=model, loss_of=loss_of, opt=opt):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = loss_of()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        try:
            dt = time_steps(one, steps, device)
            results.append(
                {
                    "method": name,
                    "batch": batch,
                    "step_s": dt,
                    "samples_per_s": batch / dt,
                    "tokens_per_s": tokens / dt,
                    "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30
                    if device.type == "cuda"
                    else None,
                }
            )
        except Exception as exc:  # noqa: BLE001 - a method that fails is a result too
            results.append({"method": name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:200]})
        model.to("cpu")
        del opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny config on whatever device: checks the script")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", help="write the results here instead of bench/results/ (the dry run's)")
    args = ap.parse_args()
    global WARMUP
    WARMUP = 1 if args.quick else WARMUP
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = ["tiny"] if args.quick else ["base", "large"]
    batches = [8] if args.quick else [64, 512]
    seq = 32
    from transformers import BertModel

    rows, results = (
        [],
        {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "peak_bf16_tflops": PEAK_BF16_TFLOPS,
            "throughput": [],
            "zero": [],
        },
    )
    for size in sizes:
        cfg = bert_config(size)
        for b in batches:
            for name, views in (("simcse", 2), ("sifter", 3)):
                r = step_throughput(
                    lambda cfg=cfg: BertModel(cfg, add_pooling_layer=False),
                    views,
                    b,
                    seq,
                    args.steps,
                    device,
                    cfg,
                )
                results["throughput"].append({"model": size, "batch": b, "impl": f"ours-{name}", **r})
                rows.append(
                    f"| {size} | {b} | ours {name} | {r['sentences_per_s']:.0f} | {r['tflops']:.1f} | {r['mfu'] * 100:.1f}% |"
                )
            r = st_mnrl(cfg, b, seq, args.steps, device)
            results["throughput"].append({"model": size, "batch": b, "impl": "st-mnrl", **r})
            rows.append(
                f"| {size} | {b} | ST MNRL simcse | {r['sentences_per_s']:.0f} | {r['tflops']:.1f} | {r['mfu'] * 100:.1f}% |"
            )
    crows = []
    cached = [(8, 2), (8, None)] if args.quick else [(4096, 256), (512, None)]
    cfg = bert_config(sizes[0])
    for b, mini in cached:  # cached 4096 beside plain 512 (the largest plain batch above)
        try:
            r = (
                cached_step(cfg, b, mini, seq, min(3, args.steps), device)
                if mini
                else step_throughput(
                    lambda cfg=cfg: BertModel(cfg, add_pooling_layer=False),
                    3,
                    b,
                    seq,
                    min(3, args.steps),
                    device,
                    cfg,
                )
            )
        except Exception as exc:  # noqa: BLE001 - out of memory is a result too
            r = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        results.setdefault("grad_cache", []).append({"model": sizes[0], "batch": b, "mini_batch": mini, **r})
        crows.append(
            f"| {b} | {mini or 'plain'} | "
            + (
                f"{r['sentences_per_s']:.0f} | {r['step_s']:.2f} | "
                f"{r['peak_mem_gb'] if r['peak_mem_gb'] is None else round(r['peak_mem_gb'], 2)} |"
                if "error" not in r
                else f"– | – | {r['error']} |"
            )
        )
    mrows = []
    cfg = bert_config(sizes[0])
    for b in batches[:1]:
        for r in every_method(cfg, b, max(1 if args.quick else 3, args.steps // 2), device):
            results.setdefault("methods", []).append({"model": sizes[0], **r})
            mrows.append(
                f"| {r['method']} | {b} | "
                + (
                    f"{r['samples_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
                    f"{r['peak_mem_gb'] if r['peak_mem_gb'] is None else round(r['peak_mem_gb'], 2)} |"
                    if "error" not in r
                    else f"– | – | {r['error']} |"
                )
            )
    zrows = []
    if device.type == "cuda" or args.quick:
        cfg = bert_config(sizes[-1])
        for stage in (0, 2, 3):
            try:
                z = zero_memory(cfg, stage, batches[0], seq, device)
            except Exception as exc:  # noqa: BLE001 - a failed stage is a result too
                z = {"stage": stage, "error": f"{type(exc).__name__}: {exc}"[:200]}
            results["zero"].append(z)
            zrows.append(
                f"| {stage} | {z.get('peak_mem_gb') or '–'} | {z.get('step_s', '–')} | {z.get('error', '')} |"
            )
    md = "\n".join(
        [
            f"# GPU benchmark ({results['device']}, bf16, max length {seq})",
            "",
            "Command: `bash bench/gpu.sh` (random-init BERT configs; MFU against "
            f"{PEAK_BF16_TFLOPS:.0f} TFLOP/s dense bf16)",
            "",
            "| model | batch | implementation | sentences/s | TFLOP/s | MFU |",
            "|---|---:|---|---:|---:|---:|",
            *rows,
            "",
            f"Every method's own training step (its recipe's loss and tokenisation), BERT-{sizes[0]} size, "
            "random weights, real sentences, max length 64:",
            "",
            "| method | batch | samples/s | tokens/s | peak GB |",
            "|---|---:|---:|---:|---:|",
            *mrows,
            "",
            f"SIFTER with cached gradients (`train.grad_cache`), BERT-{sizes[0]}, three views, max length {seq}:",
            "",
            "| batch | mini-batch | sentences/s | step s | peak GB |",
            "|---:|---|---:|---:|---:|",
            *crows,
            "",
            f"Peak memory of a SIFTER step, BERT-{sizes[-1]}, batch {batches[0]} (ZeRO 2/3 with optimizer offload):",
            "",
            "| ZeRO stage | peak GB | step s | note |",
            "|---:|---:|---:|---|",
            *zrows,
        ]
    )
    write_results(
        "gpu" if not args.quick else "gpu_quick_cpu", results, md, *([Path(args.out)] if args.out else [])
    )
    if args.quick and (failed := script_errors(results)):  # the dry run: a row the script could not measure
        sys.exit(f"gpu_bench --quick: {len(failed)} measurement(s) failed, first: {failed[0]}")
    print(json.dumps({"ok": True}))


def script_errors(results: dict) -> list[str]:
    """The errors of a quick run that would also stop the real one: every failed row but a ZeRO stage without
    DeepSpeed (optional: it measures ZeRO only where DeepSpeed travels)."""
    rows = [r for key in ("throughput", "grad_cache", "methods", "zero") for r in results.get(key, [])]
    return [
        r["error"]
        for r in rows
        if "error" in r and not ("stage" in r and "No module named 'deepspeed'" in r["error"])
    ]


if __name__ == "__main__":
    main()
