"""ParaBART: paraphrase generation guided by the target's syntax, with an adversary that removes
syntax from the sentence embedding.

Method (Huang & Chang 2021, "Disentangling Semantics and Syntax in Sentence Embeddings with
Pre-trained Language Models", Section 3)
----------------------------------------------------------------------------------------------
A training example is a paraphrase pair (source x, target y) and the linearized constituency
parse p of y - the whole tree with its words left out, ``(S (NP (DT) (NN)) (VP (VBZ) (ADJP (JJ))) (.))``,
up to ``parse_max_length`` (160) tokens, from the corpus pipeline.

* **Semantic encoder** E_sem (a pretrained Transformer encoder) reads x with *word dropout*
  (each source token replaced by ``[MASK]`` with probability 0.2; the target and the parse are
  never dropped). The sentence embedding is the mean of its token states: ū = mean(E_sem(x)).
* **Syntax encoder** E_syn (one Transformer layer, as the reference code, with its own vocabulary
  of tags and brackets, built from the data and saved with the model) reads p: V = E_syn(p).
  ``syntax_encoder: reference`` builds it as the reference code does (LayerNorm on the embeddings, BART's
  post-norm GELU encoder layer); ``prenorm`` (ours, the presets' until rerun) is PyTorch's pre-norm ReLU layer.
* **Decoder** generates y from Concat(ū, V): its cross-attention memory is [ū; V], so the
  meaning can only come through ū and the shape through V (the paper: BART-base's first
  decoder layer). It reads E_sem's word embeddings and writes through an output projection of
  its own (``tie_output: true`` ties it to them instead), so generation does not move E_sem's
  input embeddings through the output layer. L_para = −Σ_t log P(y_t | y_<t, ū, V).
  ``syntax_guidance: false`` drops V (memory [ū] alone): with λ_adv = 0 it is the paper's
  "w/o AL and SG" ablation.
* **Syntax discriminator** D (:class:`Discriminator` below, the reference code's form): a LayerNorm
  without parameters, then a linear layer to every constituent tag, trained with a binary cross-entropy per
  tag against the *source's* bag of constituents (counts + 1, normalised): L_adv = mean_t BCE(σ(D(ū))_t, h_t).

A step's batch is ``train.batch_size`` directions of pairs (``data.row: direction``), or that many pairs, each
trained both ways (``pair``, the reference code's: the two directions' losses summed, one update).
Training alternates, each step: (1) update D alone to minimise L_adv on ū.detach(); (2) update
E_sem, E_syn and the decoder on L_para − λ_adv·L_adv with the updated D - the encoder learns to
make ū *useless* for predicting syntax. Before ``adversary_start_step`` (the reference code: the first
epoch) the adversarial term is off and D is not trained (``discriminator_warmup: idle``, the reference)
or is fitted on ū.detach() alone (``fit``: D is a real adversary when the term starts; ours, named in
``docs/FIDELITY.md``). ``discriminator_bias: prior`` (ours) starts D at the best constant guess (the first
batch's average bag); ``adversary_objective: confusion`` (ours) gives the encoder λ·BCE(D(ū), average bag). λ_adv = 0 is the "w/o adversarial loss" ablation (D is still trained, but nothing
from it reaches the encoder). Learning rates as the paper: E_sem and D at ``train.lr`` (2e-5; D's own
``lr_discriminator`` if set), E_syn, the decoder and the output projection at ``lr_syntax_decoder``
(1e-4); AdamW with weight decay 0.01 (none on biases and norms); gradients clipped at 1.0.
``freeze_encoder_steps``: E_sem is not updated for that many first steps while the new decoder parts
learn (ours: the paper starts from a pretrained BART decoder, we from new cross-attention). The
checkpoint is chosen on the paraphrase validation loss L_para alone on ``data.valid_pairs`` held-out
pairs (``selection: valid_para_loss``; the paper tunes on the generation loss, and choosing on
L_para − λ·L_adv would reward the checkpoint that fools D most), the last one (``last``), or STS-B dev
(``stsb_dev``). Every evaluation logs D's validation loss beside the loss of the best constant guess (the
average bag: D below it has learnt something) and ū's mean norm and mean pairwise cosine. D is a module
of its own, outside the main model, which runs under DDP or DeepSpeed ZeRO with one forward and one backward
per step; D's gradients are averaged across workers by hand; D and its optimiser travel in every checkpoint.

Backbones (``architecture``)
    ``bart`` with a BART folder (the paper: a copy of ``facebook/bart-base``): E_sem = BART's
    encoder, the decoder = its first ``decoder_layers`` layers. No BART weights exist on these
    machines, so the smoke preset uses ``bert2bert``: a warm start from MiniLM (E_sem = MiniLM,
    the decoder = MiniLM's first layers with cross-attention added). ``bart`` with a BERT folder
    builds BART from config in that BERT's shape, on its WordPiece vocabulary with its word and
    position embeddings copied. E_sem and the decoder read one word-embedding matrix.

E_sem with mean pooling is exported as a folder that loads with ``SentenceTransformer`` (a BART encoder in
the BlenderbotSmall encoder's form, the same network: ST would run BART's decoder); the whole model, its
vocabularies and the backbone's config (for generation) are saved beside it.

Args (config keys, see :class:`ParaBARTConfig`)
    architecture (auto), lambda_adv (0.1), adversary_start_step, discriminator (reference | softmax),
    discriminator_warmup (idle | fit), discriminator_prefit (false), prefit_epochs (100), lr_discriminator, discriminator_bias (default | prior), adversary_objective
    (reverse | confusion), freeze_encoder_steps (0), word_dropout (0.2), train.lr (2e-5: E_sem, D), lr_syntax_decoder
    (1e-4), syntax_layers (1), syntax_heads, syntax_encoder (prenorm | reference), decoder_layers (1), parse_max_length (160), model.max_length (40),
    syntax_guidance (true), tie_output (false), output_layer (embeddings | reference), selection (valid_para_loss | last | stsb_dev)

Example
    python jobs/train.py --method parabart --preset smoke
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn
from transformers import BartConfig
from transformers.models.bart.modeling_bart import BartEncoderLayer

from orchestrator import backbones
from orchestrator.config import EncoderMethodConfig, EvalConfig, ModelConfig, TrackingConfig, TrainLoopConfig
from orchestrator.data.paraphrase import (
    ParaphraseData,
    Vocab,
)
from orchestrator.evaluation.encode import mean_pool
from trainers import common
from trainers.parabart_batch import Batch, bag_targets  # noqa: F401  (bag_targets: D's targets, re-exported)


# ---------------------------------------------------------------- config
class ParaBARTConfig(EncoderMethodConfig):
    """``train.lr`` is E_sem's and D's learning rate, ``lr_syntax_decoder`` E_syn's, the decoder's and
    the output projection's (the paper's 2e-5 and 1e-4)."""

    method: Literal["parabart"] = "parabart"
    model: ModelConfig = ModelConfig(max_length=40, pooling="mean")
    default_pooling: ClassVar[str] = "mean"  # ū: the paper's mean pooling
    architecture: Literal["auto", "bert2bert", "bart"] = Field(
        "auto", description="auto: bart for a BART folder, bert2bert for a BERT folder (see build_model)"
    )
    parse_max_length: int = Field(160, gt=0)
    syntax_layers: int = Field(1, ge=1)
    syntax_heads: int = Field(6, ge=1)
    syntax_encoder: Literal["prenorm", "reference"] = Field(
        "prenorm",
        description="E_syn's form - reference: the reference code's (LayerNorm on the tag + position embeddings, "
        "dropout 0.1, BART encoder layers: post-norm, GELU); prenorm: ours so far (PyTorch's pre-norm ReLU layer "
        "straight on the embeddings)",
    )
    decoder_layers: int = Field(1, ge=1)
    lambda_adv: float = Field(0.1, ge=0)
    adversary_start_step: int = Field(
        0, ge=0, description="steps of plain L_para before the adversarial term"
    )
    discriminator: Literal["reference", "softmax"] = Field(
        "reference",
        description="reference: LayerNorm + linear, "
        "BCE per tag (the reference code); softmax: our earlier form",
    )
    discriminator_warmup: Literal["idle", "fit"] = Field(
        "idle",
        description="before adversary_start_step D is not trained (idle, the reference code) or fitted "
        "on the detached embedding (fit)",
    )
    discriminator_prefit: bool = Field(
        False,
        description="before the first step, D fitted to convergence on the untouched E_sem's ū of every training "
        "source (cached; ours: trainers/parabart_prefit.py)",
    )
    prefit_epochs: int = Field(
        100, ge=1, description="at most this many passes over the cached ū (early stop)"
    )
    lr_discriminator: float | None = Field(
        None, gt=0, description="D's learning rate (None: train.lr, the paper's)"
    )
    adversary_objective: Literal["reverse", "confusion"] = Field(
        "reverse", description="reverse: D's loss maximised (the paper); confusion: see encoder_adv_term"
    )
    discriminator_bias: Literal["default", "prior"] = Field(
        "default",
        description="D's starting bias: PyTorch's (the reference) or the first batch's average bag (prior)",
    )
    freeze_encoder_steps: int = Field(0, ge=0, description="E_sem not updated for this many first steps")
    word_dropout: float = Field(0.2, ge=0, lt=1)
    lr_syntax_decoder: float = Field(1e-4, gt=0, description="E_syn, the decoder and the output projection")
    syntax_guidance: bool = Field(True, description="false: the decoder sees ū alone (no E_syn)")
    tie_output: bool = Field(
        False, description="true: the output projection is E_sem's word-embedding matrix"
    )
    output_layer: Literal["embeddings", "reference"] = Field(
        "embeddings",
        description="reference: a fresh linear layer with bias on the decoder's states (the reference code's); "
        "embeddings: the backbone's own head, its projection a copy of the pretrained embeddings (ours so far)",
    )
    selection: Literal["valid_para_loss", "last", "stsb_dev"] = Field(
        "valid_para_loss", description="checkpoint: validation L_para (the paper), last, or STS-B dev"
    )
    train: TrainLoopConfig = TrainLoopConfig(
        lr=2e-5, weight_decay=0.01, batch_size=64, eval_steps=500, grad_clip=1.0, lr_schedule="constant"
    )
    data: ParaphraseData = ParaphraseData()
    eval: EvalConfig = EvalConfig(batch_size=128, max_length=64)
    tracking: TrackingConfig = TrackingConfig(registry_model_name="parabart")

    def data_sources(self) -> list[tuple[str, str]]:
        return [(f"data.pairs[{i}].path", p.path) for i, p in enumerate(self.data.pairs)]

    @model_validator(mode="after")
    def _prefit_reads_whole_parameters(self):
        if self.discriminator_prefit and self.deepspeed.stage == 3:
            raise ValueError(
                "discriminator_prefit encodes on one worker and needs E_sem whole: not under ZeRO-3 "
                "(deepspeed.stage=3); use stage 0-2"
            )
        return self

    @model_validator(mode="after")
    def _a_fresh_output_layer_is_not_tied(self):
        if self.output_layer == "reference" and self.tie_output:
            raise ValueError("output_layer 'reference' is a fresh layer of its own: it cannot be tie_output")
        return self

    @model_validator(mode="after")
    def _freeze_needs_a_plain_optimiser(self):
        if self.freeze_encoder_steps and self.deepspeed.stage > 0:
            raise ValueError(
                "freeze_encoder_steps works with the plain / DDP optimiser only, not under DeepSpeed "
                f"ZeRO (deepspeed.stage={self.deepspeed.stage})"
            )
        return self


# ---------------------------------------------------------------- model
class ParaBART(nn.Module):
    """E_sem + E_syn + decoder: what generates, and (E_sem) what embeds. D (:func:`discriminator`), used in
    training only, is a module of its own: the main model runs under DDP / ZeRO with one backward a step."""

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        syntax: Vocab,
        tags: Vocab,
        *,
        syntax_layers: int = 1,
        syntax_heads: int = 6,
        parse_max_length: int = 160,
        syntax_guidance: bool = True,
        syntax_encoder: str = "prenorm",
    ):
        super().__init__()
        d = encoder.config.hidden_size
        self.syntax_vocab, self.tag_vocab = syntax, tags  # travel in the state dict (extra state)
        self.pretrained: set[str] = set()  # names of parameters loaded from pretrained weights
        self.sem = encoder  # E_sem
        self.syntax_guidance, self.syntax_encoder = syntax_guidance, syntax_encoder
        if syntax_guidance:  # without it E_syn does not exist (DDP refuses parameters that get no gradient)
            self.syn_embed = nn.Embedding(len(syntax), d, padding_idx=0)  # E_syn
            self.syn_pos = nn.Embedding(parse_max_length, d)
            if syntax_encoder == "reference":
                self.syn_norm = nn.LayerNorm(d)  # the reference's synt_layernorm_embedding
                self.syn = nn.ModuleList(
                    BartEncoderLayer(syntax_layer_config(d, syntax_heads)) for _ in range(syntax_layers)
                )
                for emb in (self.syn_embed, self.syn_pos):  # BART's init_std, the padding row zero
                    nn.init.normal_(emb.weight, std=0.02)
                with torch.no_grad():
                    self.syn_embed.weight[0].zero_()
            else:
                layer = nn.TransformerEncoderLayer(
                    d, syntax_heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True
                )
                self.syn = nn.TransformerEncoder(layer, syntax_layers, enable_nested_tensor=False)
        self.decoder = decoder  # a *ForCausalLM / *LMHeadModel with cross-attention

    @property
    def hidden_size(self) -> int:
        return self.sem.config.hidden_size

    def get_extra_state(self) -> dict:
        return {"syntax": self.syntax_vocab.items, "tags": self.tag_vocab.items}

    def set_extra_state(self, state: dict) -> None:
        self.syntax_vocab, self.tag_vocab = Vocab(state["syntax"]), Vocab(state["tags"])

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ū: mean of E_sem's token states (the sentence embedding)."""
        return mean_pool(self.sem(input_ids=ids, attention_mask=mask).last_hidden_state, mask)

    def syntax(self, parse_ids: torch.Tensor, parse_mask: torch.Tensor) -> torch.Tensor:
        """V = E_syn(p), or an empty sequence without syntax guidance."""
        if not self.syntax_guidance:
            return parse_ids.new_zeros((parse_ids.size(0), 0, self.hidden_size), dtype=torch.float)
        pos = torch.arange(parse_ids.size(1), device=parse_ids.device)
        x = self.syn_embed(parse_ids) + self.syn_pos(pos)
        if self.syntax_encoder != "reference":
            return self.syn(x, src_key_padding_mask=parse_mask == 0)
        x = F.dropout(self.syn_norm(x), p=0.1, training=self.training)
        pad = (parse_mask == 0)[:, None, None, :].expand(-1, 1, parse_mask.size(1), -1)
        bias = torch.zeros(pad.shape, dtype=x.dtype, device=x.device).masked_fill(
            pad, torch.finfo(x.dtype).min
        )
        for layer in self.syn:
            x = layer(x, bias)
        return x

    def decode(
        self,
        u: torch.Tensor,
        v: torch.Tensor,
        parse_mask: torch.Tensor,
        tgt_ids: torch.Tensor,
        tgt_mask: torch.Tensor,
        keep: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Next-token logits of the target; cross-attention over [ū; V] only (ū alone without syntax guidance).
        ``keep`` (B, T) bool: project only those positions onto the vocabulary, flattened to (kept, V); an int n:
        only the last n positions, (B, n, V)."""
        memory = torch.cat([u.unsqueeze(1), v.to(u.dtype)], dim=1)
        memory_mask = torch.cat([torch.ones_like(parse_mask[:, :1]), parse_mask[:, : v.size(1)]], dim=1)
        return self.decoder(
            input_ids=tgt_ids,
            attention_mask=tgt_mask,
            encoder_hidden_states=memory,
            encoder_attention_mask=memory_mask,
            use_cache=False,
            logits_to_keep=0 if keep is None else keep,
        ).logits

    def forward(self, src_ids, src_mask, parse_ids, parse_mask, tgt_ids, tgt_mask):
        """(logits of the target's real tokens 1.., flattened to (tokens, V); ū). Padding is never projected
        onto the vocabulary: the output projection is the largest matmul of a step, and it carries no loss."""
        u = self.embed(src_ids, src_mask)
        logits = self.decode(
            u,
            self.syntax(parse_ids, parse_mask),
            parse_mask,
            tgt_ids[:, :-1],
            tgt_mask[:, :-1],
            keep=tgt_mask[:, 1:].bool(),
        )
        return logits, u


def syntax_layer_config(d: int, heads: int) -> BartConfig:
    """One E_syn layer as the reference code builds it (BART-base's encoder layer in E_sem's width): post-norm,
    GELU, a 4×d feed-forward, dropout 0.1 on the residual branches, none on attention or activations."""
    return BartConfig(
        d_model=d,
        encoder_attention_heads=heads,
        encoder_ffn_dim=4 * d,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="gelu",
        attn_implementation="sdpa",
    )


def build_model(cfg: ParaBARTConfig, syntax: Vocab, tags: Vocab, skeleton: str | Path | None = None):
    """(ParaBART, tokenizer) for ``cfg.model`` and ``cfg.architecture`` (``orchestrator.backbones``):

    * ``bert2bert`` (BERT folder, the default): E_sem = the encoder; the decoder = its first
      ``decoder_layers`` layers with cross-attention added (new);
    * ``bart`` with a BART folder (the paper: ``facebook/bart-base`` copied to a folder or s3://):
      E_sem = BART's encoder, the decoder = BART's first ``decoder_layers`` decoder layers;
    * ``bart`` with a BERT folder: BART built from config in the BERT's shape (layers, width,
      heads), with its WordPiece vocabulary, word and position embeddings copied; the rest new.

    E_sem and the decoder read one word-embedding matrix; the output projection is the decoder's own (from the
    pretrained embeddings) unless ``tie_output``. ``skeleton``: a folder with the backbone's ``config.json`` +
    tokenizer (:func:`export_model`'s): the same architecture, no weights loaded (a state dict follows)."""
    b = backbones.build(
        cfg.model.name_or_path,
        cfg.architecture,
        decoder_layers=cfg.decoder_layers,
        skeleton=skeleton,
        tie_output=cfg.tie_output,
    )
    model = ParaBART(
        b.encoder,
        b.decoder,
        syntax,
        tags,
        syntax_layers=cfg.syntax_layers,
        syntax_heads=cfg.syntax_heads,
        parse_max_length=cfg.parse_max_length,
        syntax_guidance=cfg.syntax_guidance,
        syntax_encoder=cfg.syntax_encoder,
    )
    model.pretrained = b.pretrained
    if cfg.output_layer == "reference":
        reference_output_layer(model.decoder, model.hidden_size)
        model.pretrained = {n for n in b.pretrained if not n.startswith(("decoder.cls.", "decoder.lm_head."))}
    return model, b.tokenizer


def reference_output_layer(decoder: nn.Module, d: int) -> None:
    """The reference code's output layer in place of the backbone's head: a fresh ``nn.Linear(d, vocab)`` with
    bias straight on the decoder's states (BART's init: N(0, 0.02), bias 0) - no MLM transform, no copy of the
    pretrained embeddings."""
    head = nn.Linear(d, decoder.config.vocab_size)
    nn.init.normal_(head.weight, std=0.02)
    nn.init.zeros_(head.bias)
    if hasattr(decoder, "cls"):  # BERT's LM head model: cls = transform + projection
        decoder.cls = head
    else:  # BART's causal LM: lm_head
        decoder.lm_head = head


def parameter_groups(model: ParaBART, cfg: ParaBARTConfig) -> list[dict]:
    """The main optimiser's groups, as the paper and its reference code: E_sem at ``train.lr``, the rest (E_syn,
    the decoder, the output projection) at ``lr_syntax_decoder``; decay except on biases and norms. The word
    embeddings E_sem and the decoder share count as E_sem's (a shared tensor is yielded once, by its first name)."""
    sem = nn.Module()
    sem.add_module("sem", model.sem)
    rest = [(n, p) for n, p in model.named_parameters() if not n.startswith("sem.")]
    wd = cfg.train.weight_decay
    return [{**g, "lr": cfg.train.lr, "part": "sem"} for g in common.param_groups(sem, wd)] + [
        {**g, "lr": cfg.lr_syntax_decoder, "part": "new"} for g in common.named_param_groups(rest, wd)
    ]


def hold_encoder(optimizer: torch.optim.Optimizer, frozen: bool) -> None:
    """E_sem's groups (part ``sem``) held still while ``frozen`` (:func:`trainers.common.hold_part`)."""
    common.hold_part(optimizer, "sem", frozen)


# ---------------------------------------------------------------- the syntax discriminator D and L_adv
# In the reference code's form (uclanlp/ParaBART ``Discriminator``, ``synt_bow``, ``BCEWithLogitsLoss``).
# D reads the sentence embedding ū through a LayerNorm without parameters (so the encoder cannot fool it by
# scaling ū) and predicts, per constituent tag, the tag's share of the source's bag: the tree's counts plus
# one for every tag, normalised. ``form="softmax"`` is Sieve's earlier D (linear, softmax cross-entropy on the
# labels' shares), kept to reproduce old results.


class Discriminator(nn.Module):
    """D: ū → one logit per constituent tag (the tag vocabulary less padding and unknown).
    ``reference``: LayerNorm without parameters, then linear (the reference code's ``Discriminator``);
    ``softmax``: linear alone (the loss applies the softmax)."""

    def __init__(self, hidden_size: int, n_tags: int, form: str = "reference"):
        super().__init__()
        self.form = form
        self.norm = (
            nn.LayerNorm(hidden_size, elementwise_affine=False) if form == "reference" else nn.Identity()
        )
        self.linear = nn.Linear(hidden_size, n_tags)

    @property
    def dtype(self) -> torch.dtype:
        return self.linear.weight.dtype

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(u.to(self.dtype)))  # D stays fp32 when ZeRO runs the model in bf16


def discriminator(model: nn.Module, form: str = "reference") -> Discriminator:
    """D for a ParaBART model (``hidden_size``, ``tag_vocab``): one logit per tag, padding and unknown left out."""
    return Discriminator(model.hidden_size, len(model.tag_vocab) - 2, form)


def adv_loss(dis_logits: torch.Tensor, bags: torch.Tensor, form: str = "reference") -> torch.Tensor:
    """L_adv: ``reference``: binary cross-entropy with logits per tag, averaged over tags and the batch
    (``nn.BCEWithLogitsLoss()``); ``softmax``: −Σ_t h(t) log softmax(D(ū))_t, averaged over the batch."""
    if form == "reference":
        return F.binary_cross_entropy_with_logits(dis_logits, bags)
    return -(bags * F.log_softmax(dis_logits, dim=-1)).sum(-1).mean()


def encoder_adv_term(
    dis_logits: torch.Tensor, bags: torch.Tensor, form: str = "reference", objective: str = "reverse"
) -> torch.Tensor:
    """What the encoder adds to L_para, times λ_adv. ``reverse`` (the paper and its reference code): −L_adv,
    D's own loss maximised - unbounded above, so an encoder can win by driving every ū to where D is most
    wrong (the collapse of ``bench/results/parabart_smoke.md``). ``confusion`` (ours, Tzeng et al. 2015's
    domain confusion): D's loss against the batch's average bag, minimised - bounded below, it is lowest when
    D predicts the same bag for every sentence, i.e. when ū tells D nothing about a sentence's own syntax."""
    if objective == "reverse":
        return -adv_loss(dis_logits, bags, form)
    average = bags.mean(0, keepdim=True).expand_as(bags)
    return adv_loss(dis_logits, average, form)


def average_bag_loss(
    bags: torch.Tensor, form: str = "reference", fitted_on: torch.Tensor | None = None
) -> float:
    """The loss of the best constant guess - the average bag of ``bags`` (or of ``fitted_on``: a guess fitted on
    training bags, scored on held-out ones) - on ``bags``: a D whose loss is not below it has learnt nothing
    about a sentence's syntax from ū."""
    mean = (bags if fitted_on is None else fitted_on).mean(0, keepdim=True).clamp(1e-12, 1 - 1e-12)
    if form == "reference":
        return float(F.binary_cross_entropy(mean.expand_as(bags), bags))
    return float(-(bags * mean.log()).sum(-1).mean())


@torch.no_grad()
def set_prior_bias(dis: Discriminator, bags: torch.Tensor, across_workers: bool = True) -> None:
    """``discriminator_bias: prior``: D's bias set to the best constant guess for ``bags`` (the first training
    batch, averaged over the workers) - per tag the log-odds of its mean share (``reference``), or its log
    (``softmax``) - so D starts at the average bag's loss and learns only what ū tells about a sentence's
    syntax. From PyTorch's default bias (near 0, σ ≈ 0.5 against shares near 1/n_tags) D first spends its
    steps lowering the bias: at 1e-3 an Adam step moves it 1e-3, so 120 smoke steps never got there."""
    mean = bags.float().mean(0)
    if across_workers and common.world_size() > 1:
        torch.distributed.all_reduce(mean)
        mean /= common.world_size()
    mean = mean.clamp(1e-6, 1 - 1e-6)
    dis.linear.bias.copy_((mean / (1 - mean)).log() if dis.form == "reference" else mean.log())


def adversary_step(
    dis: Discriminator,
    opt_dis: torch.optim.Optimizer,
    u: torch.Tensor,
    bags: torch.Tensor,
    directions: int = 1,
) -> float:
    """(1) D alone minimises L_adv on ū.detach(): no gradient reaches the encoders. ``directions`` 2: a batch of
    both directions of its pairs, halves of equal size; D's loss is the sum of the halves' (the reference code's
    two backward passes before one step)."""
    opt_dis.zero_grad(set_to_none=True)
    loss = directions * adv_loss(dis(u.detach()), bags, dis.form)
    loss.backward()
    common.average_gradients(dis.parameters())
    opt_dis.step()
    return float(loss.detach())


def discriminator_optimizer(dis: nn.Module, cfg) -> torch.optim.Optimizer:
    """D's own AdamW at E_sem's learning rate (the paper's 2e-5) unless ``lr_discriminator``; the main decay."""
    return torch.optim.AdamW(
        common.param_groups(dis, cfg.train.weight_decay), lr=cfg.lr_discriminator or cfg.train.lr
    )


# ---------------------------------------------------------------- the losses (the inputs and their noise: parabart_batch.py)
def para_loss(
    logits: torch.Tensor, tgt_ids: torch.Tensor, tgt_mask: torch.Tensor, both_directions: bool = False
) -> torch.Tensor:
    """L_para: mean cross-entropy over the target's real tokens (``logits``: :meth:`ParaBART.forward`'s).
    ``both_directions``: the batch's first half is its pairs one way, the second the other way; L_para is the sum
    of the two halves' means (the reference code's para_1_2 + para_2_1)."""
    targets = tgt_ids[:, 1:][tgt_mask[:, 1:].bool()]
    if not both_directions:
        return F.cross_entropy(logits, targets)
    first = int(tgt_mask[: len(tgt_ids) // 2, 1:].sum())  # the first half's tokens come first (row order)
    return F.cross_entropy(logits[:first], targets[:first]) + F.cross_entropy(logits[first:], targets[first:])


def main_loss(
    model: nn.Module,
    dis: Discriminator,
    b: dict,
    cfg: ParaBARTConfig,
    adversary_on: bool,
    opt_dis=None,
    fit_discriminator: bool | None = None,
):
    """One step's loss for the encoders and decoder: L_para + λ·:func:`encoder_adv_term` (−L_adv, the paper's)
    once ``adversary_on``, L_para alone before. D is updated first (given ``opt_dis``) when ``fit_discriminator``
    (default: ``adversary_on``), on ū.detach() - so before the start no gradient of L_adv reaches E_sem.
    ``model``: the ParaBART module or its DDP / DeepSpeed wrapper (one forward and one backward a step). A batch
    of both directions (``data.row: pair``) sums each loss over its two halves, as the reference code's step:
    (L_para(x→y) − λ·L_adv(x)) + (L_para(y→x) − λ·L_adv(y)); the logged losses are those sums."""
    logits, u = model(
        b["src_ids"], b["src_mask"], b["parse_ids"], b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
    )
    both = bool(b.get("both_directions"))
    directions = 2 if both else 1  # halves of equal size: the sum of their mean L_adv is twice the batch's
    l_para = para_loss(logits, b["tgt_ids"], b["tgt_mask"], both)
    logs = {"loss_para": float(l_para.detach())}
    if opt_dis is not None and (adversary_on if fit_discriminator is None else fit_discriminator):
        logs["loss_dis"] = adversary_step(dis, opt_dis, u, b["bags"], directions)
    if not adversary_on:
        return l_para, {**logs, "loss": logs["loss_para"]}
    logits_dis = dis(u)
    term = directions * encoder_adv_term(logits_dis, b["bags"], dis.form, cfg.adversary_objective)
    loss = l_para + cfg.lambda_adv * term
    l_adv = directions * adv_loss(logits_dis.detach(), b["bags"], dis.form)
    return loss, {**logs, "loss_adv": float(l_adv), "loss": float(loss.detach())}
