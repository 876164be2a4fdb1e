"""Siamese domain adaptation of a sentence encoder from labelled texts, and its NAIVE baseline.

Method (Siamese adaptation of sentence embeddings to a labelled domain)
-----------------------------------------------------------------------
From a labelled data set, pairs of texts are drawn - half from the same class, half from
different classes (``orchestrator.data.episodes``) - with a binary label y (1 = same class).
Both texts go through **one** encoder (the two branches are the same weights), mean pooling
gives u and v, and the cosine similarity is trained against the label:

    cosine_mse:   L = ( cos(u, v) − y )²                                   (default)
    contrastive:  L = ½ [ y·d² + (1 − y)·max(0, m − d)² ],  d = 1 − cos(u, v)

so texts of one class move together and texts of different classes apart. **ALL** trains one
encoder on the pairs of several data sets at once (the same number from each).

**NAIVE** (``mode: naive``): the encoder + a dense 128-unit ReLU layer + softmax over the data
set's classes, fine-tuned end to end with cross-entropy; the head is thrown away after training
and the encoder is used as is. **ORIG** is the untouched encoder.

Evaluation - Δ cosine distance (the paper's Eq. 1-2): with cosine distance δ(a, b) = 1 − cos,

    Δ = mean δ over random different-class test pairs − mean δ over random same-class test pairs

on 5,000 pairs of each kind (seeded), higher = classes better separated; and, as a
classification-free second view, the mean average precision of same-class neighbours (each
query text ranks the others by cosine).

Args (config keys, see :class:`SiameseConfig`)
    mode: ``siamese`` | ``naive``;  loss: ``cosine_mse`` | ``contrastive`` (margin m)
    train_sets: one labelled set (or several = ALL);  n_pairs: pairs per set
    test_sets: labelled sets for Δ and MAP;  eval_pairs: pairs of each kind (5,000)

Example
    python jobs/siamese_experiments.py --preset smoke
"""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from orchestrator.config import (
    DeepSpeedBlock,
    ModelConfig,
    RunBlock,
    ScalingBlock,
    StrictModel,
    TrackingConfig,
    TrainLoopConfig,
)
from orchestrator.evaluation.encode import mean_pool
from trainers import common


# ---------------------------------------------------------------- config
class LabelledSet(StrictModel):
    """A labelled TSV: which columns hold the text and the class, and which rows to keep."""

    name: str
    path: str
    text_column: str = "sentence"
    label_column: str = "label"
    where: dict[str, list[str]] = {}
    limit: int | None = Field(None, gt=0)

    def rows(self) -> list[tuple[str, str]]:
        from orchestrator.data.labelled import read_labelled

        return read_labelled(self.path, text_column=self.text_column, label_column=self.label_column,
                             limit=self.limit, integer_labels=False, where=self.where or None)


class SiameseConfig(StrictModel):
    method: Literal["siamese"] = "siamese"
    mode: Literal["siamese", "naive"] = "siamese"
    model: ModelConfig = ModelConfig(max_length=64, pooling="mean")
    loss: Literal["cosine_mse", "contrastive"] = "cosine_mse"
    margin: float = Field(0.5, gt=0)
    naive_hidden: int = Field(128, gt=0)
    train_sets: list[LabelledSet] = Field(..., min_length=1)
    test_sets: list[LabelledSet] = []
    n_pairs: int = Field(2000, gt=0, description="training pairs per train set")
    dev_fraction: float = Field(0.1, gt=0, lt=1, description="texts of each train set held out for the dev Δ")
    eval_pairs: int = Field(5000, gt=0, description="test pairs of each kind (same / different)")
    eval_batch_size: int = Field(128, gt=0)
    train: TrainLoopConfig = TrainLoopConfig(lr=2e-5, batch_size=16, eval_steps=100)
    scaling: ScalingBlock = ScalingBlock(num_workers=1)
    deepspeed: DeepSpeedBlock = DeepSpeedBlock()
    run: RunBlock = RunBlock()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="siamese")

    @model_validator(mode="after")
    def _naive_one_set(self):
        if self.mode == "naive" and len(self.train_sets) != 1:
            raise ValueError("mode naive trains a classifier on exactly one train set")
        return self


