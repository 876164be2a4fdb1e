"""ParaBART's syntax discriminator D and the adversarial loss, in the reference code's form
(uclanlp/ParaBART ``Discriminator``, ``synt_bow``, ``BCEWithLogitsLoss``); ``trainers/parabart.py`` trains with them.

D reads the sentence embedding ū through a LayerNorm without parameters (so the encoder cannot fool it by
scaling ū) and predicts, per constituent tag, the tag's share of the source's bag: the tree's counts plus
one for every tag, normalised. ``form="softmax"`` is Sieve's earlier D (linear, softmax cross-entropy on the
labels' shares), kept to reproduce old results.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.data.paraphrase import Vocab
from trainers import common


class Discriminator(nn.Module):
    """D: ū → one logit per constituent tag (the tag vocabulary less padding and unknown).
    ``reference``: LayerNorm without parameters, then linear (the reference code's ``Discriminator``);
    ``softmax``: linear alone (the loss applies the softmax)."""

    def __init__(self, hidden_size: int, n_tags: int, form: str = "reference"):
        super().__init__()
        self.form = form
        self.norm = (
            nn.LayerNorm(hidden_size, elementwise_affine=False) if form == "reference" else nn.Identity()
        )
        self.linear = nn.Linear(hidden_size, n_tags)

    @property
    def dtype(self) -> torch.dtype:
        return self.linear.weight.dtype

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(u.to(self.dtype)))  # D stays fp32 when ZeRO runs the model in bf16


def discriminator(model: nn.Module, form: str = "reference") -> Discriminator:
    """D for a ParaBART model (``hidden_size``, ``tag_vocab``): one logit per tag, padding and unknown left out."""
    return Discriminator(model.hidden_size, len(model.tag_vocab) - 2, form)


def bag_targets(bags: list[str], tags: Vocab, form: str = "reference") -> torch.Tensor:
    """D's targets from the sources' bags (JSON tag → count). ``reference``: one plus each tag's count,
    normalised over the tags (the reference code's ``synt_bow``); ``softmax``: each label's share of the
    tree's nodes, brackets and ``ROOT`` left out. Tags outside the training vocabulary are not counted."""
    out = torch.zeros(len(bags), len(tags) - 2)
    for i, b in enumerate(bags):
        for tag, count in json.loads(b).items():
            if tag in tags.index and (form == "reference" or tag not in ("(", ")", "ROOT")):
                out[i, tags.index[tag] - 2] += count
    if form == "reference":
        out += 1.0
    return out / out.sum(-1, keepdim=True).clamp_min(1e-12)


def adv_loss(dis_logits: torch.Tensor, bags: torch.Tensor, form: str = "reference") -> torch.Tensor:
    """L_adv: ``reference``: binary cross-entropy with logits per tag, averaged over tags and the batch
    (``nn.BCEWithLogitsLoss()``); ``softmax``: −Σ_t h(t) log softmax(D(ū))_t, averaged over the batch."""
    if form == "reference":
        return F.binary_cross_entropy_with_logits(dis_logits, bags)
    return -(bags * F.log_softmax(dis_logits, dim=-1)).sum(-1).mean()


def encoder_adv_term(
    dis_logits: torch.Tensor, bags: torch.Tensor, form: str = "reference", objective: str = "reverse"
) -> torch.Tensor:
    """What the encoder adds to L_para, times λ_adv. ``reverse`` (the paper and its reference code): −L_adv,
    D's own loss maximised - unbounded above, so an encoder can win by driving every ū to where D is most
    wrong (the collapse of ``bench/results/parabart_smoke.md``). ``confusion`` (ours, Tzeng et al. 2015's
    domain confusion): D's loss against the batch's average bag, minimised - bounded below, it is lowest when
    D predicts the same bag for every sentence, i.e. when ū tells D nothing about a sentence's own syntax."""
    if objective == "reverse":
        return -adv_loss(dis_logits, bags, form)
    average = bags.mean(0, keepdim=True).expand_as(bags)
    return adv_loss(dis_logits, average, form)


def average_bag_loss(bags: torch.Tensor, form: str = "reference") -> float:
    """The loss of the best constant guess - the average bag of ``bags`` - on ``bags``: a D whose loss is not
    below it has learnt nothing about a sentence's syntax from ū."""
    mean = bags.mean(0, keepdim=True).clamp(1e-12, 1 - 1e-12)
    if form == "reference":
        return float(F.binary_cross_entropy(mean.expand_as(bags), bags))
    return float(-(bags * mean.log()).sum(-1).mean())


@torch.no_grad()
def set_prior_bias(dis: Discriminator, bags: torch.Tensor) -> None:
    """``discriminator_bias: prior``: D's bias set to the best constant guess for ``bags`` (the first training
    batch, averaged over the workers) - per tag the log-odds of its mean share (``reference``), or its log
    (``softmax``) - so D starts at the average bag's loss and learns only what ū tells about a sentence's
    syntax. From PyTorch's default bias (near 0, σ ≈ 0.5 against shares near 1/n_tags) D first spends its
    steps lowering the bias: at 1e-3 an Adam step moves it 1e-3, so 120 smoke steps never got there."""
    mean = bags.float().mean(0)
    if common.world_size() > 1:
        torch.distributed.all_reduce(mean)
        mean /= common.world_size()
    mean = mean.clamp(1e-6, 1 - 1e-6)
    dis.linear.bias.copy_((mean / (1 - mean)).log() if dis.form == "reference" else mean.log())


def adversary_step(
    dis: Discriminator, opt_dis: torch.optim.Optimizer, u: torch.Tensor, bags: torch.Tensor
) -> float:
    """(1) D alone minimises L_adv on ū.detach(): no gradient reaches the encoders."""
    opt_dis.zero_grad(set_to_none=True)
    loss = adv_loss(dis(u.detach()), bags, dis.form)
    loss.backward()
    common.average_gradients(dis.parameters())
    opt_dis.step()
    return float(loss.detach())


def discriminator_optimizer(dis: nn.Module, cfg) -> torch.optim.Optimizer:
    """D's own AdamW at E_sem's learning rate (the paper's 2e-5) unless ``lr_discriminator``; the main decay."""
    return torch.optim.AdamW(
        common.param_groups(dis, cfg.train.weight_decay), lr=cfg.lr_discriminator or cfg.train.lr
    )
