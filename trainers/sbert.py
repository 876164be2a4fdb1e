"""SBERT: supervised fine-tuning of a sentence encoder on pairs with a graded similarity.

Method (Reimers & Gurevych 2019, Section 3, the regression objective; the supervised stage of TSDAE's
domain adaptation, Wang et al. 2021, whose released ``TSDAE-<domain>2nli_stsb`` models finish on STS-B this way)
-----------------------------------------------------------------------------------------------------------
Each pair (a, b) with a gold score s ∈ [0, s_max] (STS-B: 0-5) goes through **one** encoder; the configured
pooling (``model.pooling``; the folder's own for MiniLM: mean) gives u and v, and the cosine similarity is
regressed onto the scaled score - sentence-transformers' ``CosineSimilarityLoss``:

    L = 1/B Σ ( cos(u_i, v_i) − s_i / s_max )²

The run is read and tested as TSDAE (:data:`trainers.protocol.DOMAIN`: the domain tasks - TwitterPara AP
first, the headline - then the STS tasks; fixed steps and the last checkpoint, an optional labelled dev set),
so ``jobs/compare.py`` can set "SBERT from the base" against "SBERT from an in-domain TSDAE model" (a compare
arm's ``start``) on one test. The STS-B test set is one of the STS tasks: training on STS-B train makes that
column in-domain for this method.

Args (config keys, see :class:`SBERTConfig`)
    train_pairs: the scored pairs (path, text_a_column, text_b_column, score_column, score_max)

Paper settings (``configs/sbert/paper.yaml``): sentence-transformers' ``training_stsbenchmark.py`` - batch 16,
lr 2e-5 with 10% linear warm-up then linear decay, 4 epochs, weight decay 0.01, max length 128 (the
release's NLI stage before it is not run here: no NLI data ships with Sieve, ``docs/FIDELITY.md``).

Example
    python jobs/train.py --method sbert --preset smoke
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.config import EncoderMethodConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.labelled import ScoredPairs, table_to_shards
from trainers import common
from trainers.encoder import PooledEncoder, build_pooled_encoder, tokenize_texts
from trainers.protocol import DOMAIN, DomainEval
from trainers.recipe import Recipe


# ---------------------------------------------------------------- config
class SBERTConfig(EncoderMethodConfig):
    method: Literal["sbert"] = "sbert"
    model: ModelConfig = ModelConfig(max_length=128)
    default_pooling: ClassVar[str] = "mean"  # SBERT's
    train_pairs: ScoredPairs = ScoredPairs(path="data/sts/stsb-train.tsv")
    train: TrainLoopConfig = TrainLoopConfig(lr=2e-5, batch_size=16, weight_decay=0.01, eval_steps=1000)
    eval: DomainEval = DomainEval()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="sbert")

    def data_sources(self) -> list[tuple[str, str]]:
        extra = [("eval.dev_path", self.eval.dev_path)] if self.eval.dev_path else []
        return [("train_pairs.path", self.train_pairs.path), *extra, *self.eval_sources()]

    def check_data(self) -> None:
        """The pairs read whole (STS-B train: 5,749 rows): a wrong column or a bad score fails here, with its line."""
        self.train_pairs.rows()


# ---------------------------------------------------------------- model: one encoder, pooled (both branches)
build_model = build_pooled_encoder


# ---------------------------------------------------------------- the loss
def compute_loss(
    model: PooledEncoder, tokenizer, batch: dict, cfg: SBERTConfig, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, dict[str, float]]:
    """Both sides of every pair in one forward pass; the MSE between their cosine and the scaled gold score."""
    n = len(batch["text_a"])
    both = model(*tokenize_texts(tokenizer, [*batch["text_a"], *batch["text_b"]], cfg, device))
    target = torch.as_tensor([float(y) for y in batch["label"]], dtype=both.dtype, device=device)
    loss = F.mse_loss(F.cosine_similarity(both[:n], both[n:]), target)
    return loss, {"loss": float(loss.detach())}


# ---------------------------------------------------------------- data
def prepare_data(cfg: SBERTConfig, progress: bool = True) -> str:
    """The scored pairs as shards (text_a, text_b, label = score / score_max), written once per storage."""
    rows = cfg.train_pairs.rows()
    table = {
        "text_a": [a for a, _, _ in rows],
        "text_b": [b for _, b, _ in rows],
        "label": [y for *_, y in rows],
    }
    return table_to_shards(table, cfg.run.storage, source=cfg.train_pairs.path)


# ---------------------------------------------------------------- export
def export_model(cfg: SBERTConfig, checkpoint_dir, out_dir):
    """Checkpoint → the encoder with its pooling."""
    return common.export_trained_encoder(build_model, cfg, checkpoint_dir, out_dir)


# ---------------------------------------------------------------- the recipe
class SBERTRecipe(Recipe):
    """Trained on scored pairs; read, selected and tested as TSDAE is (the domain protocol)."""

    name = "sbert"
    title = "SBERT (supervised scored pairs: TSDAE's supervised stage)"
    runs_with = "`jobs/train.py --method sbert`; `jobs/compare.py` after a TSDAE `start` stage"
    config_cls = SBERTConfig
    protocol = DOMAIN
    columns = ("text_a", "text_b", "label")

    def build(self) -> nn.Module:
        module, self.tokenizer = build_model(self.cfg)
        return module

    def loss(self, model, batch, state):
        return compute_loss(model, self.tokenizer, batch, self.cfg, self.device)

    prepare_data = staticmethod(prepare_data)
    export = staticmethod(export_model)

    @classmethod
    def training_data(cls, cfg):
        return {"train_pairs": cfg.train_pairs.model_dump(mode="json")}
