"""The encoder base the pooled-encoder recipes compose: a Hugging Face encoder with its pooling, and a batch
of sentences tokenised for it. The export (the ``.encoder`` saved alone with the config's pooling) is
:func:`trainers.checkpoint.export_trained_encoder`; how a run is read is :mod:`trainers.protocol`."""

from __future__ import annotations

import torch
from torch import nn

from orchestrator.evaluation.encode import mean_pool, test_time_pooling
from orchestrator.models import load_encoder, pooling_for
from trainers import common


class PooledEncoder(nn.Module):
    """Sentence vectors: the encoder's last hidden states pooled (``mean`` over real tokens, else ``[CLS]``)."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean"):
        super().__init__()
        self.encoder = encoder
        self.pooling = test_time_pooling(pooling)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(states, attention_mask) if self.pooling == "mean" else states[:, 0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids, attention_mask)


def build_pooled_encoder(cfg) -> tuple[PooledEncoder, object]:
    """The config's model folder as a :class:`PooledEncoder` with the config's pooling, and its tokenizer."""
    encoder, tokenizer = load_encoder(
        cfg.model.name_or_path, add_pooling_layer=False, attention=cfg.perf.attention
    )
    return PooledEncoder(encoder, pooling_for(cfg)), tokenizer


def tokenize_texts(tokenizer, texts, cfg, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of ``texts``, padded to the batch's longest, cut at ``model.max_length``, on
    ``device`` as every batch goes there (:func:`trainers.common.to_device`: pinned, non-blocking on a GPU)."""
    enc = tokenizer(
        [str(t) for t in texts],
        padding=True,
        truncation=True,
        max_length=cfg.model.max_length,
        return_tensors="pt",
        return_token_type_ids=False,
    )
    return common.to_device(enc["input_ids"], device, cfg), common.to_device(
        enc["attention_mask"], device, cfg
    )
