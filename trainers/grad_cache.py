"""Cached gradients (GradCache): a contrastive loss over a large batch on the memory of a small one.

Method (Gao, Zhang, Han, Callan. Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup. RepL4NLP 2021; sentence-transformers' CachedMultipleNegativesRankingLoss)
-----------------------------------------------------------------------------------------------------
An in-batch contrastive loss L couples every embedding of the batch, so its graph holds every
sequence's activations at once. But L depends on the encoder's parameters θ only through the
embeddings e_1 … e_B, so by the chain rule

    ∂L/∂θ = Σ_i (∂L/∂e_i) · ∂e_i/∂θ

and the two factors can be computed apart:

1. **Embed without a graph.** Encode the batch in mini-batches of ``mini_batch`` sequences under
   ``torch.no_grad()``; keep only the embeddings (B × d), and each mini-batch's RNG state before it ran.
2. **Loss and its gradient on the embeddings.** Treat the embeddings as a leaf, gather them across
   workers (differentiably, as the uncached step does), compute L over the global batch and backpropagate
   to the leaf: g_i = ∂L/∂e_i. This graph is B × d, not B × activations.
3. **Re-encode with a graph, one mini-batch at a time**, with the RNG state it had in step 1, and
   backpropagate the surrogate Σ_i e_i · g_i (its gradient with respect to θ is exactly the sum above).
   Each mini-batch's graph is freed before the next is built.

**Dropout must draw the same masks in both passes**: SimCSE's positives *are* dropout, and a different
mask in step 3 would backpropagate g_i through an embedding that is not e_i. Step 3 restores each
mini-batch's CPU (and CUDA) RNG state first; afterwards the generators stand where step 1 left them,
so the next step - and a checkpoint's saved RNG state - are those of the run without the replay.

The parameter gradient equals the uncached step's whose forward draws its dropout masks in the same
mini-batches (to float rounding; with dropout off, the one-forward step's). ``tests/test_grad_cache.py``
proves it on one worker, on two workers with gathered negatives, and under DeepSpeed ZeRO-2 and ZeRO-3, and that
the same step without the RNG restore differs.

Distributed: under DDP every mini-batch but the last re-encodes inside ``no_sync()``, so the gradient is
all-reduced once per step; under DeepSpeed every mini-batch but the last is marked as inside a
gradient-accumulation window, so the engine reduces and steps once. The cost: one extra forward (about
a third of a step's compute).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

# The encoder call: (input_ids, attention_mask) of a mini-batch → its embeddings (rows × d).
Encode = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rng_snapshot(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def rng_restore(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class CachedEmbeddings:
    """Step 1: a batch's embeddings, encoded in mini-batches without a graph.

    ``embeddings`` is a leaf that requires grad: build the loss on it (gather it, split it into views)
    and return ``CachedLoss(loss, self)`` instead of the loss.
    """

    def __init__(
        self,
        encode: Encode,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mini_batch: int,
        restore_rng: bool = True,
    ):
        self.encode, self.mini_batch, self.restore_rng = encode, mini_batch, restore_rng
        self.input_ids, self.attention_mask = input_ids, attention_mask
        self.device = input_ids.device
        kind = self.device.type  # the replay runs under the autocast this pass runs under (the loop's)
        self.autocast = {
            "device_type": kind,
            "enabled": torch.is_autocast_enabled(kind),
            "dtype": torch.get_autocast_dtype(kind),
        }
        self.states, chunks = [], []
        with torch.no_grad():
            for ids, mask in self.chunks():
                self.states.append(rng_snapshot(self.device))
                chunks.append(encode(ids, mask))
        self.after = rng_snapshot(self.device)
        self.embeddings = torch.cat(chunks).detach().requires_grad_(True)

    def chunks(self):
        n = self.input_ids.size(0)
        for start in range(0, n, self.mini_batch):
            yield (
                self.input_ids[start : start + self.mini_batch],
                self.attention_mask[start : start + self.mini_batch],
            )

    def replay(self, backward: Callable[[torch.Tensor, bool], None], *, no_sync=nullcontext) -> None:
        """Step 3: re-encode each mini-batch with a graph (its step-1 RNG state and autocast restored) and
        hand ``backward`` the surrogate Σ e_i · g_i and whether it is the last mini-batch. ``no_sync()``
        wraps every mini-batch but the last (DDP: no all-reduce)."""
        grad = self.embeddings.grad
        if grad is None:
            raise RuntimeError("CachedEmbeddings.replay before the loss's backward reached the embeddings")
        chunks = list(self.chunks())
        start = 0
        for i, (ids, mask) in enumerate(chunks):
            last = i == len(chunks) - 1
            if self.restore_rng:
                rng_restore(self.states[i], self.device)
            with no_sync() if not last else nullcontext():
                with torch.autocast(**self.autocast):
                    emb = self.encode(ids, mask)
                g = grad[start : start + emb.size(0)]
                start += emb.size(0)
                backward((emb.float() * g.float()).sum(), last)
        if self.restore_rng:
            rng_restore(self.after, self.device)  # the generators as the graph-free pass left them


class CachedLoss:
    """A loss built on :class:`CachedEmbeddings`: what a recipe's ``loss`` hook returns when
    ``train.grad_cache`` is set. :class:`trainers.common.Stepper` runs its backward in two stages."""

    def __init__(self, loss: torch.Tensor, cache: CachedEmbeddings):
        self.loss, self.cache = loss, cache

    def detach(self) -> torch.Tensor:
        return self.loss.detach()

    def backward(self, backward: Callable[[torch.Tensor, bool], None], *, no_sync=nullcontext) -> None:
        """Step 2 (the loss's gradient on the embeddings; under gathered negatives a collective every
        worker joins), then step 3."""
        self.loss.backward()
        self.cache.replay(backward, no_sync=no_sync)


def encode(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cfg
) -> tuple[torch.Tensor, CachedEmbeddings | None]:
    """A batch's embeddings for a contrastive loss: one forward with its graph, or - under ``train.grad_cache`` -
    GradCache's graph-free mini-batches (the loss is then returned as ``CachedLoss(loss, cache)``)."""
    if cfg.train.grad_cache:
        cache = CachedEmbeddings(model, input_ids, attention_mask, cfg.train.grad_cache.mini_batch)
        return cache.embeddings, cache
    return model(input_ids, attention_mask), None
