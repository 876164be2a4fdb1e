"""Batched sentence encoding with the three SentEval/SimCSE poolings.

* ``cls``: the ``[CLS]`` state passed through the model's pooler (dense + tanh), SimCSE's ``cls``;
* ``cls_before_pooler``: the raw ``[CLS]`` hidden state (SimCSE's evaluation representation);
* ``mean``: the attention-masked mean of the last hidden states (sentence-transformers' default).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from orchestrator.errors import SieveError

POOLINGS = ("cls", "cls_before_pooler", "mean")


def test_time_pooling(trained: str) -> str:
    """How a model trained with pooling ``trained`` is encoded at test time: SimCSE's ``cls`` trains
    with an MLP head over ``[CLS]`` and drops it afterwards (raw ``[CLS]``, the papers' setting)."""
    return "cls_before_pooler" if trained == "cls" else trained


test_time_pooling.__test__ = False  # not a pytest test


def mean_pool(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The attention-masked mean of token states (what ``mean`` pooling and the trainers use)."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def pool(outputs, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    last = outputs.last_hidden_state
    if pooling == "cls_before_pooler":
        return last[:, 0]
    if pooling == "cls":
        pooled = getattr(outputs, "pooler_output", None)
        if pooled is None:
            raise SieveError("pooling 'cls' needs a model with a pooler layer; use 'cls_before_pooler'")
        return pooled
    if pooling == "mean":
        return mean_pool(last, attention_mask)
    raise SieveError(f"pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")


class HFEncoder:
    """Encode sentences with a transformers encoder, batched by token count so batches pad little.

    The sentences are tokenized once to learn their lengths and encoded longest first, so each batch
    holds sentences of nearly one length. Sorting by characters instead (as sentence-transformers
    does, ``sort_by="chars"``) makes the 7 STS test sets and STS-B dev compute 1.35x the tokens that
    token order does (MiniLM's tokenizer, batch 128: ``bench/encode_order.py``); the embeddings are the
    same to float rounding (padding is masked), only the batches' shapes differ."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        pooling: str = "mean",
        batch_size: int = 64,
        max_length: int = 128,
        device: str | None = None,
        progress: bool = False,
        sort_by: str = "tokens",
    ):
        if pooling not in POOLINGS:
            raise SieveError(f"pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
        if sort_by not in ("tokens", "chars"):
            raise SieveError(f"sort_by {sort_by!r}: expected tokens or chars")
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device or next(model.parameters()).device
        self.progress = progress
        self.sort_by = sort_by

    def lengths(self, sentences: Sequence[str]) -> list[int]:
        """What each sentence's batch is sorted by: its token count after truncation (or its characters)."""
        if self.sort_by == "chars" or not sentences:
            return [len(s) for s in sentences]
        ids = self.tokenizer(
            list(sentences), truncation=True, max_length=self.max_length, add_special_tokens=True
        )["input_ids"]
        return [len(x) for x in ids]

    @torch.inference_mode()
    def encode(self, sentences: Sequence[str], desc: str = "encoding") -> np.ndarray:
        was_training = self.model.training
        self.model.eval()
        order = np.argsort([-n for n in self.lengths(sentences)], kind="stable")
        out = np.zeros((len(sentences), 0), dtype=np.float32)
        chunks = []
        starts = range(0, len(sentences), self.batch_size)
        if self.progress:
            starts = tqdm(starts, desc=desc, unit="batch", leave=False)
        for start in starts:
            idx = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [sentences[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            outputs = self.model(**batch)
            chunks.append(pool(outputs, batch["attention_mask"], self.pooling).float().cpu().numpy())
        if chunks:
            emb = np.concatenate(chunks)
            out = np.empty_like(emb)
            out[order] = emb
        self.model.train(was_training)
        return out
