"""A recipe's encoder as sentence-transformers' losses call a model, for the tests that compare a loss with
the library's on the same network."""

from __future__ import annotations

import torch


class AsSentenceTransformer(torch.nn.Module):
    """The recipe's encoder as sentence-transformers' losses call a model: tokenised features in, a
    ``sentence_embedding`` out (what ``MatryoshkaLoss`` cuts)."""

    def __init__(self, model, dim: int):
        super().__init__()
        self.model, self.dim = model, dim

    def forward(self, features: dict) -> dict:
        return {"sentence_embedding": self.model(features["input_ids"], features["attention_mask"])}

    def get_embedding_dimension(self) -> int:
        return self.dim
