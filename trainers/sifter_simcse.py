"""SimCSE and SIFTER-SimCSE: contrastive sentence embeddings from augmented views.

Method (SIFTER, Section 3; SimCSE, Gao et al. 2021)
----------------------------------------------------
Every sentence X comes with two augmented views built by the corpus pipeline:

* Y = X + its *backbone* (the main clause's root + its direct dependents for a short sentence, a
  subject-relation-object triple for a long one);
* Z = X without *useless words* (articles and conjunctions; pronouns stay).

An encoder maps each view to a vector with the configured pooling (``model.pooling``): ``cls`` is
the papers' setting for BERT-base - the ``[CLS]`` state through an MLP (dense + tanh) in training,
the raw ``[CLS]`` state at test (the MLP is a training-only head, as in SimCSE and SIFTER);
``mean`` is what a sentence-trained encoder such as MiniLM was trained with, and keeps;
``cls_before_pooler`` is the raw ``[CLS]`` state throughout. With in-batch negatives and
temperature τ,

    InfoNCE(A, B) = -1/N Σ_i log( exp(cos(a_i, b_i)/τ) / Σ_j exp(cos(a_i, b_j)/τ) )

and the loss is

    L = λ_XX'·InfoNCE(X, X') + λ_XY·InfoNCE(X, Y) + λ_XZ·InfoNCE(X, Z) + λ_YZ·InfoNCE(Y, Z)

where X' is a second forward pass of X (a different dropout mask). Unsupervised SimCSE is
λ_XX' = 1 and the rest 0; SIFTER is λ_XY = λ_XZ = λ_YZ = 1 (and λ_XX' = 0). Dropout (SIFTER:
0.15; SimCSE: 0.1) is set on the hidden and attention layers. All views of a batch go through
the encoder in one forward pass.

Views and the length limit: a view the augmentation made different from X must stay different
after tokenization. Y keeps its whole backbone: when X + backbone exceeds ``model.max_length``,
the *sentence part* is cut, never the appended backbone. The number of rows whose Y or Z still
tokenized to exactly X is logged with every evaluation (``views_identical_y`` / ``_z``; 0
expected for Y wherever the backbone is non-empty).

Negatives across workers: with N data-parallel workers each view's embeddings are all-gathered
(differentiably: ``torch.distributed.nn``), so every anchor is contrasted with the *global* batch's
candidates, as SimCSE's own code does; N workers × batch b give exactly the loss and gradient of
1 worker × batch N·b (``tests/test_sifter_simcse.py`` proves it). ``gather_negatives: false`` turns it off.

Large batches: ``train.grad_cache: {mini_batch: m}`` encodes the batch m sequences at a time without a
graph, takes the loss's gradient on the embeddings, then re-encodes each mini-batch with its dropout masks
and backpropagates that gradient (``trainers/grad_cache.py``): the same gradient on a mini-batch's memory.

Args (config keys, see :class:`ContrastiveConfig`)
    lambda_xx, lambda_xy, lambda_xz, lambda_yz: loss weights (≥ 0, at least one > 0)
    matryoshka_dims, matryoshka_weights: the loss also on the embedding's first d coordinates, summed with weights
        (``MatryoshkaLoss`` around each term; :mod:`trainers.matryoshka`)
    temperature: τ (0.05);  dropout: hidden + attention dropout of the encoder
    model.pooling: cls | mean | cls_before_pooler (empty: the model folder's own, else cls)
    gather_negatives: all-gather embeddings across workers (default true)

References
    - Gao, Yao, Chen. SimCSE: Simple Contrastive Learning of Sentence Embeddings. EMNLP 2021.
    - SIFTER: sentence embeddings from syntactic backbones and filtered views (the method
      described in this project's mission; λ_XY·InfoNCE(X,Y) + λ_XZ·InfoNCE(X,Z) + λ_YZ·InfoNCE(Y,Z)).

Inputs
    Parquet shards from ``jobs/augment_corpus.py`` with columns ``text`` (X), ``backbone_view``
    (Y) and ``deletion_view`` (Z).

Example
    python jobs/train.py --method sifter_simcse --preset smoke
    python jobs/train.py --method simcse --preset smoke train.max_steps=50
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from orchestrator.config import EncoderMethodConfig, EvalConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.training_corpus import CorpusBlock, prepare_corpus
from orchestrator.evaluation.encode import mean_pool
from orchestrator.models import load_encoder, pooling_for
from trainers import common
from trainers.grad_cache import CachedLoss, encode
from trainers.matryoshka import MatryoshkaOption, matryoshka_sum
from trainers.protocol import STS_DEV
from trainers.recipe import Recipe

VIEW_COLUMNS = {"x": "text", "y": "backbone_view", "z": "deletion_view"}


# ---------------------------------------------------------------- config
class ContrastiveConfig(EncoderMethodConfig, MatryoshkaOption):
    method: Literal["simcse", "sifter_simcse"] = "sifter_simcse"
    model: ModelConfig = ModelConfig(max_length=32)
    default_pooling: ClassVar[str] = "cls"  # the papers' BERT-base setting
    supports_grad_cache: ClassVar[bool] = True  # train.grad_cache: the batch encoded in mini-batches
    dropout: float = Field(0.15, ge=0, lt=1)
    temperature: float = Field(0.05, gt=0)
    lambda_xx: float = Field(0.0, ge=0)
    lambda_xy: float = Field(1.0, ge=0)
    lambda_xz: float = Field(1.0, ge=0)
    lambda_yz: float = Field(1.0, ge=0)
    gather_negatives: bool = True
    train: TrainLoopConfig = TrainLoopConfig(lr=1e-5, batch_size=64, eval_steps=125)
    data: CorpusBlock = CorpusBlock()
    eval: EvalConfig = EvalConfig(batch_size=128, max_length=128)
    tracking: TrackingConfig = TrackingConfig(registry_model_name="sifter-simcse")

    def data_sources(self) -> list[tuple[str, str]]:
        return [*self.data.sources(), *self.eval_sources()]

    def check_data(self) -> None:
        self.data.check()
        self.check_matryoshka(self.model.name_or_path)

    @model_validator(mode="after")
    def _some_loss(self):
        if self.lambda_xx + self.lambda_xy + self.lambda_xz + self.lambda_yz <= 0:
            raise ValueError("at least one of lambda_xx, lambda_xy, lambda_xz, lambda_yz must be > 0")
        return self

    def views(self) -> list[str]:
        """Which views a batch needs: x always; x2 (dropout copy), y, z only when weighted."""
        out = ["x"]
        if self.lambda_xx > 0:
            out.append("x2")
        if self.lambda_xy > 0 or self.lambda_yz > 0:
            out.append("y")
        if self.lambda_xz > 0 or self.lambda_yz > 0:
            out.append("z")
        return out


# ---------------------------------------------------------------- model
class ContrastiveEncoder(nn.Module):
    """Encoder + pooling; with ``cls``, SimCSE's MLP head (dense + tanh) over ``[CLS]``, used in training only."""

    def __init__(self, encoder: nn.Module, pooling: str):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        hidden = encoder.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if pooling == "cls" else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "mean":
            return mean_pool(states, attention_mask)
        return self.mlp(states[:, 0]) if self.mlp is not None else states[:, 0]


