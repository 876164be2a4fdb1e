"""TSDAE: a Transformer-based sequential denoising auto-encoder for sentence embeddings.

Method (Wang, Reimers, Gurevych 2021, Section 3)
-------------------------------------------------
Each training sentence x is corrupted by deleting words: with ratio r (0.6 in the paper) exactly
round(r·n) of its n words are removed (``orchestrator.data.augment.tsdae_noise``; at least one
word stays). The noise is resampled every epoch. The encoder maps the noisy sentence x̃ to one
fixed-size vector

    s = enc(x̃)[CLS]          (or the mean of the token states, ``model.pooling: mean``)

and a Transformer decoder reconstructs the *original* sentence token by token. The decoder is
the encoder's own architecture with cross-attention added, and its cross-attention keys and
values are **only s** - a sequence of length one - never the encoder's token states:

    L = −Σ_t log P(x_t | x_<t, s)       (cross-entropy over the WordPiece vocabulary)

so everything the decoder learns about the sentence has to pass through s. The decoder is
initialised from the encoder and, by default, **tied** to it: every weight with the same name
(embeddings, self-attention, feed-forward, layer norms) is one shared ``nn.Parameter``; only the
cross-attention and the LM head's transform are the decoder's own (the LM head's output matrix
is the shared word-embedding matrix). ``tie_encoder_decoder: false`` gives an independent
decoder (initialised from ``decoder_name_or_path`` or the encoder). After training the decoder
is thrown away and the encoder is exported with the same pooling.

Protocol (the paper's, the default): unsupervised - a fixed number of steps, the last checkpoint,
and no labelled data read before the final evaluation (``eval.dev`` empty: no dev score during
training). The training text is the 4,286 PIT-2015 *dev* sentences (TwitterPara's unlabelled train
split is not available here; their labels are never read); the final test is PIT-2015 *test* +
Twitter URL *test* (disjoint sentences, checked by a test) and the STS tasks. Tuning on a labelled
dev set is an explicit option - ``eval.dev: twitterpara_pit_dev`` (in-domain) or ``stsb_dev`` with
``eval.select: best`` - and sweeps, which must rank settings, require it; reports name it.

Args (config keys, see :class:`TSDAEConfig`)
    deletion_ratio: fraction of words *deleted* (0.6), exactly round(r·n). sentence-transformers
        says both things: its ``DenoisingAutoEncoderDataset`` keeps a word when ``rand > del_ratio``
        (del_ratio = 0.6 deletes ~60%, as the paper and here), while the example in its
        ``DenoisingAutoEncoderLoss`` docstring keeps a word when ``random() < del_ratio`` (deleting ~40%).
    model.pooling: ``cls`` (the paper; the raw ``[CLS]`` state - TSDAE has no MLP head) or ``mean``
    tie_encoder_decoder: share encoder and decoder weights (true)
    freeze_encoder_steps: a decoder warm-up (0: none, the paper) - the encoder held still for that many first
        steps while the decoder's own parts (cross-attention, the LM-head transform), which start random, learn
    eval.dev: a labelled dev set for tuning (empty by default: the paper's protocol); eval.select: last | best

Paper settings (``configs/tsdae/paper.yaml``): lr 3e-5 constant, batch 8, 100k steps.

Inputs
    Parquet shards with a ``text`` column (the corpus pipeline's output; only ``text`` is read).

Example
    python jobs/train.py --method tsdae --preset smoke
    python jobs/tsdae_sweep.py --preset smoke
"""

from __future__ import annotations

import random
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from orchestrator.backbones import causal_decoder
from orchestrator.config import EncoderMethodConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.augment import tsdae_noise
from orchestrator.data.training_corpus import CorpusBlock, prepare_corpus
from orchestrator.evaluation.encode import mean_pool, test_time_pooling
from orchestrator.models import load_encoder, pooling_for, resolve_model_source
from trainers import common
from trainers.protocol import DOMAIN, DomainEval
from trainers.recipe import Recipe


