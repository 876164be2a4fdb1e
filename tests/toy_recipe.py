"""A toy method: what adding one takes - this file, its test, no registry line and no doc.

Unsupervised SimCSE in a few lines: every sentence encoded twice (two dropout masks) by the pooled encoder base,
in-batch InfoNCE at temperature τ on the pair, read by SimCSE's protocol (STS-B dev, the STS tasks). Not a
method Sieve ships: ``tests/test_recipe_toy.py`` registers it, trains it 2 steps, exports and tests it."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from orchestrator.config import EncoderMethodConfig, EvalConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.training_corpus import CorpusBlock, prepare_corpus
from trainers.checkpoint import export_trained_encoder
from trainers.encoder import build_pooled_encoder, tokenize_texts
from trainers.protocol import STS_DEV
from trainers.recipe import Recipe


class ToyConfig(EncoderMethodConfig):
    method: Literal["toy"] = "toy"
    model: ModelConfig = ModelConfig(max_length=32)
    default_pooling: ClassVar[str] = "mean"
    temperature: float = 0.05
    train: TrainLoopConfig = TrainLoopConfig(lr=1e-4, batch_size=8, eval_steps=2)
    data: CorpusBlock = CorpusBlock()
    eval: EvalConfig = EvalConfig()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="toy")

    def data_sources(self) -> list[tuple[str, str]]:
        return [*self.data.sources(), *self.eval_sources()]


def info_nce(u: torch.Tensor, v: torch.Tensor, temperature: float) -> torch.Tensor:
    """The loss, from features: row i of ``u`` against every row of ``v``, its own the positive."""
    logits = F.cosine_similarity(u.unsqueeze(1), v.unsqueeze(0), dim=-1) / temperature
    return F.cross_entropy(logits, torch.arange(len(u), device=u.device))


class ToyRecipe(Recipe):
    name = "toy"
    title = "a toy SimCSE (a test's)"
    config_cls = ToyConfig
    protocol = STS_DEV
    columns = ("text",)

    def build(self):
        module, self.tokenizer = build_pooled_encoder(self.cfg)
        return module

    def loss(self, model, batch, state):
        ids, mask = tokenize_texts(self.tokenizer, batch["text"], self.cfg, self.device)
        loss = info_nce(model(ids, mask), model(ids, mask), self.cfg.temperature)
        return loss, {"loss": float(loss.detach())}

    prepare_data = staticmethod(prepare_corpus)

    @staticmethod
    def export(cfg, checkpoint_dir, out_dir):
        return export_trained_encoder(build_pooled_encoder, cfg, checkpoint_dir, out_dir)
