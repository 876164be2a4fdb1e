"""How much can ParaBART's discriminator D learn about a sentence's syntax from ū at all - and how much in the
steps the smoke preset gives it? (#34)

D in the reference code's form (LayerNorm without parameters + linear; BCE-with-logits averaged over tags on
the ones-smoothed, normalised bag) is fitted on the *frozen* encoder's ū - what D sees during the smoke
preset's warm-up, when E_sem is held still - for many epochs over cached vectors. Its held-out loss is set
against the best constant guess (the average bag: :func:`trainers.parabart.average_bag_loss`) and
against a control D fitted on the same vectors with the bags shuffled (what fitting noise alone gives). The
headroom - how far below the average bag a converged D gets - bounds the adversarial signal the encoder can
receive: a D no better than the average bag has no syntax for the encoder to remove.

    python bench/parabart_adversary_probe.py            # the smoke preset's sentences and encoder
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import random
import time

from _common import ROOT, write_results


def sentences(n: int, seed: int) -> list[str]:
    """Distinct source sentences of the smoke preset's paraphrase pairs (its own shuffle), the first ``n``."""
    from orchestrator.config import read_yaml
    from orchestrator.data.paraphrase import ParaphraseData, read_pairs

    data = ParaphraseData.model_validate(read_yaml(ROOT / "configs/parabart/smoke.yaml")["data"])
    seen, out = set(), []
    for src, _ in read_pairs(data):
        if src not in seen:
            seen.add(src)
            out.append(src)
    random.Random(seed).shuffle(out)
    return out[:n]


def bags_of(texts: list[str]) -> list[str]:
    """Each sentence's constituent bag as the corpus pipeline writes it (spaCy, the dependency conversion)."""
    from orchestrator.data import constituency as C
    from orchestrator.data.parsing import SpacyParser

    return [
        json.dumps(C.constituent_bag(C.constituency(p)), sort_keys=True)
        for p in SpacyParser().parse_batch(texts)
    ]


