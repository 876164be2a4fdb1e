"""Matryoshka embeddings (Kusupati et al. 2022), as sentence-transformers' ``MatryoshkaLoss`` computes them.

A contrastive loss L over embeddings is summed over nested prefixes of the embedding: for each dimension d of
``matryoshka_dims`` (with weight w_d, default 1), every embedding is cut to its first d coordinates and
re-normalised, and

    L_matryoshka = Σ_d  w_d · L(embeddings[..., :d])

so the first d coordinates alone are a usable embedding: a search service stores the 64 or 128 it can afford. The
embeddings are encoded once and cut per dimension (sentence-transformers' cached forward does the same); the
gradient of every term flows back through the one encoding, also under ``train.grad_cache``. The test stage reads
every dimension (``orchestrator.evaluation.domain.evaluate_encoder``: each test figure again with ``_dim<d>``).

A recipe composes it: its config takes :class:`MatryoshkaOption`'s keys, its loss calls :func:`matryoshka_sum`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, model_validator

from orchestrator.errors import ConfigError
from orchestrator.models import load_config


class MatryoshkaOption(BaseModel):
    """``matryoshka_dims`` (empty: the loss on the whole embedding) and their weights."""

    matryoshka_dims: list[int] = Field(
        [], description="nested embedding sizes trained at once (e.g. [384, 128, 64]); empty: off"
    )
    matryoshka_weights: list[float] | None = Field(None, description="one per dimension (default: all 1)")

    @model_validator(mode="after")
    def _dims(self):
        dims, weights = self.matryoshka_dims, self.matryoshka_weights
        if any(d < 1 for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"matryoshka_dims must be distinct positive sizes: {dims}")
        if weights is not None and (
            len(weights) != len(dims) or any(w < 0 for w in weights) or not any(weights)
        ):
            raise ValueError(
                f"matryoshka_weights {weights}: one weight ≥ 0 per dimension of {dims}, at least one > 0"
            )
        return self

    def check_matryoshka(self, model: str) -> None:
        """Before any work: no dimension larger than the model's embedding (its hidden size)."""
        if self.matryoshka_dims:
            size = load_config(model).hidden_size
            if max(self.matryoshka_dims) > size:
                raise ConfigError(
                    f"matryoshka_dims: {max(self.matryoshka_dims)} is larger than the embedding of {model} ({size})"
                )

    def matryoshka(self) -> list[tuple[int, float]]:
        """(dimension, weight) pairs, largest first; empty when off."""
        weights = self.matryoshka_weights or [1.0] * len(self.matryoshka_dims)
        return sorted(zip(self.matryoshka_dims, weights, strict=True), reverse=True)


def shrink(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The first ``dim`` coordinates, re-normalised (sentence-transformers' ``shrink``)."""
    return F.normalize(t[..., :dim], p=2, dim=-1)


def matryoshka_sum(
    loss: Callable[..., tuple[torch.Tensor, dict[str, float]]], embeddings, cfg: MatryoshkaOption
) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss(embeddings)`` (a tensor or a dict of tensors; it returns (loss, logs)), or, with
    ``matryoshka_dims``, the weighted sum over the dimensions of the loss on the cut embeddings (each term logged
    as ``loss_dim<d>``). A dimension larger than the embedding is refused."""
    dims = cfg.matryoshka()
    if not dims:
        return loss(embeddings)
    full = (next(iter(embeddings.values())) if isinstance(embeddings, dict) else embeddings).size(-1)
    if dims[0][0] > full:
        raise ValueError(f"matryoshka_dims: {dims[0][0]} is larger than the embedding ({full})")
    total, logs = 0.0, {}
    for d, w in dims:
        cut = (
            {k: shrink(v, d) for k, v in embeddings.items()}
            if isinstance(embeddings, dict)
            else shrink(embeddings, d)
        )
        term, _ = loss(cut)
        total = total + w * term
        logs[f"loss_dim{d}"] = float(term.detach())
    return total, logs
