"""Supervised contrastive fine-tuning on (anchor, positive[, negatives]) rows: the retrieval fine-tune.

Method (SimCSE's supervised form, Gao et al. 2021, Section 4; sentence-transformers'
``MultipleNegativesRankingLoss``, Henderson et al. 2017)
-----------------------------------------------------------------------------------------------------------
Each row gives an anchor a_i (a query, a question), its positive p_i (a relevant passage, a duplicate question)
and, optionally, k given negatives n_i1 .. n_ik (hard negatives, mined or labelled). Every text goes through
**one** encoder with the configured pooling (``model.pooling``; MiniLM's own: mean). Over the batch of B rows -
gathered across workers, so the global batch - anchor i is scored against every positive and every negative:

    L = −1/B Σ_i log  exp(cos(a_i, p_i)/τ) / Σ_j [ exp(cos(a_i, p_j)/τ) + Σ_m exp(cos(a_i, n_jm)/τ) ]

which is ``MultipleNegativesRankingLoss`` with ``scale = 1/τ`` and cosine similarity
(``tests/test_supervised_contrastive.py`` checks equality on the same inputs, one worker and two gathered).
Under ``train.grad_cache`` the batch is encoded in mini-batches and the gradient replayed (GradCache), as for
SimCSE: a large batch on bounded memory.

The run is read with the domain protocol (:data:`trainers.protocol.DOMAIN`): fixed steps and the last checkpoint,
or the best on a labelled dev set (``eval.dev``); the test reads the domain tasks first - ``qqp_retrieval``'s
nDCG@10 is the headline of the shipped presets - then the STS tasks, beside the base in the same run.

Args (config keys, see :class:`SupervisedContrastiveConfig`)
    train_pairs: the rows (path, anchor_column, positive_column, negative_columns, where) of a TSV or a parquet
        file (``jobs/mine_negatives.py`` writes one, with mined hard negatives), or a BEIR folder's training qrels
        (``format: beir``, ``split: train``) - :class:`orchestrator.data.pairs.TrainingRows`
    temperature: τ (0.05: MNRL's default scale 20)
    gather_negatives: score against the global batch (every worker's rows), not the worker's alone
    matryoshka_dims, matryoshka_weights: the loss also on the embedding's first d coordinates, summed with weights
        (``MatryoshkaLoss`` around MNRL; :mod:`trainers.matryoshka`)

Paper settings (``configs/supervised_contrastive/paper.yaml``): SimCSE's supervised BERT-base run - batch 512,
lr 5e-5, τ 0.05, max length 32, 3 epochs - on the shipped QQP duplicates instead of NLI (``docs/FIDELITY.md``).

Example
    python jobs/train.py --method supervised_contrastive --preset smoke
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from orchestrator.config import EncoderMethodConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.labelled import table_to_shards
from orchestrator.data.pairs import TrainingRows
from trainers import common
from trainers.checkpoint import export_trained_encoder
from trainers.encoder import build_pooled_encoder, tokenize_texts
from trainers.grad_cache import CachedLoss, encode
from trainers.matryoshka import MatryoshkaOption, matryoshka_sum
from trainers.protocol import DOMAIN, DomainEval
from trainers.recipe import Recipe


# ---------------------------------------------------------------- config
class SupervisedContrastiveConfig(EncoderMethodConfig, MatryoshkaOption):
    method: Literal["supervised_contrastive"] = "supervised_contrastive"
    model: ModelConfig = ModelConfig(max_length=32)
    default_pooling: ClassVar[str] = "mean"
    supports_grad_cache: ClassVar[bool] = True  # train.grad_cache: the batch encoded in mini-batches
    temperature: float = Field(0.05, gt=0)
    gather_negatives: bool = True
    train_pairs: TrainingRows = TrainingRows(
        path="data/paraphrase/qqp-train-duplicates.tsv", where={"label": ["1"]}
    )
    train: TrainLoopConfig = TrainLoopConfig(lr=5e-5, batch_size=64, eval_steps=125)
    eval: DomainEval = DomainEval(domain=["qqp_retrieval"])
    tracking: TrackingConfig = TrackingConfig(registry_model_name="supervised-contrastive")

    def data_sources(self) -> list[tuple[str, str]]:
        extra = [("eval.dev_path", self.eval.dev_path)] if self.eval.dev_path else []
        return [("train_pairs.path", self.train_pairs.path), *extra, *self.eval_sources()]

    def check_data(self) -> None:
        """The rows read whole before anything starts: a wrong column or an empty field names its line."""
        self.train_pairs.rows()
        self.check_matryoshka(self.model.name_or_path)


# ---------------------------------------------------------------- the loss, from features
def multiple_negatives_loss(
    anchors: torch.Tensor, positives: torch.Tensor, negatives: list[torch.Tensor], temperature: float
) -> torch.Tensor:
    """Row i of ``anchors`` against every positive and every negative; its own positive is the target."""
    candidates = torch.cat([positives, *negatives])
    logits = F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T / temperature
    return F.cross_entropy(logits, torch.arange(len(anchors), device=anchors.device))


def compute_loss(
    model: nn.Module,
    tokenizer,
    batch: dict,
    cfg: SupervisedContrastiveConfig,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor | CachedLoss, dict[str, float]]:
    """Every text of the batch in one forward (or GradCache's mini-batches), gathered across workers."""
    columns = ["anchor", "positive", *(f"negative_{m}" for m in range(len(cfg.train_pairs.negative_columns)))]
    n = len(batch["anchor"])
    ids, mask = tokenize_texts(tokenizer, [t for c in columns for t in batch[c]], cfg, device)
    out, cache = encode(model, ids, mask, cfg)  # under train.grad_cache: no graph, the backward re-encodes
    rows = out.view(len(columns), n, -1).transpose(0, 1)  # (row, column, dim): one gather for every column
    if cfg.gather_negatives:
        rows = common.gather_with_grad(rows.contiguous())

    def mnrl(r: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return multiple_negatives_loss(
            r[:, 0], r[:, 1], [r[:, c] for c in range(2, len(columns))], cfg.temperature
        ), {}

    loss, logs = matryoshka_sum(mnrl, rows, cfg)  # with matryoshka_dims: summed over the cut embeddings
    logs["loss"] = float(loss.detach())
    return (CachedLoss(loss, cache) if cache else loss), logs


# ---------------------------------------------------------------- data
def prepare_data(cfg: SupervisedContrastiveConfig, progress: bool = True) -> str:
    """The rows as shards (anchor, positive, negative_0 ...), written once per storage."""
    rows = cfg.train_pairs.rows()
    names = ["anchor", "positive", *(f"negative_{m}" for m in range(len(cfg.train_pairs.negative_columns)))]
    table = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    return table_to_shards(table, cfg.run.storage, source=cfg.train_pairs.path)


# ---------------------------------------------------------------- the recipe
class SupervisedContrastiveRecipe(Recipe):
    """Anchors against their positives and the batch's other texts; read by the domain protocol."""

    name = "supervised_contrastive"
    title = "Supervised contrastive (anchor, positive[, negatives]): retrieval fine-tuning"
    config_cls = SupervisedContrastiveConfig
    protocol = DOMAIN

    def build(self) -> nn.Module:
        module, self.tokenizer = build_pooled_encoder(self.cfg)
        return module

    def loss(self, model, batch, state):
        return compute_loss(model, self.tokenizer, batch, self.cfg, self.device)

    prepare_data = staticmethod(prepare_data)

    @staticmethod
    def export(cfg, checkpoint_dir, out_dir):
        return export_trained_encoder(build_pooled_encoder, cfg, checkpoint_dir, out_dir)

    @classmethod
    def training_data(cls, cfg):
        return {"train_pairs": cfg.train_pairs.model_dump(mode="json")}
