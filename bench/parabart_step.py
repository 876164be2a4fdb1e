"""Where a ParaBART smoke step spends its time on one CPU thread (a 1-CPU Ray Train worker), and the time per
step before / after the cut the profile named, side by side in one run (issue 53, item 4).

The step as the recipe and the loop run it, on the smoke preset's model (MiniLM bert2bert; ``--set key=value``
overrides, e.g. ``syntax_encoder=reference``), batch 16 directions of MRPC paraphrase pairs parsed by the corpus
pipeline's spaCy parser: the batch built (tokenised, word-dropped, D's targets), L_para and D's step with the
adversary on, the backward pass, the clip at 1.0, the fused AdamW update. The evaluation the smoke preset runs
every 40 steps (STS-B dev on E_sem, the validation pass on 400 held-out directions) is timed apart and spread
over those 40 steps; the validation as it ran before the cut (its own order, a mean of batch means) and as it
runs now (batched by parse length, a mean over tokens) interleaved.

    python bench/parabart_step.py [--steps 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import statistics
import time

import torch
from _common import ROOT, write_results


def pairs(n: int) -> list[dict]:
    """The first ``n`` MRPC paraphrase pairs (label 1) parsed as the corpus pipeline parses them, as pair rows
    (both parses, both bags: :func:`orchestrator.data.paraphrase.directions` gives their directions)."""
    from orchestrator.data.constituency import constituency, constituent_bag, linearize
    from orchestrator.data.parsing import SpacyParser

    with (ROOT / "data" / "paraphrase" / "mrpc-train.tsv").open() as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r["label"] == "1"][:n]
    parser = SpacyParser()
    trees = [
        constituency(p) for p in parser.parse_batch([r[c] for r in rows for c in ("sentence1", "sentence2")])
    ]
    out = []
    for k, r in enumerate(rows):
        src, tgt = trees[2 * k], trees[2 * k + 1]
        out.append(
            {
                "src": r["sentence1"],
                "tgt": r["sentence2"],
                "tgt_parse": linearize(tgt),
                "src_bag": json.dumps(constituent_bag(src)),
                "src_parse": linearize(src),
                "tgt_bag": json.dumps(constituent_bag(tgt)),
            }
        )
    return out


def setup(overrides: list[str], data: dict):
    """(config, model, D, batcher): the smoke preset with ``overrides``, vocabularies from ``data``, seeded."""
    from orchestrator.config import load_config
    from orchestrator.data.paraphrase import Vocab, parse_tokens
    from trainers.parabart import Batch, ParaBARTConfig, build_model, discriminator

    cfg = load_config(ParaBARTConfig, ROOT / "configs" / "parabart" / "smoke.yaml", overrides)
    syntax = Vocab.build(parse_tokens(p) for p in data["tgt_parse"])
    tags = Vocab.build(json.loads(b).keys() for b in data["src_bag"])
    torch.manual_seed(0)
    model, tok = build_model(cfg, syntax, tags)
    dis = discriminator(model, cfg.discriminator)
    return cfg, model, dis, Batch(tok, syntax, tags, cfg)


def step_fn(cfg, model, dis, batcher):
    """A fresh copy's training step (the recipe's loss, the loop's backward, clip and update) as a closure."""
    from trainers.parabart import discriminator_optimizer, main_loss, parameter_groups

    m, d = copy.deepcopy(model).train(), copy.deepcopy(dis)
    opt = torch.optim.AdamW(
        parameter_groups(m, cfg), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, fused=True
    )
    opt_dis = discriminator_optimizer(d, cfg)
    gen = torch.Generator().manual_seed(1)

    def step(rows: dict) -> float:
        with torch.profiler.record_function("batch: tokenise, word dropout, D's targets"):
            b = batcher(rows, train=True, generator=gen)
        with torch.profiler.record_function("L_para + D's step + the adversarial term"):
            loss, _ = main_loss(m, d, b, cfg, adversary_on=True, opt_dis=opt_dis)
        with torch.profiler.record_function("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with torch.profiler.record_function("clip at 1.0"):
            torch.nn.utils.clip_grad_norm_(m.parameters(), cfg.train.grad_clip)
        with torch.profiler.record_function("AdamW update"):
            opt.step()
        return float(loss.detach())

    return m, d, step


def batches(data: dict, size: int, steps: int) -> list[dict]:
    """``steps`` batches of ``size`` directions."""
    return [{k: v[i * size : (i + 1) * size] for k, v in data.items()} for i in range(steps)]


def timed_steps(step, bs: list[dict]) -> float:
    """Seconds per step."""
    t0 = time.perf_counter()
    for b in bs:
        step(b)
    return (time.perf_counter() - t0) / len(bs)


def validation_before(model, dis, batcher, rows: dict, batch_size: int = 64) -> float:
    """The validation pass as it ran before the cut: the held-out rows in their own order, L_para a mean of the
    batches' means weighted by their rows (the diagnostics besides it are unchanged and left out here)."""
    from trainers.parabart import para_loss

    n, para = len(rows["src"]), 0.0
    model.eval()
    with torch.inference_mode():
        for k in range(0, n, batch_size):
            b = batcher({c: v[k : k + batch_size] for c, v in rows.items()}, train=False)
            logits, u = model(
                b["src_ids"], b["src_mask"], b["parse_ids"], b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
            )
            para += len(b["src_ids"]) / n * float(para_loss(logits, b["tgt_ids"], b["tgt_mask"]))
            dis(u)
    model.train()
    return para


def validation_after(cfg, model, dis, batcher, rows: dict) -> float:
    from trainers.parabart_recipe import validation_loss

    return validation_loss(model, dis, batcher, rows, cfg, adversary_on=True)["valid_loss_para"]


def padding(batcher, rows: dict, order: list[int], batch_size: int = 64) -> float:
    """E_syn's positions that are padding, over the held-out batches taken in ``order``."""
    real = total = 0
    for k in range(0, len(order), batch_size):
        b = batcher({c: [v[i] for i in order[k : k + batch_size]] for c, v in rows.items()}, train=False)
        real, total = real + int(b["parse_mask"].sum()), total + b["parse_mask"].numel()
    return 1 - real / total


def module_forward_ms(model, step, bs: list[dict]) -> dict[str, float]:
    """Forward time of E_sem, E_syn, the decoder's layers and the output projection, per step (forward hooks)."""
    parts = {"E_sem": model.sem, "E_syn": getattr(model, "syn", None), "decoder": model.decoder}
    parts["output projection"] = getattr(model.decoder, "cls", None) or getattr(
        model.decoder, "lm_head", None
    )
    spent = dict.fromkeys(parts, 0.0)
    handles = []
    for name, mod in parts.items():
        if mod is None:
            continue

        def pre(m, args, name=name):
            m._sieve_t0 = time.perf_counter()

        def post(m, args, out, name=name):
            spent[name] += time.perf_counter() - m._sieve_t0

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    for b in bs:
        step(b)
    for h in handles:
        h.remove()
    spent["decoder"] -= spent["output projection"]  # the decoder's layers alone
    return {k: v / len(bs) * 1000 for k, v in spent.items()}


def profile(step, bs: list[dict], top: int = 15) -> tuple[list[dict], list[dict]]:
    """(the step's phases, the top ops by self CPU time), per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    phase = ("batch:", "L_para", "backward", "clip", "AdamW update")
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in bs:
            step(b)
    events, n = prof.key_averages(), len(bs)
    phases = [{"phase": e.key, "ms": e.cpu_time_total / 1000 / n} for e in events if e.key.startswith(phase)]
    ops = sorted((e for e in events if not e.key.startswith(phase)), key=lambda e: -e.self_cpu_time_total)[
        :top
    ]
    return phases, [
        {"op": e.key, "self_ms": e.self_cpu_time_total / 1000 / n, "calls": e.count / n} for e in ops
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (key=value)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from orchestrator.data.paraphrase import directions
    from trainers.parabart_recipe import by_parse_length, dev_score

    rows = pairs(8 * (args.steps + 1) + 200)  # 16 directions a step, the first step a warm-up; 400 held out

    def columns(part):
        return directions({k: [r[k] for r in part] for k in part[0]})

    train, valid = columns(rows[:-200]), columns(rows[-200:])
    cfg, model, dis, batcher = setup(args.set, train)
    bs = batches(train, cfg.train.batch_size, args.steps + 1)
    m, d, step = step_fn(cfg, model, dis, batcher)
    step(bs[0])  # warm
    # before the profiler (after it, these hook times exceeded the whole step: not understood)
    forward = module_forward_ms(m, step, bs[1:])
    phases, ops = profile(step, bs[1:])
    step_s = statistics.median(timed_steps(step, bs[1:]) for _ in range(args.rounds))
    t0 = time.perf_counter()
    dev_score(m.sem, batcher.tok, cfg)
    dev_s = time.perf_counter() - t0
    vals, times = {}, {"before": [], "after": []}
    for r in range(args.rounds):  # interleaved, the first to run alternating
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            t0 = time.perf_counter()
            vals[v] = (
                validation_before(m, d, batcher, valid)
                if v == "before"
                else validation_after(cfg, m, d, batcher, valid)
            )
            times[v].append(time.perf_counter() - t0)
    n = len(valid["src"])
    pad = {
        "before": padding(batcher, valid, list(range(n))),
        "after": padding(batcher, valid, by_parse_length(valid)),
    }
    valid_s = {v: statistics.median(t) for v, t in times.items()}
    every = cfg.train.eval_steps
    per_step = {v: step_s + (dev_s + valid_s[v]) / every for v in valid_s}
    data = {
        "command": f"python bench/parabart_step.py --steps {args.steps} --rounds {args.rounds}"
        + (f" --set {' '.join(args.set)}" if args.set else ""),
        "threads": 1,
        "torch": torch.__version__,
        "batch": cfg.train.batch_size,
        "eval_steps": every,
        "held_out_directions": n,
        "phases_ms": phases,
        "top_ops": ops,
        "forward_ms": forward,
        "step_s": step_s,
        "stsb_dev_s": dev_s,
        "validation_s": times,
        "validation_parse_padding": pad,
        "valid_loss_para": vals,
        "per_step_with_evaluation_s": per_step,
    }
    write_results("parabart_step", data, render(data))


def render(d: dict) -> str:
    phases = "\n".join(f"| {p['phase']} | {p['ms']:.0f} |" for p in d["phases_ms"])
    ops = "\n".join(f"| `{o['op']}` | {o['self_ms']:.0f} | {o['calls']:.0f} |" for o in d["top_ops"][:10])
    fwd = "\n".join(f"| {k} | {v:.0f} |" for k, v in d["forward_ms"].items())
    v, p, s = d["validation_s"], d["validation_parse_padding"], d["per_step_with_evaluation_s"]
    med = {k: statistics.median(t) for k, t in v.items()}
    return f"""# Where a ParaBART smoke step spends its time, and the cut (1 thread)

Command: `{d["command"]}` (the smoke preset's model and batch of {d["batch"]} directions, MRPC pairs parsed by
spaCy, torch {d["torch"]}, one thread as a 1-CPU Ray Train worker; the validation before and after interleaved
{len(v["before"])}x).

## The step: {d["step_s"]:.2f} s (median)

| phase (torch.profiler, per step) | ms |
|---|---:|
{phases}

| op (self CPU time, per step; top 10) | ms | calls |
|---|---:|---:|
{ops}

| forward of (per step) | ms |
|---|---:|
{fwd}

## The evaluation every {d["eval_steps"]} steps

STS-B dev on E_sem: {d["stsb_dev_s"]:.1f} s (its batches already sorted by token count). The validation pass on the
{d["held_out_directions"]} held-out directions:

| validation | s (median; each round) | E_syn positions that are padding | valid L_para |
|---|---|---:|---:|
| before: the rows in their own order, a mean of batch means | {med["before"]:.1f} ({", ".join(f"{t:.1f}" for t in v["before"])}) | {p["before"]:.0%} | {d["valid_loss_para"]["before"]:.5f} |
| after: batched by parse length, the mean over every target token | {med["after"]:.1f} ({", ".join(f"{t:.1f}" for t in v["after"])}) | {p["after"]:.0%} | {d["valid_loss_para"]["after"]:.5f} |

**Per step with the evaluation spread over its {d["eval_steps"]} steps: {s["before"]:.2f} s before, {s["after"]:.2f} s after
({s["before"] / s["after"]:.2f}x).**
"""


if __name__ == "__main__":
    main()
