"""Paraphrase generation with a trained ParaBART: the saved model loaded back (:func:`load_parabart`) and
greedy decoding shaped by a target parse (:func:`generate`). Training is ``trainers/parabart.py``'s."""

from __future__ import annotations

from pathlib import Path

import torch

from trainers.checkpoint import load_weights_only
from trainers.parabart import ParaBART, ParaBARTConfig, Vocab, build_model
from trainers.parabart_batch import Batch


@torch.inference_mode()
def generate(
    model: ParaBART, batcher: Batch, sources: list[str], parses: list[str], max_new_tokens: int = 40
) -> list[str]:
    """Greedy decoding of paraphrases of ``sources`` shaped like the linearized ``parses``."""
    model.eval()
    tok = batcher.tok
    rows = {"src": sources, "tgt": [""] * len(sources), "tgt_parse": parses, "src_bag": ["{}"] * len(sources)}
    b = batcher(rows, train=False)
    u = model.embed(b["src_ids"], b["src_mask"])
    v = model.syntax(b["parse_ids"], b["parse_mask"])
    out = torch.full((len(sources), 1), tok.cls_token_id, dtype=torch.long)
    done = torch.zeros(len(sources), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model.decode(u, v, b["parse_mask"], out, torch.ones_like(out), keep=1)  # the next token only
        nxt = logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == tok.sep_token_id
        if done.all():
            break
    return tok.batch_decode(out, skip_special_tokens=True)


def load_parabart(model_dir) -> tuple[ParaBART, Batch]:
    """The saved model for generation: ``generate(model, batcher, [src], [parse])``."""
    d = Path(model_dir)
    cfg = ParaBARTConfig.model_validate_json((d / "parabart_config.json").read_text())
    state = load_weights_only(d / "parabart.pt")
    syntax, tags = Vocab(state["_extra_state"]["syntax"]), Vocab(state["_extra_state"]["tags"])
    model, tokenizer = build_model(cfg, syntax, tags, skeleton=d / "generator")
    model.load_state_dict(state)
    model.eval()
    return model, Batch(tokenizer, syntax, tags, cfg)