# ---------------------------------------------------------------- config
class TSDAEConfig(EncoderMethodConfig):
    method: Literal["tsdae"] = "tsdae"
    model: ModelConfig = ModelConfig(max_length=64)
    default_pooling: ClassVar[str] = "cls"  # the paper's
    deletion_ratio: float = Field(0.6, ge=0, lt=1)  # 1 would delete every word: nothing to reconstruct from
    tie_encoder_decoder: bool = True
    decoder_name_or_path: str | None = Field(
        None, description="untied decoder's start (default: the encoder)"
    )
    freeze_encoder_steps: int = Field(
        0,
        ge=0,
        description="the encoder (and the decoder weights tied to it) not "
        "updated for this many first steps, while the decoder's own parts learn",
    )
    train: TrainLoopConfig = TrainLoopConfig(lr=3e-5, batch_size=8, lr_schedule="constant", eval_steps=1000)
    data: CorpusBlock = CorpusBlock()
    eval: DomainEval = DomainEval()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="tsdae")

    def model_sources(self) -> list[str]:
        return [self.model.name_or_path, *([self.decoder_name_or_path] if self.decoder_name_or_path else [])]

    def data_sources(self) -> list[tuple[str, str]]:
        extra = [("eval.dev_path", self.eval.dev_path)] if self.eval.dev_path else []
        return [*self.data.sources(), *extra, *self.eval_sources()]

    def check_data(self) -> None:
        self.data.check()

    @model_validator(mode="after")
    def _freeze_without_zero(self):
        if self.freeze_encoder_steps and self.deepspeed.stage > 0:
            raise ValueError(
                "freeze_encoder_steps works with the plain / DDP optimiser only, not under DeepSpeed ZeRO"
            )
        return self

    @model_validator(mode="after")
    def _best_needs_a_dev_set(self):
        if self.eval.select == "best" and self.eval.dev is None:
            raise ValueError(
                "eval.select 'best' needs a labelled dev set (eval.dev); the paper's protocol is 'last'"
            )
        return self


# ---------------------------------------------------------------- model
def tie_encoder_decoder(encoder: nn.Module, decoder: nn.Module) -> int:
    """Make every decoder parameter whose name exists in the encoder *be* the encoder's parameter
    (``decoder`` is the causal LM's base model, e.g. ``BertLMHeadModel.bert``). Returns how many
    were tied; cross-attention has no encoder counterpart and stays the decoder's own."""
    enc_modules = dict(encoder.named_modules())
    tied = 0
    for name, _ in list(decoder.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        target = enc_modules.get(module_name)
        if target is not None and isinstance(getattr(target, attr, None), nn.Parameter):
            setattr(
                decoder.get_submodule(module_name) if module_name else decoder, attr, getattr(target, attr)
            )
            tied += 1
    return tied


class TSDAE(nn.Module):
    """Encoder → one sentence vector → decoder that cross-attends to that vector alone."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, pooling: str = "cls", pad_token_id: int = 0):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder  # a *ForCausalLM with add_cross_attention
        self.pooling = test_time_pooling(pooling)  # cls and cls_before_pooler: the raw [CLS] state
        self.pad_token_id = pad_token_id

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(states, attention_mask) if self.pooling == "mean" else states[:, 0]

    def decode(
        self,
        sentence: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits; the only memory the decoder sees is ``sentence`` (B, H) as a length-1 sequence.
        ``keep`` (B, T) bool: project only those positions onto the vocabulary, flattened to (kept, V)."""
        memory = sentence.unsqueeze(1)
        memory_mask = torch.ones(memory.shape[:2], dtype=attention_mask.dtype, device=memory.device)
        return self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=memory,
            encoder_attention_mask=memory_mask,
            use_cache=False,
            logits_to_keep=0 if keep is None else keep,
        ).logits

    def forward(self, noisy_ids, noisy_mask, target_ids, target_mask) -> torch.Tensor:
        """Reconstruction loss: predict target token t+1 from tokens ≤ t and the noisy sentence's vector; mean
        cross-entropy over the real tokens. Padding carries no loss, so it is never projected onto the
        vocabulary (the largest matmul of the decoder)."""
        real = target_mask[:, 1:].bool()
        logits = self.decode(
            self.encode(noisy_ids, noisy_mask), target_ids[:, :-1], target_mask[:, :-1], keep=real
        )
        return F.cross_entropy(logits, target_ids[:, 1:][real])