def build_model(cfg: ContrastiveConfig):
    """(ContrastiveEncoder, tokenizer) with the configured dropout and pooling; no BERT pooler (DDP
    would see it as unused parameters)."""
    encoder, tokenizer = load_encoder(
        cfg.model.name_or_path, dropout=cfg.dropout, add_pooling_layer=False, attention=cfg.perf.attention
    )
    return ContrastiveEncoder(encoder, pooling_for(cfg)), tokenizer


# ---------------------------------------------------------------- loss
def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """In-batch InfoNCE: row i of ``a`` should match row i of ``b`` against every other row of ``b``.

    cos(a_i, b_j) for every pair as one product of unit vectors: B×B memory. (SimCSE's code broadcasts
    ``cosine_similarity`` over a B×B×d tensor - the same numbers at d times the memory: 0.4 GB per view pair at
    batch 512 on MiniLM, which dominated a cached step's peak.)"""
    logits = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T / temperature
    labels = torch.arange(a.size(0), device=a.device)
    return F.cross_entropy(logits, labels)


def sifter_loss(
    emb: dict[str, torch.Tensor], cfg: ContrastiveConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """λ-weighted sum of the four InfoNCE terms over (already gathered) view embeddings."""
    pairs = {
        "xx": ("x", "x2", cfg.lambda_xx),
        "xy": ("x", "y", cfg.lambda_xy),
        "xz": ("x", "z", cfg.lambda_xz),
        "yz": ("y", "z", cfg.lambda_yz),
    }
    terms = {k: w * info_nce(emb[a], emb[b], cfg.temperature) for k, (a, b, w) in pairs.items() if w > 0}
    loss = sum(terms.values())
    return loss, {f"loss_{k}": float(v.detach()) for k, v in terms.items()}


# ---------------------------------------------------------------- views under the length limit
def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after one sequence (BERT: [CLS] … [SEP])."""
    inner = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    i = next(k for k in range(len(full)) if full[k : k + len(inner)] == inner)
    return full[:i], full[i + len(inner) :]


def backbone_view_ids(tokenizer, sentence: str, view: str, max_length: int) -> list[int]:
    """Y's token ids: the appended backbone (``view`` = ``sentence`` + " " + backbone) is kept whole;
    when both do not fit, the sentence part is cut."""
    backbone = view[len(sentence) :].strip() if view.startswith(sentence) else ""
    if not backbone:
        return tokenizer(view, truncation=True, max_length=max_length)["input_ids"]
    head, tail = special_frame(tokenizer)
    budget = max_length - len(head) - len(tail)
    x = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    b = tokenizer(backbone, add_special_tokens=False)["input_ids"][: max(1, budget - 1)]
    return head + x[: budget - len(b)] + b + tail


def tokenize_views(tokenizer, batch: dict, cfg: ContrastiveConfig) -> tuple[dict, list[str], Counter]:
    """All views of a batch in one padded tensor ([x; x2; y; z] along the batch axis), and how many
    rows had a view that the augmentation made different from X but that tokenized to X's ids."""
    views, max_len = cfg.views(), cfg.model.max_length
    x_text = [str(t) for t in batch[VIEW_COLUMNS["x"]]]
    x_ids = tokenizer(x_text, truncation=True, max_length=max_len)["input_ids"]
    ids, identical = [], Counter()
    for v in views:
        if v in ("x", "x2"):
            ids += x_ids
            continue
        texts = [str(t) for t in batch[VIEW_COLUMNS[v]]]
        got = (
            [backbone_view_ids(tokenizer, x, y, max_len) for x, y in zip(x_text, texts)]
            if v == "y"
            else tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]
        )
        identical[v] = sum(t != x and g == xi for t, x, g, xi in zip(texts, x_text, got, x_ids))
        ids += got
    enc = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    return enc, views, identical


