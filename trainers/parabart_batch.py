"""ParaBART's inputs: a batch of (source, target, target parse, source bag) rows as tensors - the source
word-dropped while training (the reference code's noise), the target parse as syntax-vocabulary ids, the
source's bag of constituents as D's targets (:func:`bag_targets`)."""

from __future__ import annotations

import json

import torch

from orchestrator.data.paraphrase import Vocab, directions, parse_tokens


def word_dropout(
    ids: torch.Tensor,
    mask: torch.Tensor,
    p: float,
    mask_id: int,
    keep_ids: set[int],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Replace each real, non-special token by ``mask_id`` with probability ``p``."""
    if p <= 0:
        return ids
    drop = torch.rand(ids.shape, generator=generator, device=ids.device) < p
    special = torch.zeros_like(drop)
    for k in keep_ids:
        special |= ids == k
    return torch.where(drop & mask.bool() & ~special, torch.full_like(ids, mask_id), ids)


def bag_targets(bags: list[str], tags: Vocab, form: str = "reference") -> torch.Tensor:
    """D's targets from the sources' bags (JSON tag → count). ``reference``: one plus each tag's count,
    normalised over the tags (the reference code's ``synt_bow``); ``softmax``: each label's share of the
    tree's nodes, brackets and ``ROOT`` left out. Tags outside the training vocabulary are not counted."""
    out = torch.zeros(len(bags), len(tags) - 2)
    for i, b in enumerate(bags):
        for tag, count in json.loads(b).items():
            if tag in tags.index and (form == "reference" or tag not in ("(", ")", "ROOT")):
                out[i, tags.index[tag] - 2] += count
    if form == "reference":
        out += 1.0
    return out / out.sum(-1, keepdim=True).clamp_min(1e-12)


class Batch:
    """Tokenised source (word-dropped), target, target parse and source bag tensors; rows of pairs (``data.row:
    pair``) become their two directions, every source → target first (``both_directions``: the losses sum the
    two halves, as the reference code's two passes)."""

    def __init__(self, tokenizer, syntax: Vocab, tags: Vocab, cfg):
        """``cfg``: a :class:`trainers.parabart.ParaBARTConfig` (its lengths, word dropout and D's form)."""
        self.tok, self.syntax, self.tags, self.cfg = tokenizer, syntax, tags, cfg
        self.keep = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}

    def __call__(self, rows: dict, *, train: bool, generator: torch.Generator | None = None, device="cpu"):
        both = "tgt_bag" in rows
        rows = directions(rows)
        kw = dict(
            padding=True,
            truncation=True,
            max_length=self.cfg.model.max_length,
            return_tensors="pt",
            return_token_type_ids=False,
        )
        src = self.tok([str(s) for s in rows["src"]], **kw)
        tgt = self.tok([str(s) for s in rows["tgt"]], **kw)
        src_ids = src["input_ids"]
        if train:
            src_ids = word_dropout(
                src_ids,
                src["attention_mask"],
                self.cfg.word_dropout,
                self.tok.mask_token_id,
                self.keep,
                generator,
            )
        parses = [
            self.syntax.ids(parse_tokens(str(p)))[: self.cfg.parse_max_length] or [1]
            for p in rows["tgt_parse"]
        ]
        width = max(len(p) for p in parses)
        parse_ids = torch.zeros(len(parses), width, dtype=torch.long)
        for i, p in enumerate(parses):
            parse_ids[i, : len(p)] = torch.tensor(p)
        bags = bag_targets([str(b) for b in rows["src_bag"]], self.tags, self.cfg.discriminator)
        out = {
            "src_ids": src_ids,
            "src_mask": src["attention_mask"],
            "parse_ids": parse_ids,
            "parse_mask": (parse_ids != 0).long(),
            "tgt_ids": tgt["input_ids"],
            "tgt_mask": tgt["attention_mask"],
            "bags": bags,
        }
        return {**{k: v.to(device) for k, v in out.items()}, "both_directions": both}