def build_model(cfg: TSDAEConfig):
    """(TSDAE, tokenizer): the encoder without pooler, a causal-LM decoder with cross-attention
    initialised from the encoder's folder (or ``decoder_name_or_path``), tied unless disabled."""
    encoder, tokenizer = load_encoder(
        cfg.model.name_or_path, add_pooling_layer=False, attention=cfg.perf.attention
    )
    decoder, _ = causal_decoder(resolve_model_source(cfg.decoder_name_or_path or cfg.model.name_or_path))
    if decoder.config.hidden_size != encoder.config.hidden_size:
        raise ValueError(
            f"decoder hidden size {decoder.config.hidden_size} != encoder's {encoder.config.hidden_size}"
        )
    if cfg.tie_encoder_decoder:
        if cfg.decoder_name_or_path:
            raise ValueError("decoder_name_or_path is only for tie_encoder_decoder: false")
        tie_encoder_decoder(encoder, decoder.base_model)
        decoder.get_output_embeddings().weight = encoder.get_input_embeddings().weight
    return TSDAE(encoder, decoder, pooling_for(cfg), tokenizer.pad_token_id), tokenizer


def parameter_groups(model: TSDAE, weight_decay: float) -> list[dict]:
    """AdamW groups tagged by part: the encoder's (with a tied decoder, every shared weight: a shared tensor is
    yielded once, by its first name, the encoder's) and the decoder's own (cross-attention, the LM-head
    transform), so ``freeze_encoder_steps`` can hold the first still while the second learns."""
    named = list(model.named_parameters())
    parts = {
        "encoder": [(n, p) for n, p in named if n.startswith("encoder.")],
        "decoder": [(n, p) for n, p in named if not n.startswith("encoder.")],
    }
    return common.part_groups(parts, weight_decay)


# ---------------------------------------------------------------- noise + loss
def noisy_batch(texts, ratio: float, rng: random.Random) -> list[str]:
    """Delete ``ratio`` of each sentence's whitespace-separated words."""
    return [" ".join(tsdae_noise(t.split(), ratio, rng)) for t in texts]


def compute_loss(
    model: nn.Module,
    tokenizer,
    texts,
    cfg: TSDAEConfig,
    rng: random.Random,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, dict[str, float]]:
    texts = [str(t) for t in texts]
    tok = dict(
        padding=True,
        truncation=True,
        max_length=cfg.model.max_length,
        return_tensors="pt",
        return_token_type_ids=False,
    )
    noisy = tokenizer(noisy_batch(texts, cfg.deletion_ratio, rng), **tok)
    target = tokenizer(texts, **tok)
    loss = model(
        noisy["input_ids"].to(device),
        noisy["attention_mask"].to(device),
        target["input_ids"].to(device),
        target["attention_mask"].to(device),
    )
    return loss, {"loss": float(loss.detach())}


def batch_rng(seed: int, epoch: int, step: int) -> random.Random:
    """Noise for one batch: a new draw every epoch and step, per worker, reproducible on resume."""
    return random.Random(f"tsdae:{seed}:{common.rank()}:{epoch}:{step}")


# ---------------------------------------------------------------- export
def export_model(cfg: TSDAEConfig, checkpoint_dir, out_dir):
    """Checkpoint → the encoder alone (the decoder is discarded), with the training pooling."""
    return common.export_trained_encoder(build_model, cfg, checkpoint_dir, out_dir)


# ---------------------------------------------------------------- the recipe
class TSDAERecipe(Recipe):
    name = "tsdae"
    title = "TSDAE"
    runs_with = "`jobs/tsdae_sweep.py`"
    config_cls = TSDAEConfig
    protocol = DOMAIN  # the paper's: fixed steps, the last checkpoint, nothing labelled read before the test
    columns = ("text",)

    def build(self) -> nn.Module:
        module, self.tokenizer = build_model(self.cfg)
        return module

    def optimizer_extras(self, module):
        return {"groups": parameter_groups(module, self.cfg.train.weight_decay)}

    def loss(self, model, batch, state):
        common.hold_part(
            self.stepper.optimizer, "encoder", frozen=state["step"] < self.cfg.freeze_encoder_steps
        )
        rng = batch_rng(self.cfg.train.seed, state["epoch"], state["step"])
        return compute_loss(model, self.tokenizer, batch["text"], self.cfg, rng, self.device)

    prepare_data = staticmethod(prepare_corpus)
    export = staticmethod(export_model)