def compute_loss(
    model: nn.Module, tokenizer, batch: dict, cfg: ContrastiveConfig, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor | CachedLoss, dict[str, float]]:
    """Forward every view once, gather across workers (differentiably), return (loss, logged terms):
    the loss over the global batch, whose gradient DDP's average then is. Under ``train.grad_cache`` the
    loss is a :class:`CachedLoss`, whose backward :class:`trainers.common.Stepper` runs."""
    enc, views, identical = tokenize_views(tokenizer, batch, cfg)
    ids, mask = (
        common.to_device(enc["input_ids"], device, cfg),
        common.to_device(enc["attention_mask"], device, cfg),
    )
    out, cache = encode(model, ids, mask, cfg)  # under train.grad_cache: no graph, the backward re-encodes
    per_view = out.view(len(views), -1, out.size(-1))
    emb = {
        v: common.gather_with_grad(per_view[i]) if cfg.gather_negatives else per_view[i]
        for i, v in enumerate(views)
    }
    loss, logs = matryoshka_sum(lambda e: sifter_loss(e, cfg), emb, cfg)  # sifter_loss alone without dims
    logs["loss"] = float(loss.detach())
    logs.update({f"identical_{v}": n for v, n in identical.items()})
    return (CachedLoss(loss, cache) if cache else loss), logs


# ---------------------------------------------------------------- export
def export_model(cfg: ContrastiveConfig, checkpoint_dir, out_dir):
    """Checkpoint (plain or DeepSpeed ZeRO, any stage) → an HF folder of the encoder alone (the MLP
    is a training-only head) that loads with ``AutoModel`` and ``SentenceTransformer``, saved with the
    test-time pooling (``cls`` → the raw ``[CLS]`` state)."""
    return common.export_trained_encoder(build_model, cfg, checkpoint_dir, out_dir)


# ---------------------------------------------------------------- the recipe, under two names
class ContrastiveRecipe(Recipe):
    """X, Y, Z through one encoder, λ-weighted InfoNCE over the pairs (the config's λs), read by SimCSE's
    protocol (STS-B dev, the best checkpoint). SimCSE and SIFTER-SimCSE are this one recipe under two names:
    they differ only in their configs' λs."""

    config_cls = ContrastiveConfig
    protocol = STS_DEV
    columns = ("text", "backbone_view", "deletion_view")

    def setup(self):
        self.seen = Counter()  # rows whose Y / Z tokenized to X's ids, since this worker started

    def build(self) -> nn.Module:
        module, self.tokenizer = build_model(self.cfg)
        return module

    def loss(self, model, batch, state):
        loss, logs = compute_loss(model, self.tokenizer, batch, self.cfg, self.device)
        self.seen.update({k: logs.pop(k) for k in [k for k in logs if k.startswith("identical_")]})
        return loss, {**logs, **{f"views_{k}": float(v) for k, v in self.seen.items()}}

    prepare_data = staticmethod(prepare_corpus)
    export = staticmethod(export_model)


class SIFTERSimCSERecipe(ContrastiveRecipe):
    """SIFTER-SimCSE: λ_XY = λ_XZ = λ_YZ = 1 (``configs/sifter_simcse/``)."""

    name = "sifter_simcse"
    title = "SIFTER-SimCSE"
    runs_with = "`jobs/sifter_sweep.py` (the main job)"


class SimCSERecipe(ContrastiveRecipe):
    """Unsupervised SimCSE: λ_XX' = 1 and the rest 0 (``configs/simcse/``)."""

    name = "simcse"
    title = "SimCSE (unsupervised)"
    runs_with = "`jobs/sifter_sweep.py` (its λ grid), `jobs/train.py --method simcse`"
