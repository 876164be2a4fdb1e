"""Siamese domain adaptation of a sentence encoder from labelled texts, and its NAIVE baseline.

Method (Siamese adaptation of sentence embeddings to a labelled domain)
-----------------------------------------------------------------------
From a labelled data set, pairs of texts are drawn - half from the same class, half from
different classes (``orchestrator.data.episodes``) - with a binary label y (1 = same class).
Both texts go through **one** encoder (the two branches are the same weights), the configured
pooling (``model.pooling``: ``mean``, as the paper's SBERT; ``cls`` / ``cls_before_pooler``: the raw
``[CLS]`` state) gives u and v, and the cosine similarity is trained against the label:

    cosine_mse:   L = ( cos(u, v) − y )²                                   (default)
    contrastive:  L = ½ [ y·d² + (1 − y)·max(0, m − d)² ],  d = 1 − cos(u, v)

so texts of one class move together and texts of different classes apart. **ALL** trains one
encoder on the pairs of several data sets at once (the same number from each).

**NAIVE** (``mode: naive``): the encoder + a dense 128-unit ReLU layer + softmax over the data
set's classes, fine-tuned end to end with cross-entropy; the head is thrown away after training
and the encoder is used as is. **ORIG** is the untouched encoder. A fresh head's first gradients are
noise to the encoder, so NAIVE can warm its head up first (``head_warmup_steps``, ours, off by default):
the encoder is held bit-identical for that many first steps while the head learns (at ``head_lr``),
then both train. A comparison counts NAIVE's *encoder* steps against SIAMESE's, and texts encoded per
step (a pair is two texts) as its batch - so NAIVE at batch 32 with a 60-step warm-up and 120 steps
matches SIAMESE at 16 pairs and 60 steps.

Evaluation (``orchestrator.evaluation.separation``): Δ cosine distance (the paper's Eq. 1-2) - the
mean cosine distance of random different-class test pairs minus that of same-class pairs, 5,000 of
each kind - and, as a classification-free second view, the mean average precision of same-class
neighbours. The dev score for checkpoint selection is Δ on the held-out part of the train sets.

Args (config keys, see :class:`SiameseConfig`)
    mode: ``siamese`` | ``naive``;  loss: ``cosine_mse`` | ``contrastive`` (margin m)
    train_sets: one labelled set (or several = ALL);  n_pairs: pairs per set
    select: ``last`` (the paper: a fixed number of epochs) or ``dev_delta`` (the best dev Δ; ours, named)
    test_sets: labelled sets for Δ and MAP;  eval_pairs: pairs of each kind (5,000)

Example
    python jobs/train.py --method siamese --preset smoke
    python jobs/compare.py --preset siamese_crisis     # the paper's Table 1, one experiment: ORIG/NAIVE/SIAMESE/ALL
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from orchestrator.config import EncoderMethodConfig, EvalConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.episodes import prepare_siamese_data
from orchestrator.data.labelled import LabelledSet, split_rows
from orchestrator.evaluation.encode import HFEncoder, test_time_pooling
from orchestrator.evaluation.separation import delta_cosine_distance, evaluate_sets
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import load_encoder, pooling_for
from orchestrator.spec import BaseResult, measure_base
from trainers import common
from trainers.encoder import PooledEncoder, tokenize_texts
from trainers.recipe import GLOBAL_BATCH, STEP_BUDGET, Recipe


# ---------------------------------------------------------------- config
class SiameseConfig(EncoderMethodConfig):
    method: Literal["siamese"] = "siamese"
    mode: Literal["siamese", "naive"] = "siamese"
    model: ModelConfig = ModelConfig(max_length=64)
    default_pooling: ClassVar[str] = "mean"  # the paper's (SBERT)
    loss: Literal["cosine_mse", "contrastive"] = "cosine_mse"
    margin: float = Field(0.5, gt=0)
    naive_hidden: int = Field(128, gt=0)
    head_warmup_steps: int = Field(
        0, ge=0, description="NAIVE: the encoder held still for this many first steps while the head learns"
    )
    head_lr: float | None = Field(
        None, gt=0, description="NAIVE: the head's learning rate (default train.lr)"
    )
    train_sets: list[LabelledSet] = Field(..., min_length=1)
    test_sets: list[LabelledSet] = []
    n_pairs: int = Field(2000, gt=0, description="training pairs per train set")
    dev_fraction: float = Field(0.1, gt=0, lt=1, description="texts of each train set held out for the dev Δ")
    eval_pairs: int = Field(5000, gt=0, description="test pairs of each kind (same / different)")
    select: Literal["last", "dev_delta"] = Field(
        "last",
        description="the run's checkpoint: the last (the paper "
        "trains a fixed number of epochs) or the best dev Δ (ours, optional)",
    )
    eval: EvalConfig = EvalConfig(batch_size=128, max_length=64, tasks=[])
    train: TrainLoopConfig = TrainLoopConfig(lr=2e-5, batch_size=16, eval_steps=100)
    tracking: TrackingConfig = TrackingConfig(registry_model_name="siamese")

    def data_sources(self) -> list[tuple[str, str]]:
        return [
            *((f"train_sets[{i}].path", s.path) for i, s in enumerate(self.train_sets)),
            *((f"test_sets[{i}].path", s.path) for i, s in enumerate(self.test_sets)),
        ]

    def check_data(self) -> None:
        """Every labelled set read whole (tweets: small): a wrong column or a filter that keeps nothing fails
        here, naming the file, before any Ray work."""
        for s in (*self.train_sets, *self.test_sets):
            s.rows()

    @model_validator(mode="after")
    def _naive_one_set(self):
        if self.mode == "naive" and len(self.train_sets) != 1:
            raise ValueError("mode naive trains a classifier on exactly one train set")
        return self

    @model_validator(mode="after")
    def _head_options_are_naive(self):
        if self.mode != "naive" and (self.head_warmup_steps or self.head_lr is not None):
            raise ValueError(
                "head_warmup_steps and head_lr are NAIVE's (mode: naive): a SIAMESE run has no head"
            )
        if self.head_warmup_steps and self.deepspeed.stage > 0:
            raise ValueError(
                "head_warmup_steps works with the plain / DDP optimiser only, not under DeepSpeed ZeRO"
            )
        if self.train.max_steps is not None and self.head_warmup_steps >= self.train.max_steps:
            raise ValueError(
                f"head_warmup_steps ({self.head_warmup_steps}) must be below train.max_steps "
                f"({self.train.max_steps}): the encoder would never train"
            )
        return self


# ---------------------------------------------------------------- model
class SiameseEncoder(PooledEncoder):
    """One pooled encoder for both branches; ``head`` exists only in NAIVE mode (dropped at export)."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean", num_classes: int = 0, hidden: int = 128):
        super().__init__(encoder, pooling)
        size = encoder.config.hidden_size
        self.head = (
            nn.Sequential(nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
            if num_classes
            else None
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, classify: bool = False
    ) -> torch.Tensor:
        """Pooled sentence vectors, or (NAIVE, ``classify``) the head's class logits."""
        pooled = self.embed(input_ids, attention_mask)
        return self.head(pooled) if classify else pooled


def parameter_groups(model: SiameseEncoder, cfg: SiameseConfig) -> list[dict]:
    """AdamW groups tagged by part - the encoder's and NAIVE's head (at ``head_lr``) - so the head's warm-up
    can hold the encoder still (:func:`trainers.common.hold_part`)."""
    named = list(model.named_parameters())
    parts = {
        "encoder": [(n, p) for n, p in named if n.startswith("encoder.")],
        "head": [(n, p) for n, p in named if not n.startswith("encoder.")],
    }
    return common.part_groups(parts, cfg.train.weight_decay, head=cfg.head_lr)


def build_model(cfg: SiameseConfig, num_classes: int = 0):
    encoder, tokenizer = load_encoder(
        cfg.model.name_or_path, add_pooling_layer=False, attention=cfg.perf.attention
    )
    n = num_classes if cfg.mode == "naive" else 0
    return SiameseEncoder(encoder, pooling_for(cfg), n, cfg.naive_hidden), tokenizer


# ---------------------------------------------------------------- losses
def pair_loss(u: torch.Tensor, v: torch.Tensor, y: torch.Tensor, cfg: SiameseConfig) -> torch.Tensor:
    cos = F.cosine_similarity(u, v)
    if cfg.loss == "cosine_mse":
        return F.mse_loss(cos, y)
    d = 1 - cos
    return 0.5 * (y * d.pow(2) + (1 - y) * F.relu(cfg.margin - d).pow(2)).mean()


def compute_loss(
    model,
    tokenizer,
    batch: dict,
    cfg: SiameseConfig,
    classes: list[str] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.mode == "naive":
        logits = model(*tokenize_texts(tokenizer, batch["text"], cfg, device), classify=True)
        index = {c: i for i, c in enumerate(classes or [])}
        y = torch.tensor([index[str(c)] for c in batch["label"]], device=device)
        loss = F.cross_entropy(logits, y)
        return loss, {"loss": float(loss.detach())}
    n = len(batch["text_a"])
    both = model(*tokenize_texts(tokenizer, list(batch["text_a"]) + list(batch["text_b"]), cfg, device))
    y = torch.as_tensor(np.asarray(batch["label"], dtype=np.float32), device=device)
    loss = pair_loss(both[:n], both[n:], y, cfg)
    return loss, {"loss": float(loss.detach())}


# ---------------------------------------------------------------- data: the train part of each set
def classes_of(cfg: SiameseConfig) -> list[str]:
    train, _ = split_rows(cfg.train_sets[0].rows(), cfg.dev_fraction, cfg.train.seed)
    return sorted({y for _, y in train})


def prepare_data(cfg: SiameseConfig, progress: bool = True) -> str:
    """SIAMESE: pair episodes from the train part of every train set (Ray Data). NAIVE: the
    train part as (text, label) shards."""
    return prepare_siamese_data(
        cfg.train_sets,
        pairs=cfg.mode == "siamese",
        n_pairs=cfg.n_pairs,
        dev_fraction=cfg.dev_fraction,
        seed=cfg.train.seed,
        storage_root=cfg.run.storage,
    )


# ---------------------------------------------------------------- evaluation: Δ cosine distance, MAP
def sentence_encoder(encoder: nn.Module, tokenizer, cfg: SiameseConfig) -> HFEncoder:
    return HFEncoder(
        encoder,
        tokenizer,
        pooling=test_time_pooling(pooling_for(cfg)),
        batch_size=cfg.eval.batch_size,
        max_length=cfg.model.max_length,
    )


def dev_sets(cfg: SiameseConfig) -> dict[str, list[tuple[str, str]]]:
    """The held-out part of every train set (read once per run, not per evaluation)."""
    return {s.name: split_rows(s.rows(), cfg.dev_fraction, cfg.train.seed)[1] for s in cfg.train_sets}


def dev_delta(encoder, tokenizer, cfg: SiameseConfig, sets: dict | None = None) -> float:
    enc = sentence_encoder(encoder, tokenizer, cfg)
    deltas = [
        delta_cosine_distance(
            enc.encode([t for t, _ in dev]), [y for _, y in dev], min(1000, cfg.eval_pairs), name=name
        )["delta"]
        for name, dev in (sets or dev_sets(cfg)).items()
    ]
    return float(np.mean(deltas))


def test_report(encoder, tokenizer, cfg: SiameseConfig) -> TestReport:
    """Δ cosine distance and same-class MAP on every test set; headline = mean Δ."""
    metrics = evaluate_sets(sentence_encoder(encoder, tokenizer, cfg), cfg.test_sets, cfg.eval_pairs)
    deltas = [v for k, v in metrics.items() if k.endswith("_delta")]
    metrics["delta_mean"] = float(np.mean(deltas)) if deltas else float("nan")
    rows = ["| test set | Δ cos distance ×100 | same-class MAP ×100 |", "|---|---:|---:|"]
    rows += [
        f"| {s.name} | {metrics[f'{s.name}_delta'] * 100:.2f} | {metrics[f'{s.name}_map'] * 100:.2f} |"
        for s in cfg.test_sets
    ]
    return TestReport(
        "Δ cosine distance and same-class MAP", metrics, "delta_mean", "\n".join(rows), {"siamese": metrics}
    )


test_report.__test__ = False  # not a pytest test


def evaluate(cfg: SiameseConfig, model_dir, tasks: list[str] | None = None) -> TestReport:
    model, tok = load_encoder(str(model_dir), add_pooling_layer=False)
    return test_report(model, tok, cfg)


def evaluate_base(cfg: SiameseConfig) -> BaseResult:
    """ORIG: the untouched encoder, with the same pooling, on the dev Δ and the test sets."""
    return measure_base(cfg, dev_delta, evaluate, "ORIG")


# ---------------------------------------------------------------- export
def export_model(cfg: SiameseConfig, checkpoint_dir, out_dir):
    """The encoder alone with its pooling (NAIVE's classification head is discarded)."""
    classes = classes_of(cfg) if cfg.mode == "naive" else []
    return common.export_trained_encoder(
        build_model,
        cfg,
        checkpoint_dir,
        out_dir,
        max_seq_length=cfg.model.max_length,
        num_classes=len(classes),
    )


# ---------------------------------------------------------------- the recipe
class SiameseRecipe(Recipe):
    name = "siamese"
    title = "Siamese adaptation (ORIG / NAIVE / SIAMESE / ALL)"
    runs_with = "`jobs/compare.py --preset siamese_{sentiment,topics,crisis}` (the paper's Table 1)"
    config_cls = SiameseConfig
    metric, metric_label = "dev_delta", "dev Δ cosine distance"
    reads = "dev Δ cosine distance → Δ and same-class MAP per test set"
    columns = None

    def setup(self):  # no RNG drawn: the splits are seeded hashes of the text
        self.classes = classes_of(self.cfg) if self.cfg.mode == "naive" else None
        self.dev_rows = dev_sets(self.cfg)

    def build(self) -> nn.Module:
        module, self.tokenizer = build_model(self.cfg, len(self.classes or []))
        return module

    def optimizer_extras(self, module):
        return {"groups": parameter_groups(module, self.cfg)}

    def loss(self, model, batch, state):
        common.hold_part(self.stepper.optimizer, "encoder", frozen=state["step"] < self.cfg.head_warmup_steps)
        return compute_loss(model, self.tokenizer, batch, self.cfg, self.classes, self.device)

    def dev(self, module):
        return dev_delta(module.encoder, self.tokenizer, self.cfg, self.dev_rows)

    prepare_data = staticmethod(prepare_data)
    export = staticmethod(export_model)
    evaluate = staticmethod(evaluate)
    evaluate_base = staticmethod(evaluate_base)

    @classmethod
    def selection_metric(cls, cfg):
        return cls.metric if cfg.select == "dev_delta" else None

    @classmethod
    def comparable(cls, cfg):
        """The budget is the encoder's: its steps (NAIVE's head-only warm-up does not count) and the texts
        it encodes per step (a SIAMESE pair is two), so NAIVE and SIAMESE are compared at equal encoder work."""
        out = super().comparable(cfg)
        out[STEP_BUDGET] = cfg.train.max_steps - cfg.head_warmup_steps if cfg.train.max_steps else None
        out[GLOBAL_BATCH] = (
            cfg.train.batch_size * cfg.scaling.num_workers * (2 if cfg.mode == "siamese" else 1)
        )
        return out

    @classmethod
    def training_data(cls, cfg):
        return {"train_sets": [t.model_dump(mode="json") for t in cfg.train_sets], "n_pairs": cfg.n_pairs}
