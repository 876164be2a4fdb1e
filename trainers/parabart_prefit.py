"""ParaBART's discriminator fitted before the adversarial phase (``discriminator_prefit``; ours, #53).

In a CPU-scale run D never learns anything before it pushes: fitted on fresh batches it stays at the average-bag
guess for hundreds of updates (``bench/results/parabart_adversary_probe.md``), so the adversarial term pushes
against nothing. Here, before the first step, the untouched E_sem encodes every training source once (ū, no word
dropout) and D is trained on those cached vectors to convergence - many epochs, AdamW at D's own learning rate,
from the prior bias - keeping its best state on a held-out share of the sentences. Its held-out loss is reported
beside the average bag's (the best constant guess, fitted on the training share): D below it has learnt something.
Training then runs as the reference code runs it. One worker fits; every worker receives D's weights.
"""

from __future__ import annotations

import copy
import json

import torch

from orchestrator.data.paraphrase import load_train_rows
from trainers import common
from trainers.parabart import Discriminator, adv_loss, average_bag_loss, set_prior_bias


def prefit_discriminator(
    dis: Discriminator,
    u: torch.Tensor,
    bags: torch.Tensor,
    *,
    lr: float,
    epochs: int = 100,
    batch_size: int = 256,
    held_out: float = 0.1,
    patience: int = 10,
    seed: int = 0,
) -> dict[str, float]:
    """Fit ``dis`` on (ū, bag) pairs in place; return its held-out loss, the average bag's on the same held-out
    bags, and the epochs run. A seeded ``held_out`` share of the rows is never trained on; an epoch is one pass
    over the rest in shuffled mini-batches; training stops after ``patience`` epochs without a better held-out
    loss, and D is left in its best state."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(u), generator=g)
    n_val = max(1, int(len(u) * held_out))
    val, train = order[:n_val], order[n_val:]
    y_tr, u_val, y_val = bags[train], u[val], bags[val]
    constant = average_bag_loss(
        y_val, dis.form, fitted_on=y_tr
    )  # the constant guess, from the training share
    set_prior_bias(dis, y_tr, across_workers=False)  # one worker fits
    opt = torch.optim.AdamW(dis.parameters(), lr=lr, weight_decay=0.0)

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(adv_loss(dis(u_val), y_val, dis.form))

    best, best_state, since, ran = held_out_loss(), copy.deepcopy(dis.state_dict()), 0, 0
    for ran in range(1, epochs + 1):  # noqa: B007 - the epochs run are reported
        perm = train[torch.randperm(len(train), generator=g)]
        for k in range(0, len(perm), batch_size):
            idx = perm[k : k + batch_size]
            opt.zero_grad(set_to_none=True)
            adv_loss(dis(u[idx]), bags[idx], dis.form).backward()
            opt.step()
        loss = held_out_loss()
        if loss < best:
            best, best_state, since = loss, copy.deepcopy(dis.state_dict()), 0
        else:
            since += 1
            if since >= patience:
                break
    dis.load_state_dict(best_state)
    return {"prefit_valid_loss_adv": best, "prefit_average_bag": constant, "prefit_epochs": float(ran)}


@torch.inference_mode()
def cached_embeddings(
    model, batcher, rows: dict, device, batch_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """ū of every distinct training source under the model as it is (eval mode: no dropout, no word dropout),
    with its bag targets - the encoding pass the pre-fit trains on. ``batcher``: the recipe's
    :class:`trainers.parabart_batch.Batch` (its tokenisation and D's targets)."""
    first: dict[str, str] = {}
    for src, bag in zip(rows["src"], rows["src_bag"], strict=True):
        first.setdefault(str(src), str(bag))
    srcs, bags = list(first), list(first.values())
    was = model.training
    model.eval()
    us, ys = [], []
    for k in range(0, len(srcs), batch_size):
        part = srcs[k : k + batch_size]
        b = batcher(
            {"src": part, "tgt": part, "tgt_parse": ["(S)"] * len(part), "src_bag": bags[k : k + batch_size]},
            train=False,
            device=device,
        )
        us.append(model.embed(b["src_ids"], b["src_mask"]).float().cpu())
        ys.append(b["bags"].cpu())
    model.train(was)
    return torch.cat(us), torch.cat(ys)


def prefit_on_worker_zero(dis: Discriminator, fit) -> dict[str, float]:
    """``fit()`` on worker 0 (it returns the figures); its D weights and figures broadcast to every worker."""
    out = fit() if common.rank() == 0 else {}
    if common.world_size() > 1:
        for p in dis.parameters():
            torch.distributed.broadcast(p.data, src=0)
        box = [json.dumps(out)]
        torch.distributed.broadcast_object_list(box, src=0)
        out = json.loads(box[0])
    return out


def prefit(module, dis: Discriminator, batcher, shards: str, cfg, device) -> dict[str, float]:
    """The recipe's call before its first step: worker 0 reads the training sources, encodes them with the
    untouched E_sem and fits D (at ``lr_discriminator``, else ``train.lr``); every worker gets D; one line says
    how far below the average bag D got."""

    def fit() -> dict[str, float]:
        u, bags = cached_embeddings(module, batcher, load_train_rows(shards), device)
        out = prefit_discriminator(
            dis,
            u.to(device),
            bags.to(device),
            lr=cfg.lr_discriminator or cfg.train.lr,
            epochs=cfg.prefit_epochs,
            seed=cfg.train.seed,
        )
        print(
            f"discriminator pre-fit on {len(u)} cached ū: held-out loss {out['prefit_valid_loss_adv']:.5f} vs the "
            f"average bag's {out['prefit_average_bag']:.5f} ({int(out['prefit_epochs'])} epochs)",
            flush=True,
        )
        return out

    return prefit_on_worker_zero(dis, fit)
