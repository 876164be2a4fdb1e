"""Export an encoder as a sentence-transformers folder, through sentence-transformers' own API (a
``Transformer`` module + a ``Pooling`` module, saved by ``SentenceTransformer.save`` with its
``config_sentence_transformers.json`` and a model card); the folder also loads with
``transformers.AutoModel``. The card is completed by the job once the model is tested
(:func:`write_model_card`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from transformers import BlenderbotSmallConfig
from transformers.models.blenderbot_small.modeling_blenderbot_small import BlenderbotSmallEncoder

from orchestrator.models import POOLER_NOTE, load_encoder, loading
from orchestrator.storage import atomic_dir

# ST's CLS pooling is the raw [CLS] state: what `cls` (MLP in training only) and `cls_before_pooler` use at test
ST_POOLING_MODE = {"cls": "cls", "cls_before_pooler": "cls", "mean": "mean"}


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
    keys = (
        "vocab_size",
        "d_model",
        "max_position_embeddings",
        "encoder_layers",
        "encoder_ffn_dim",
        "encoder_attention_heads",
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "activation_function",
        "init_std",
        "encoder_layerdrop",
        "scale_embedding",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    )
    conf = BlenderbotSmallConfig(
        **{k: getattr(c, k) for k in keys}, decoder_layers=0, is_encoder_decoder=False
    )
    conf.architectures = ["BlenderbotSmallEncoder"]
    out = BlenderbotSmallEncoder(conf)
    state = encoder.state_dict()
    state["embed_positions.weight"] = state["embed_positions.weight"][2:]  # BART's offset of 2
    out.load_state_dict(state)
    return out


def export_encoder(
    model,
    tokenizer,
    out: str | Path,
    *,
    pooling: str,
    max_seq_length: int = 128,
    extra_files: dict[str, str] | None = None,
    write_more=None,
    card_name: str = "sieve encoder",
    base: str | None = None,
) -> Path:
    """Save ``model`` + ``tokenizer`` as a sentence-transformers model with ``pooling`` to ``out``, atomically
    (a crash keeps the old one). ``write_more(folder)`` adds files of its own inside the same atomic write.
    ``base``: the model it was trained from - a trained encoder has no pooler (the trainers drop it, unused),
    so the base's pooler weights are saved with it, untouched, and the folder says so (:data:`POOLER_NOTE`):
    the folder holds every weight its base had (no "newly initialized" on load), and ``cls`` pooling, which
    would read a pooler never trained with this encoder, is still refused (``models.load_encoder``)."""
    # lazy: heavy imports that every training worker and trial process, which never export, would pay
    from sentence_transformers import SentenceTransformer, SentenceTransformerModelCardData
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # lazy: as above

    with atomic_dir(out) as tmp, tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        with loading():
            word = Transformer(hf, max_seq_length=max_seq_length)
        untrained_pooler = False
        if getattr(model, "pooler", "n/a") is None and getattr(word.auto_model, "pooler", None) is not None:
            # the trained encoder has no pooler (the trainers drop it); loading it made a random one: the base's
            # own weights replace it, else none is saved (so that `cls` pooling is refused instead of random)
            pooler = base_pooler(base) if base else None
            if pooler is not None:
                word.auto_model.pooler.load_state_dict(pooler.state_dict())
                untrained_pooler = True
            else:
                word.auto_model.pooler = None
        pool = Pooling(model.config.hidden_size, pooling_mode=ST_POOLING_MODE[pooling])
        card = SentenceTransformerModelCardData(language="en", model_name=card_name, local_files_only=True)
        SentenceTransformer(modules=[word, pool], device="cpu", model_card_data=card).save(str(tmp))
        if untrained_pooler:
            (tmp / POOLER_NOTE).write_text(
                json.dumps(
                    {"pooler": "the base model's, not trained with this encoder", "cls_pooling": False}
                )
            )
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if write_more:
            write_more(Path(tmp))
    return Path(out)


def base_pooler(base: str):
    """The base model's pooler layer (None when it has none)."""
    model, _ = load_encoder(base, add_pooling_layer=True)
    return getattr(model, "pooler", None)


def write_model_card(folder: str | Path, text: str) -> None:
    """The folder's ``README.md``: what the job knows once the model is tested (method, settings, data,
    the scores beside the base model's, licence)."""
    Path(folder, "README.md").write_text(text)
