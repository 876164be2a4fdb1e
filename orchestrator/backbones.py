"""Decoders and encoder-decoder backbones built offline from one model folder (no hub download):
what TSDAE and ParaBART put beside the encoder they train.

* :func:`causal_decoder` - the folder's own architecture as a causal LM with cross-attention added,
  initialised from its weights (BERT → ``BertLMHeadModel``; the cross-attention is new): TSDAE's
  decoder, and ParaBART's ``bert2bert`` decoder with ``layers=1``.
* :func:`bert2bert` - a BERT folder as E_sem + such a decoder.
* :func:`bart` - a BART folder's encoder + its first decoder layers; or, from a BERT folder, BART
  built from config in that BERT's shape on its WordPiece vocabulary (word and position embeddings
  copied, BART's 2-row position offset kept).

Each backbone reports which parameter names came from pretrained weights (``pretrained``), read
from transformers' own loading report rather than from name patterns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    BartConfig,
    BartForCausalLM,
    BartModel,
)

from orchestrator.errors import ConfigError
from orchestrator.models import load_encoder, loading, quiet_transformers, resolve_model_source


@dataclass
class Backbone:
    encoder: nn.Module
    decoder: nn.Module  # a *ForCausalLM with cross-attention
    tokenizer: object
    pretrained: set[str] = field(default_factory=set)  # "sem.*" / "decoder.*" names loaded from weights


def causal_decoder(source: str | Path, *, layers: int | None = None, weights: bool = True):
    """(decoder, names of its newly initialised parameters): the folder's architecture as a decoder."""
    quiet_transformers()
    conf = AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    conf.is_decoder, conf.add_cross_attention = True, True
    if layers is not None:
        conf.num_hidden_layers = layers
    if not weights:
        return AutoModelForCausalLM.from_config(conf), set()
    with loading():
        decoder, info = AutoModelForCausalLM.from_pretrained(
            source, config=conf, local_files_only=True, trust_remote_code=False, output_loading_info=True
        )
    return decoder, set(info["missing_keys"])


def tie_vocabulary(embeddings: nn.Embedding, decoder: nn.Module, *, output: bool = True) -> None:
    """The decoder reads (and, with ``output``, writes) through the encoder's word-embedding matrix."""
    decoder.get_input_embeddings().weight = embeddings.weight
    if output:
        decoder.get_output_embeddings().weight = embeddings.weight


def bert2bert(
    name: str, source: Path, conf, *, decoder_layers: int, weights: bool = True, tie_output: bool = True
) -> Backbone:
    """E_sem = the BERT folder's encoder; decoder = its first ``decoder_layers`` layers + cross-attention."""
    if not weights:
        encoder = AutoModel.from_config(conf, add_pooling_layer=False)
        decoder, _ = causal_decoder(source, layers=decoder_layers, weights=False)
        tie_vocabulary(encoder.get_input_embeddings(), decoder, output=tie_output)
        return Backbone(
            encoder,
            decoder,
            AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False),
        )
    encoder, tokenizer = load_encoder(name, add_pooling_layer=False)
    decoder, new = causal_decoder(source, layers=decoder_layers)
    tie_vocabulary(encoder.get_input_embeddings(), decoder, output=tie_output)
    pretrained = {f"sem.{n}" for n, _ in encoder.named_parameters()}
    pretrained |= {f"decoder.{n}" for n, _ in decoder.named_parameters() if n not in new}
    return Backbone(encoder, decoder, tokenizer, pretrained)


