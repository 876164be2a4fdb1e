"""MLM: masked-language-model adaptation of a sentence encoder on in-domain text.

Method (Devlin et al. 2019, Section 3.1; the unsupervised baseline TSDAE's paper compares, run with its
authors' script ``sentence-transformers/examples/unsupervised_learning/MLM/train_mlm.py``)
-------------------------------------------------------------------------------------------------
Each sentence is tokenized (WordPiece). Whole words are chosen in a random order until they cover
round(p·n) of the sentence's n real tokens (p = 0.15; at least one token; a word that would overshoot
is skipped - ``transformers``' whole-word-mask collator); ``whole_word_mask: false`` chooses single
tokens the same way. Of the chosen tokens, 80% become ``[MASK]``, 10% a random token of the vocabulary
and 10% stay. An MLM head - BERT's transform (dense, GELU, LayerNorm) and the word-embedding matrix
(tied) with a bias - predicts every chosen token's original id from the encoder's state there:

    L = −1/|M| Σ_{i∈M} log P(x_i | x̃)          (M: the chosen positions)

Special tokens and padding are never chosen. After training the head is thrown away and the encoder
is read with the configured pooling (``model.pooling``; the folder's own for MiniLM: mean). The head's
weights are loaded from the model folder when it ships them (``cls.predictions.*``, a BERT MLM
checkpoint); MiniLM ships none, so the head starts new.

The run is read and tested exactly as TSDAE is (:data:`trainers.protocol.DOMAIN`: the domain tasks
+ the STS tasks, the paper's protocol of fixed steps and the last checkpoint, an optional labelled dev
set), so ``jobs/compare.py`` can set MLM and TSDAE arms side by side on the same base and text.

Args (config keys, see :class:`MLMConfig`)
    mask_ratio: p (0.15);  whole_word_mask: choose whole words (true, as the reference script)

Paper settings (``configs/mlm/paper.yaml``): the reference script's - batch 64, lr 5e-5 with linear
decay (``transformers.Trainer``'s defaults), max length 100, whole-word masking at 0.15.

Example
    python jobs/train.py --method mlm --preset smoke
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from safetensors import safe_open
from torch import nn

from orchestrator.config import EncoderMethodConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.training_corpus import CorpusBlock, prepare_corpus
from orchestrator.models import load_encoder, resolve_model_source
from trainers import common
from trainers.encoder import tokenize_texts
from trainers.protocol import DOMAIN, DomainEval
from trainers.recipe import Recipe

IGNORE = -100  # label of a position that carries no loss


# ---------------------------------------------------------------- config
class MLMConfig(EncoderMethodConfig):
    method: Literal["mlm"] = "mlm"
    model: ModelConfig = ModelConfig(max_length=100)
    default_pooling: ClassVar[str] = "mean"
    mask_ratio: float = Field(0.15, gt=0, lt=1)
    whole_word_mask: bool = True
    train: TrainLoopConfig = TrainLoopConfig(lr=5e-5, batch_size=64, eval_steps=1000)
    data: CorpusBlock = CorpusBlock()
    eval: DomainEval = DomainEval()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="mlm")

    def data_sources(self) -> list[tuple[str, str]]:
        extra = [("eval.dev_path", self.eval.dev_path)] if self.eval.dev_path else []
        return [*self.data.sources(), *extra, *self.eval_sources()]

    def check_data(self) -> None:
        self.data.check()

    @model_validator(mode="after")
    def _best_needs_a_dev_set(self):
        if self.eval.select == "best" and self.eval.dev is None:
            raise ValueError("eval.select 'best' needs a labelled dev set (eval.dev); the protocol is 'last'")
        return self


# ---------------------------------------------------------------- model
class MaskedLM(nn.Module):
    """The encoder + BERT's MLM head; the output matrix is the encoder's word embeddings (one tensor)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        d, vocab = encoder.config.hidden_size, encoder.config.vocab_size
        self.transform = nn.Sequential(
            nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d, eps=encoder.config.layer_norm_eps)
        )
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """Mean cross-entropy over the chosen positions (``labels`` ≠ -100); only they reach the vocabulary."""
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        chosen = labels != IGNORE
        logits = F.linear(
            self.transform(states[chosen]), self.encoder.get_input_embeddings().weight, self.bias
        )
        return F.cross_entropy(logits, labels[chosen])


HEAD_KEYS = {
    "cls.predictions.transform.dense.weight": "transform.0.weight",
    "cls.predictions.transform.dense.bias": "transform.0.bias",
    "cls.predictions.transform.LayerNorm.weight": "transform.2.weight",
    "cls.predictions.transform.LayerNorm.bias": "transform.2.bias",
    "cls.predictions.bias": "bias",
}


