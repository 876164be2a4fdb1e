"""Paraphrase pairs for ParaBART: read the pair files, parse every sentence with the corpus pipeline,
join each pair with its target's linearized parse and its source's bag of constituents, and build the
two small vocabularies (parse tokens, constituent tags). Written content-addressed under
``<storage>/parabart/<hash>``: ``shards/`` + ``vocab.json`` + ``manifest.json`` (last). A row is one direction of
a pair (source, target, target's parse, source's bag), or with ``row: pair`` one pair with both parses and both
bags, which :func:`directions` turns into its two directions in one batch (the reference code's step).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from orchestrator import storage
from orchestrator.config import StrictModel
from orchestrator.data.corpus_config import ROW_FORMAT, CorpusConfig
from orchestrator.data.labelled import read_labelled
from orchestrator.errors import ConfigError

PAD, UNK = "<pad>", "<unk>"


class PairFile(StrictModel):
    path: str
    sentence1: str = "sentence1"
    sentence2: str = "sentence2"
    label: str | None = Field("label", description="keep rows with label 1 (None: every row is a paraphrase)")


class ParaphraseData(StrictModel):
    """Paraphrase pairs (label 1 kept), both directions, shuffled once with ``seed`` (the files
    differ in domain; training reads rows in order), then cut to ``limit``. The default mix is
    every paraphrase set shipped in ``data/``: MRPC train, PAWS-X en dev, TwitterPara PIT-2015 dev
    and QQP duplicates that share no question with the QQP-Easy/Hard evaluation pool."""

    pairs: list[PairFile] = [
        PairFile(path="data/paraphrase/mrpc-train.tsv"),
        PairFile(path="data/paraphrase/pawsx-en-dev.tsv"),
        PairFile(path="data/twitterpara/pit2015-dev.tsv"),
        PairFile(path="data/paraphrase/qqp-train-duplicates.tsv"),
    ]
    both_directions: bool = True
    row: Literal["direction", "pair"] = Field(
        "direction",
        description="what a shard row (one of train.batch_size's) is - direction: one direction of a pair, the "
        "two directions apart (ours so far); pair: a pair trained in both directions in one step (the reference "
        "code: a batch of 64 pairs is 128 examples, an epoch is one pass over the pairs)",
    )
    seed: int = 0
    limit: int | None = Field(None, gt=0, description="at most this many rows (after both directions)")
    valid_pairs: int = Field(
        500,
        ge=0,
        description="paraphrase pairs held out for the validation loss "
        "(both directions of a pair stay on one side)",
    )
    parse_max_depth: int | None = Field(
        None, ge=1, description="cut the target parse here (None: the whole tree)"
    )
    parser_workers: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _a_pair_row_has_both_directions(self):
        if self.row == "pair" and not self.both_directions:
            raise ValueError(
                "data.row 'pair' trains both directions of a pair: it needs data.both_directions"
            )
        return self


def parse_tokens(linearized: str) -> list[str]:
    """``(S (NP (DT)))`` → ``["(", "S", "(", "NP", "(", "DT", ")", ")", ")"]``."""
    return re.findall(r"\(|\)|[^\s()]+", linearized)


class Vocab:
    """A small string → id table (0 = padding, 1 = unknown), saved as JSON with the model."""

    def __init__(self, items: list[str]):
        self.items = [PAD, UNK] + [t for t in items if t not in (PAD, UNK)]
        self.index = {t: i for i, t in enumerate(self.items)}

    @classmethod
    def build(cls, sequences, min_count: int = 1) -> Vocab:
        counts = Counter(t for seq in sequences for t in seq)
        return cls(sorted(t for t, n in counts.items() if n >= min_count))

    def __len__(self) -> int:
        return len(self.items)

    def ids(self, tokens: list[str]) -> list[int]:
        return [self.index.get(t, 1) for t in tokens]


def read_pairs(data: ParaphraseData) -> list[tuple[str, str]]:
    pairs = []
    for f in data.pairs:
        label = f.label or f.sentence1
        rows = read_labelled(f.path, text_column=f.sentence1, label_column=label, integer_labels=False)
        others = read_labelled(f.path, text_column=f.sentence2, label_column=label, integer_labels=False)
        for (s1, y), (s2, _) in zip(rows, others, strict=True):
            if f.label is None or y == "1":
                pairs.append((s1, s2))
                if data.both_directions and data.row == "direction":
                    pairs.append((s2, s1))
    random.Random(data.seed).shuffle(pairs)
    return pairs[: data.limit] if data.limit else pairs


def held_out(pairs: list[tuple[str, str]], n: int) -> set[frozenset]:
    """The ``n`` pairs (unordered, so both directions together) whose hash is smallest: the validation set."""
    unordered = sorted(
        {frozenset(p) for p in pairs}, key=lambda p: hashlib.sha256("\t".join(sorted(p)).encode()).digest()
    )
    return set(unordered[:n])


def prepare_paraphrase_data(data: ParaphraseData, storage_root: str, *, progress: bool = True) -> str:
    """Paraphrase pairs joined with the pipeline's parses (target's linearized parse - the whole tree
    by default - and the source's constituent bag) → ``<storage>/parabart/<hash>/shards`` (training)
    + ``valid.parquet`` (held-out pairs) + the two vocabularies + manifest."""
    pairs = read_pairs(data)
    unique = len({frozenset(p) for p in pairs})
    if data.valid_pairs * 2 > unique:
        files = ", ".join(f.path for f in data.pairs)
        raise ConfigError(
            f"data.valid_pairs={data.valid_pairs} would hold out more than half of the {unique} "
            f"paraphrase pairs read from {files}; lower it (at most {unique // 2})"
        )
    key = [pairs, data.valid_pairs, data.parse_max_depth, ROW_FORMAT]
    if data.row == "pair":  # the key of a direction-rows build unchanged
        key.append("pair")
    key = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    out = storage.join(storage.absolute(storage_root), "parabart", key)
    return storage.build_committed(out, lambda folder: _build(pairs, data, folder, progress))


def _build(pairs: list[tuple[str, str]], data: ParaphraseData, out: str, progress: bool) -> None:
    # lazy: Ray Data, for the driver that builds; recipes import this module
    from orchestrator.data.corpus import run_pipeline

    sentences = sorted({s for pair in pairs for s in pair})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "s.txt").write_text("\n".join(sentences) + "\n")
        run_pipeline(
            CorpusConfig(
                input=str(Path(tmp) / "s.txt"),
                min_words=1,
                max_words=200,
                drop_capitalised_splits=False,
                augment={"parse_max_depth": data.parse_max_depth},
                parser={"workers": data.parser_workers, "cpus_per_worker": 0.5},
            ),
            str(Path(tmp) / "parsed"),
            progress=progress,
        )
        table = pq.read_table(
            str(Path(tmp) / "parsed" / "shards"), columns=["text", "linearized_parse", "constituent_bag"]
        )
    parsed = {
        t: (p, b) for t, p, b in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True)
    }
    norm = {s: " ".join(s.split()) for s in sentences}
    valid_set = held_out(pairs, data.valid_pairs)
    rows = {"src": [], "tgt": [], "tgt_parse": [], "src_bag": []}
    if data.row == "pair":  # the reverse direction's target parse and source bag
        rows |= {"src_parse": [], "tgt_bag": []}
    valid = {k: [] for k in rows}
    for s, t in pairs:
        ps, pt = parsed.get(norm[s]), parsed.get(norm[t])
        if ps is None or pt is None:
            continue
        side = valid if frozenset((s, t)) in valid_set else rows
        side["src"].append(s)
        side["tgt"].append(t)
        side["tgt_parse"].append(pt[0])
        side["src_bag"].append(ps[1])
        if data.row == "pair":
            side["src_parse"].append(ps[0])
            side["tgt_bag"].append(pt[1])
    both = directions(rows)
    syntax = Vocab.build(parse_tokens(p) for p in both["tgt_parse"])
    tags = Vocab.build(json.loads(b).keys() for b in both["src_bag"])
    for name, table in (("shards/part-00000.parquet", rows), ("valid.parquet", valid)):
        buf = io.BytesIO()
        pq.write_table(pa.table(table), buf)
        storage.write_bytes(storage.join(out, name), buf.getvalue())
    storage.write_bytes(
        storage.join(out, "vocab.json"), json.dumps({"syntax": syntax.items, "tags": tags.items}).encode()
    )
    manifest = {
        "pairs": len(pairs),
        "row": data.row,
        "rows": len(rows["src"]),
        "valid_rows": len(valid["src"]),
        "dropped_unparsed": len(pairs) - len(rows["src"]) - len(valid["src"]),
        "syntax_vocab": len(syntax),
        "tags": len(tags),
        "parse_max_depth": data.parse_max_depth,
    }
    storage.write_bytes(storage.join(out, "manifest.json"), json.dumps(manifest, indent=2).encode())


def directions(rows: dict) -> dict[str, list]:
    """Rows of pairs (``row: pair``: src, tgt, both parses, both bags) as their directions, every pair's
    source → target first, then every target → source (the reference code's two passes of a step, in one batch:
    columns src, tgt, tgt_parse, src_bag); rows that are directions already, as they are."""
    if "tgt_bag" not in rows:
        return rows
    forward, back = (("src", "tgt", "tgt_parse", "src_bag"), ("tgt", "src", "src_parse", "tgt_bag"))
    return {k: list(rows[k]) + list(rows[r]) for k, r in zip(forward, back, strict=True)}


def load_valid_rows(shards: str) -> dict[str, list]:
    """The held-out validation pairs, as directions (columns src, tgt, tgt_parse, src_bag); empty when none were
    held out."""
    path = storage.join(shards, "valid.parquet")
    if not storage.exists(path):
        return {}
    return directions(pq.read_table(io.BytesIO(storage.read_bytes(path))).to_pydict())


def load_train_rows(shards: str) -> dict[str, list]:
    """Every training direction's source and its bag (columns src, src_bag; the one shard every worker's split is
    read from)."""
    path = storage.join(shards, "shards", "part-00000.parquet")
    rows = pq.read_table(io.BytesIO(storage.read_bytes(path))).to_pydict()
    return {k: v for k, v in directions(rows).items() if k in ("src", "src_bag")}


def load_vocabs(shards: str) -> tuple[Vocab, Vocab]:
    v = json.loads(storage.read_bytes(storage.join(shards, "vocab.json")))
    return Vocab(v["syntax"]), Vocab(v["tags"])