def bart(
    name: str, source: Path, conf, *, decoder_layers: int, weights: bool = True, tie_output: bool = True
) -> Backbone:
    """A BART folder (encoder + first decoder layers), or BART from config on a BERT folder's vocabulary."""
    quiet_transformers()
    if conf.model_type == "bart":  # pretrained BART: encoder + the first decoder layers
        with loading():
            model = (
                BartModel.from_pretrained(source, local_files_only=True, trust_remote_code=False)
                if weights
                else BartModel(conf)
            )
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        if decoder_layers > model.config.decoder_layers:
            raise ConfigError(
                f"decoder_layers {decoder_layers}: {name!r} has only "
                f"{model.config.decoder_layers} decoder layers"
            )
        pretrained_decoder = weights
    else:  # BART from config in the BERT's shape, with its vocabulary and embeddings
        bert, tokenizer = load_encoder(name, add_pooling_layer=False)
        model = BartModel(
            BartConfig(
                vocab_size=conf.vocab_size,
                d_model=conf.hidden_size,
                max_position_embeddings=conf.max_position_embeddings,
                encoder_layers=conf.num_hidden_layers,
                decoder_layers=decoder_layers,
                encoder_attention_heads=conf.num_attention_heads,
                decoder_attention_heads=conf.num_attention_heads,
                encoder_ffn_dim=conf.intermediate_size,
                decoder_ffn_dim=conf.intermediate_size,
                activation_function="gelu",
                scale_embedding=False,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.cls_token_id,
                eos_token_id=tokenizer.sep_token_id,
                decoder_start_token_id=tokenizer.cls_token_id,
                forced_eos_token_id=tokenizer.sep_token_id,
            )
        )
        with torch.no_grad():
            model.shared.weight.copy_(bert.embeddings.word_embeddings.weight)
            for positions in (model.encoder.embed_positions, model.decoder.embed_positions):
                positions.weight[2:].copy_(bert.embeddings.position_embeddings.weight)  # BART's offset of 2
        pretrained_decoder = False
    encoder = model.encoder
    encoder.embed_tokens.weight = model.shared.weight
    dconf = BartConfig.from_dict(
        {
            **model.config.to_dict(),
            "decoder_layers": decoder_layers,
            "is_decoder": True,
            "is_encoder_decoder": False,
        }
    )
    decoder = BartForCausalLM(dconf)
    state = {
        k: v
        for k, v in model.decoder.state_dict().items()
        if not k.startswith("layers.") or int(k.split(".")[1]) < decoder_layers
    }
    decoder.model.decoder.load_state_dict(state)  # strict: every kept decoder weight has a home
    tie_vocabulary(encoder.embed_tokens, decoder, output=tie_output)
    if pretrained_decoder:
        pretrained = {f"sem.{n}" for n, _ in encoder.named_parameters()}
        pretrained |= {f"decoder.{n}" for n, _ in decoder.named_parameters()}
    else:
        pretrained = {
            "sem.embed_tokens.weight",
            "sem.embed_positions.weight",
            "decoder.model.decoder.embed_positions.weight",
        }
    return Backbone(encoder, decoder, tokenizer, pretrained)


def build(
    name: str,
    architecture: str,
    *,
    decoder_layers: int,
    skeleton: str | Path | None = None,
    tie_output: bool = True,
) -> Backbone:
    """The backbone ``architecture`` (``auto`` | ``bert2bert`` | ``bart``) of the model ``name``.

    ``skeleton``: a folder with the backbone's ``config.json`` + tokenizer (saved with an export):
    the same architecture with no weights loaded (a state dict follows)."""
    source = Path(skeleton) if skeleton else resolve_model_source(name)
    conf = AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    arch = architecture if architecture != "auto" else ("bart" if conf.model_type == "bart" else "bert2bert")
    if conf.model_type not in ("bert", "bart"):
        raise ConfigError(
            f"model {name!r}: ParaBART needs a BART or BERT model folder (got model_type {conf.model_type!r})"
        )
    if arch == "bert2bert" and conf.model_type != "bert":
        raise ConfigError(
            f"model {name!r}: architecture 'bert2bert' needs a BERT-family "
            f"model folder (got model_type {conf.model_type!r})"
        )
    make = bert2bert if arch == "bert2bert" else bart
    return make(
        name, source, conf, decoder_layers=decoder_layers, weights=skeleton is None, tie_output=tie_output
    )