def load_head(model: MaskedLM, folder: Path) -> bool:
    """The folder's own MLM head weights, when its ``model.safetensors`` has them. Returns whether it did."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return False
    with safe_open(str(weights), framework="pt") as f:
        keys = set(f.keys())
        if not set(HEAD_KEYS) <= keys:
            return False
        model.load_state_dict(
            {ours: f.get_tensor(theirs) for theirs, ours in HEAD_KEYS.items()}, strict=False
        )
    return True


def build_model(cfg: MLMConfig):
    encoder, tokenizer = load_encoder(
        cfg.model.name_or_path, add_pooling_layer=False, attention=cfg.perf.attention
    )
    model = MaskedLM(encoder)
    load_head(model, resolve_model_source(cfg.model.name_or_path))
    return model, tokenizer


# ---------------------------------------------------------------- the masking
def choose_positions(
    ids: list[int], special: set[int], ratio: float, whole_words: bool, is_piece, rng: random.Random
) -> list[int]:
    """The positions to predict: whole words (a word's first token and the ``##`` pieces after it) in a
    random order until they cover round(ratio·n) real tokens (at least 1); a word that would overshoot is
    skipped."""
    words: list[list[int]] = []
    for i, t in enumerate(ids):
        if t in special:
            continue
        if whole_words and words and is_piece(t) and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    budget = max(1, round(sum(map(len, words)) * ratio))
    rng.shuffle(words)
    chosen: list[int] = []
    for w in words:
        if len(chosen) >= budget:
            break
        if len(chosen) + len(w) <= budget:
            chosen += w
    return sorted(chosen)


def mask_batch(tokenizer, texts: list[str], cfg: MLMConfig, rng: random.Random) -> dict[str, torch.Tensor]:
    """input_ids with the chosen tokens replaced 80/10/10, attention_mask, labels (-100 where not chosen)."""
    ids, mask = tokenize_texts(tokenizer, texts, cfg, "cpu")
    labels = torch.full_like(ids, IGNORE)
    special = set(tokenizer.all_special_ids)
    pieces = {i for t, i in tokenizer.get_vocab().items() if t.startswith("##")}
    for row in range(ids.size(0)):
        for pos in choose_positions(
            ids[row].tolist(), special, cfg.mask_ratio, cfg.whole_word_mask, pieces.__contains__, rng
        ):
            labels[row, pos] = ids[row, pos]
            draw = rng.random()
            if draw < 0.8:
                ids[row, pos] = tokenizer.mask_token_id
            elif draw < 0.9:
                ids[row, pos] = rng.randrange(len(tokenizer))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def batch_rng(seed: int, epoch: int, step: int) -> random.Random:
    """A new draw every epoch and step, per worker, reproducible on resume."""
    return random.Random(f"mlm:{seed}:{common.rank()}:{epoch}:{step}")


def compute_loss(
    model: nn.Module, tokenizer, texts, cfg: MLMConfig, rng: random.Random, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, dict[str, float]]:
    b = mask_batch(tokenizer, texts, cfg, rng)
    loss = model(*(common.to_device(b[k], device, cfg) for k in ("input_ids", "attention_mask", "labels")))
    return loss, {"loss": float(loss.detach()), "masked_tokens": float((b["labels"] != IGNORE).sum())}


# ---------------------------------------------------------------- export
def export_model(cfg: MLMConfig, checkpoint_dir, out_dir):
    """Checkpoint → the encoder alone (the head is discarded), with the configured pooling."""
    return common.export_trained_encoder(build_model, cfg, checkpoint_dir, out_dir)


# ---------------------------------------------------------------- the recipe
class MLMRecipe(Recipe):
    """Trained by masked-token prediction; read, selected and tested as TSDAE is (the domain protocol)."""

    name = "mlm"
    title = "MLM (TSDAE's unsupervised baseline)"
    runs_with = "`jobs/train.py --method mlm`; `jobs/compare.py` beside TSDAE"
    config_cls = MLMConfig
    protocol = DOMAIN
    columns = ("text",)

    def build(self) -> nn.Module:
        module, self.tokenizer = build_model(self.cfg)
        return module

    def loss(self, model, batch, state):
        rng = batch_rng(self.cfg.train.seed, state["epoch"], state["step"])
        return compute_loss(model, self.tokenizer, batch["text"], self.cfg, rng, self.device)

    prepare_data = staticmethod(prepare_corpus)
    export = staticmethod(export_model)