def fit(
    u, y, u_val, y_val, *, steps_at: list[int], lr: float, batch: int, seed: int, repeat: int = 1
) -> dict[int, float]:
    """D fitted by AdamW on (u, y) from the prior bias; its held-out loss after each of ``steps_at`` steps.
    ``repeat``: each batch taken for that many consecutive D steps - several D updates per encoder step, as GAN
    training often does, since in training D sees one fresh batch of ū per encoder step."""
    import torch

    from trainers.parabart import Discriminator, adv_loss, set_prior_bias

    torch.manual_seed(seed)
    dis = Discriminator(u.shape[1], y.shape[1])
    set_prior_bias(dis, y[:batch])  # as the recipe: the first batch's average bag
    opt = torch.optim.AdamW(dis.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    out, step, order = {}, 0, torch.randperm(len(u), generator=g)
    pos = 0
    while step < max(steps_at):
        if pos + batch > len(u):
            order, pos = torch.randperm(len(u), generator=g), 0
        idx = order[pos : pos + batch]
        pos += batch
        for _ in range(repeat):
            opt.zero_grad()
            adv_loss(dis(u[idx]), y[idx]).backward()
            opt.step()
        step += 1
        if step in steps_at:
            with torch.no_grad():
                out[step] = float(adv_loss(dis(u_val), y_val))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--held-out", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3, help="D's rate (the smoke preset's lr_discriminator)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    import torch

    from orchestrator.data.paraphrase import Vocab
    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import load_encoder
    from trainers.parabart import average_bag_loss, bag_targets

    t0 = time.time()
    texts = sentences(args.sentences, 0)
    bags = bags_of(texts)
    tags = Vocab.build(json.loads(b).keys() for b in bags[args.held_out :])
    model, tok = load_encoder("default", add_pooling_layer=False)
    u = torch.tensor(
        HFEncoder(model, tok, pooling="mean", batch_size=64, max_length=40).encode(texts)
    ).float()
    y = bag_targets(bags, tags)
    u_val, y_val, u_tr, y_tr = u[: args.held_out], y[: args.held_out], u[args.held_out :], y[args.held_out :]
    steps_at = [40, 120, 500, 1500, 4000]
    floor = average_bag_loss(y_tr)  # the constant guess fitted on the training bags ...
    constant = average_bag_loss(y_val, fitted_on=y_tr)  # ... on the held-out bags
    bce = torch.nn.functional.binary_cross_entropy
    oracle = float(bce(y_val.clamp(1e-12, 1 - 1e-12), y_val))  # the lowest any D can reach: each bag itself
    runs = {}
    for seed in args.seeds:
        shuffled = y_tr[torch.randperm(len(y_tr), generator=torch.Generator().manual_seed(seed))]
        runs[seed] = {
            "d": fit(u_tr, y_tr, u_val, y_val, steps_at=steps_at, lr=args.lr, batch=16, seed=seed),
            "control": fit(u_tr, shuffled, u_val, y_val, steps_at=steps_at, lr=args.lr, batch=16, seed=seed),
        }

    per_batch = {  # D steps per encoder step, at the smoke's adversary start (batch 40) and its end (120)
        k: [
            fit(u_tr, y_tr, u_val, y_val, steps_at=[40, 120], lr=args.lr, batch=16, seed=s, repeat=k)
            for s in args.seeds
        ]
        for k in (1, 5, 10, 25)
    }

    def mean_at(kind, s):
        return sum(r[kind][s] for r in runs.values()) / len(runs)

    rows = [
        {
            "steps": s,
            "d": mean_at("d", s),
            "control": mean_at("control", s),
            "headroom_pct": 100 * (constant - mean_at("d", s)) / (constant - oracle),
        }
        for s in steps_at
    ]
    data = {
        "sentences": len(texts),
        "held_out": args.held_out,
        "tags": len(tags) - 2,
        "lr": args.lr,
        "seeds": args.seeds,
        "average_bag_loss_train": floor,
        "constant_guess_held_out": constant,
        "oracle_held_out": oracle,
        "rows": rows,
        "runs": {str(k): v for k, v in runs.items()},
        "per_batch": {str(k): v for k, v in per_batch.items()},
        "wall_s": round(time.time() - t0, 1),
    }
    md = [
        "# ParaBART's discriminator on the frozen encoder's ū: what it can learn, and when (#34)",
        "",
        f"`python bench/parabart_adversary_probe.py` ({data['wall_s'] / 60:.1f} min on 2 cores). "
        f"{len(texts):,} distinct source sentences of the smoke preset's paraphrase pairs, parsed by spaCy "
        f"(the corpus pipeline's bags: {len(tags) - 2} tags incl. brackets and ROOT), ū = the packaged MiniLM "
        f"mean-pooled (E_sem as the smoke preset holds it during its warm-up); D in the reference form from "
        f"the prior bias, AdamW lr {args.lr:g}, batch 16, fitted on {len(texts) - args.held_out:,} and "
        f"scored on {args.held_out:,} held-out sentences; mean over seeds {args.seeds}. Control: the same D "
        "on the same ū with the bags shuffled.",
        "",
        f"On the held-out bags: the constant guess (the training bags' average) **{constant:.5f}**; the lowest "
        f"any D can reach (each sentence's own bag) {oracle:.5f}. The last column is D's share of that gap.",
        "",
        "| D steps | D held-out loss | control (shuffled bags) | share of the gap D closes |",
        "|---:|---:|---:|---:|",
        *(f"| {r['steps']:,} | {r['d']:.5f} | {r['control']:.5f} | {r['headroom_pct']:.2f}% |" for r in rows),
    ]
    md += [
        "",
        "D taking k steps on each batch it sees (one batch of ū per encoder step in training): its held-out "
        "loss after the smoke preset's 40 warm-up batches and its 120 batches, and the share of the gap closed.",
        "",
        "| D steps per batch | after 40 batches | share | after 120 batches | share |",
        "|---:|---:|---:|---:|---:|",
    ]
    for k, fits in per_batch.items():
        at = {b: sum(f[b] for f in fits) / len(fits) for b in (40, 120)}
        md.append(
            f"| {k} | {at[40]:.5f} | {100 * (constant - at[40]) / (constant - oracle):.1f}% | {at[120]:.5f} | "
            f"{100 * (constant - at[120]) / (constant - oracle):.1f}% |"
        )
    best = max(rows, key=lambda r: r["headroom_pct"])
    at120 = next(r for r in rows if r["steps"] == 120)
    md += [
        "",
        f"**Reading.** What ū tells of a sentence's bag is real (D ends below its shuffled-bag control) but small: "
        f"the whole gap is {100 * (constant - oracle) / constant:.1f}% of the constant guess's loss, and a D "
        f"fitted on fresh batches closes at most {best['headroom_pct']:.0f}% of it, after ~{best['steps']:,} "
        f"updates. After the smoke preset's 120 it closes {at120['headroom_pct']:.0f}% (at or above the constant "
        "guess: from a prior bias read off one batch of 16 it starts worse than the average bag), and more "
        "updates on each batch do not help - D fits the batch it has. So in a 120-step smoke run D has learnt "
        "nothing an encoder could remove: the adversarial term of a 120-step run pushes against a D no better than "
        "the average bag, so it cannot be expected to lower TopConst there. D needs hundreds of batches of fresh "
        "sentences (with E_sem held still, as here; a moving E_sem only adds to it) before the adversary has "
        "anything to work against.",
    ]
    write_results("parabart_adversary_probe", data, "\n".join(md))


if __name__ == "__main__":
    main()
