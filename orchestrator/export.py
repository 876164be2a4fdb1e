"""Export an encoder as a folder that loads with both ``transformers.AutoModel`` and
``sentence_transformers.SentenceTransformer`` (a Transformer module + a Pooling module)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import BlenderbotSmallConfig
from transformers.models.blenderbot_small.modeling_blenderbot_small import BlenderbotSmallEncoder

from orchestrator.storage import atomic_dir

_ST_POOLING_MODE = {"cls": "cls", "cls_before_pooler": "cls", "mean": "mean"}


def write_sentence_transformers_modules(out: str | Path, *, hidden_size: int, pooling: str,
                                        max_seq_length: int = 128, normalize: bool = False) -> None:
    """Write ``modules.json``, ``sentence_bert_config.json`` and ``1_Pooling/config.json``.

    ``cls_before_pooler`` maps to sentence-transformers' CLS-token pooling (the raw ``[CLS]``
    state); ST has no notion of the BERT pooler, which is why SimCSE-style models are evaluated
    and exported with ``cls_before_pooler``.
    """
    out = Path(out)
    mode = _ST_POOLING_MODE[pooling]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }, indent=2))


def standalone_encoder(encoder):
    """An encoder in a form ``SentenceTransformer`` and ``AutoModel``-style loading run as an encoder.

    BERT-like encoders are returned as they are. A BART encoder (``BartEncoder``) is not: ST has
    no BART encoder-only loader and would load ``BartModel``, whose output is the *decoder's*
    states. The BlenderbotSmall encoder, which ST does load encoder-only, is the same network
    (scaled word embeddings + learned positions + embedding LayerNorm + post-norm layers); only
    BART's position table carries an offset of 2 rows. So the weights move into one, unchanged
    but for those two rows (tested: same embeddings to 1e-5).
    """
    if type(encoder).__name__ != "BartEncoder":
        return encoder
    c = encoder.config
    keys = ("vocab_size", "d_model", "max_position_embeddings", "encoder_layers", "encoder_ffn_dim",
            "encoder_attention_heads", "dropout", "attention_dropout", "activation_dropout",
            "activation_function", "init_std", "encoder_layerdrop", "scale_embedding", "pad_token_id",
            "bos_token_id", "eos_token_id")
    conf = BlenderbotSmallConfig(**{k: getattr(c, k) for k in keys}, decoder_layers=0, is_encoder_decoder=False)
    conf.architectures = ["BlenderbotSmallEncoder"]
    out = BlenderbotSmallEncoder(conf)
    state = encoder.state_dict()
    state["embed_positions.weight"] = state["embed_positions.weight"][2:]  # BART's offset of 2
    out.load_state_dict(state)
    return out


def export_encoder(model, tokenizer, out: str | Path, *, pooling: str, max_seq_length: int = 128,
                   extra_files: dict[str, str] | None = None, write_more=None) -> Path:
    """Save ``model`` + ``tokenizer`` + ST modules to ``out`` atomically (a crash keeps the old one).
    ``write_more(folder)`` adds files of its own inside the same atomic write."""
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_sentence_transformers_modules(tmp, hidden_size=model.config.hidden_size, pooling=pooling,
                                            max_seq_length=max_seq_length)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if write_more:
            write_more(Path(tmp))
    return Path(out)