# ---------------------------------------------------------------- model
class SiameseEncoder(nn.Module):
    """One encoder for both branches; ``head`` exists only in NAIVE mode (dropped at export)."""

    def __init__(self, encoder: nn.Module, num_classes: int = 0, hidden: int = 128):
        super().__init__()
        self.encoder = encoder
        size = encoder.config.hidden_size
        self.head = (nn.Sequential(nn.Linear(size, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
                     if num_classes else None)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, classify: bool = False) -> torch.Tensor:
        """Mean-pooled sentence vectors, or (NAIVE, ``classify``) the head's class logits."""
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = mean_pool(states, attention_mask)
        return self.head(pooled) if classify else pooled


def build_model(cfg: SiameseConfig, num_classes: int = 0):
    from orchestrator.models import load_encoder

    encoder, tokenizer = load_encoder(cfg.model.name_or_path, add_pooling_layer=False)
    return SiameseEncoder(encoder, num_classes if cfg.mode == "naive" else 0, cfg.naive_hidden), tokenizer


# ---------------------------------------------------------------- losses
def pair_loss(u: torch.Tensor, v: torch.Tensor, y: torch.Tensor, cfg: SiameseConfig) -> torch.Tensor:
    cos = F.cosine_similarity(u, v)
    if cfg.loss == "cosine_mse":
        return F.mse_loss(cos, y)
    d = 1 - cos
    return 0.5 * (y * d.pow(2) + (1 - y) * F.relu(cfg.margin - d).pow(2)).mean()


def _tok(tokenizer, texts, cfg, device):
    enc = tokenizer([str(t) for t in texts], padding=True, truncation=True, max_length=cfg.model.max_length,
                    return_tensors="pt", return_token_type_ids=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def compute_loss(model, tokenizer, batch: dict, cfg: SiameseConfig, classes: list[str] | None = None,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, dict[str, float]]:
    if cfg.mode == "naive":
        logits = model(*_tok(tokenizer, batch["text"], cfg, device), classify=True)
        index = {c: i for i, c in enumerate(classes or [])}
        y = torch.tensor([index[str(c)] for c in batch["label"]], device=device)
        loss = F.cross_entropy(logits, y)
        return loss, {"loss": float(loss.detach())}
    n = len(batch["text_a"])
    both = model(*_tok(tokenizer, list(batch["text_a"]) + list(batch["text_b"]), cfg, device))
    y = torch.as_tensor(np.asarray(batch["label"], dtype=np.float32), device=device)
    loss = pair_loss(both[:n], both[n:], y, cfg)
    return loss, {"loss": float(loss.detach())}


# ---------------------------------------------------------------- data: train/dev split, shards
def split_rows(rows: list[tuple[str, str]], dev_fraction: float, seed: int):
    """Deterministic train/dev split by a seeded hash of the text (a text is never in both)."""
    train, dev = [], []
    for text, label in rows:
        h = int(hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (dev if h < dev_fraction else train).append((text, label))
    return train, dev


def classes_of(cfg: SiameseConfig) -> list[str]:
    train, _ = split_rows(cfg.train_sets[0].rows(), cfg.dev_fraction, cfg.train.seed)
    return sorted({y for _, y in train})


def prepare_data(cfg: SiameseConfig, progress: bool = True) -> str:
    """SIAMESE: pair episodes from the train part of every train set (Ray Data). NAIVE: the
    train part as (text, label) shards."""
    from orchestrator.data.episodes import prepare_episodes
    from orchestrator.data.labelled import rows_to_shards

    parts = {s.name: split_rows(s.rows(), cfg.dev_fraction, cfg.train.seed)[0] for s in cfg.train_sets}
    if cfg.mode == "siamese":
        return prepare_episodes(parts, cfg.n_pairs, cfg.run.storage, seed=cfg.train.seed)
    return rows_to_shards(next(iter(parts.values())), cfg.run.storage, source=cfg.train_sets[0].path)


# ---------------------------------------------------------------- evaluation: Δ cosine distance, MAP
def embed(encoder: nn.Module, tokenizer, texts: list[str], max_length: int, batch_size: int) -> np.ndarray:
    from orchestrator.evaluation.encode import HFEncoder

    return HFEncoder(encoder, tokenizer, pooling="mean", batch_size=batch_size, max_length=max_length).encode(texts)


def delta_cosine_distance(emb: np.ndarray, labels: list[str], n_pairs: int, seed: int = 0, name: str = "test") -> dict:
    """Δ = mean cosine distance of different-class pairs − that of same-class pairs (n of each)."""
    from orchestrator.data.episodes import ClassIndex

    ix = ClassIndex.build(name, list(zip(range(len(labels)), labels, strict=True)))
    unit = emb / np.clip(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12, None)
    same, diff = [], []
    for k in range(2 * n_pairs):
        a, b, y = ix.pair(k, seed)
        a, b = int(ix.texts[a]), int(ix.texts[b])
        (same if y else diff).append(1.0 - float(unit[a] @ unit[b]))
    return {"delta": float(np.mean(diff) - np.mean(same)), "same_distance": float(np.mean(same)),
            "different_distance": float(np.mean(diff))}


def same_class_map(emb: np.ndarray, labels: list[str], max_queries: int = 1000, seed: int = 0) -> float:
    """Mean average precision of same-class neighbours (each query ranks every other text)."""
    from orchestrator.evaluation.domain import average_precision

    unit = emb / np.clip(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12, None)
    lab = np.array(labels)
    queries = np.random.default_rng(seed).permutation(len(lab))[:max_queries]
    aps = []
    for q in queries:
        others = np.arange(len(lab)) != q
        rel = (lab[others] == lab[q]).astype(int)
        if rel.sum():
            aps.append(average_precision(unit[others] @ unit[q], rel))
    return float(np.mean(aps))


def evaluate_sets(encoder, tokenizer, sets: list[LabelledSet], cfg: SiameseConfig) -> dict[str, float]:
    out = {}
    for s in sets:
        rows = s.rows()
        emb = embed(encoder, tokenizer, [t for t, _ in rows], cfg.model.max_length, cfg.eval_batch_size)
        labels = [y for _, y in rows]
        d = delta_cosine_distance(emb, labels, cfg.eval_pairs, seed=0, name=s.name)
        out[f"{s.name}_delta"] = d["delta"]
        out[f"{s.name}_map"] = same_class_map(emb, labels)
    return out


def dev_sets(cfg: SiameseConfig) -> dict[str, list[tuple[str, str]]]:
    """The held-out part of every train set (read once per run, not per evaluation)."""
    return {s.name: split_rows(s.rows(), cfg.dev_fraction, cfg.train.seed)[1] for s in cfg.train_sets}


def dev_delta(encoder, tokenizer, cfg: SiameseConfig, sets: dict | None = None) -> float:
    deltas = []
    for name, dev in (sets or dev_sets(cfg)).items():
        emb = embed(encoder, tokenizer, [t for t, _ in dev], cfg.model.max_length, cfg.eval_batch_size)
        deltas.append(delta_cosine_distance(emb, [y for _, y in dev], min(1000, cfg.eval_pairs), name=name)["delta"])
    return float(np.mean(deltas))


def evaluate(cfg: SiameseConfig, model_dir, tasks: list[str] | None = None):
    """Δ cosine distance and same-class MAP on every test set; headline = mean Δ."""
    from orchestrator.evaluation.suite import TestReport
    from orchestrator.models import load_encoder

    model, tok = load_encoder(str(model_dir), add_pooling_layer=False)
    metrics = evaluate_sets(model, tok, cfg.test_sets, cfg)
    deltas = [v for k, v in metrics.items() if k.endswith("_delta")]
    metrics["delta_mean"] = float(np.mean(deltas)) if deltas else float("nan")
    rows = ["| test set | Δ cos distance ×100 | same-class MAP ×100 |", "|---|---:|---:|"]
    rows += [f"| {s.name} | {metrics[f'{s.name}_delta'] * 100:.2f} | {metrics[f'{s.name}_map'] * 100:.2f} |"
             for s in cfg.test_sets]
    return TestReport("Δ cosine distance and same-class MAP", metrics, "delta_mean", "\n".join(rows),
                      {"siamese": metrics})


# ---------------------------------------------------------------- the per-worker loop (Ray Train)
def train_func(config: dict) -> list[dict]:
    cfg = SiameseConfig.model_validate(config["method_config"])
    common.setup_worker(cfg.train.seed, threads=int(cfg.scaling.cpus_per_worker))
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.scaling.use_gpu else "cpu")
    classes = classes_of(cfg) if cfg.mode == "naive" else None
    module, tokenizer = build_model(cfg, len(classes or []))
    module.to(device)
    stepper = common.make_stepper(module, cfg, int(config["rows_per_worker"]))
    dev = dev_sets(cfg)
    return common.train_loop(
        cfg, stepper, rows_per_worker=int(config["rows_per_worker"]), metric="dev_delta",
        loss_fn=lambda batch, state: compute_loss(stepper.model, tokenizer, batch, cfg, classes, device),
        dev_fn=lambda m: dev_delta(m.encoder, tokenizer, cfg, dev),
        build_plain=lambda: build_model(cfg, len(classes or []))[0].to(device))


# ---------------------------------------------------------------- export
def export_model(cfg: SiameseConfig, checkpoint_dir, out_dir):
    """The encoder alone with mean pooling (NAIVE's classification head is discarded)."""
    from orchestrator.export import export_encoder

    classes = classes_of(cfg) if cfg.mode == "naive" else []
    module, tokenizer = build_model(cfg, len(classes))
    module.load_state_dict(common.load_module_state(checkpoint_dir))
    return export_encoder(module.encoder, tokenizer, out_dir, pooling="mean", max_seq_length=cfg.model.max_length)
