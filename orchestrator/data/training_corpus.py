"""The corpus a training run reads (a method config's ``data`` block): augmented shards named in the config, or
its raw corpus augmented once by the pipeline (``corpus.py``) and cached under ``<storage>/corpora/<content
hash>`` - the input's bytes (an s3 object's key, size and ETag), the pipeline's settings and ``ROW_FORMAT``."""

from __future__ import annotations

import hashlib

from pydantic import Field

from orchestrator import storage
from orchestrator.config import StrictModel, repo_path
from orchestrator.data.cleaning import input_files
from orchestrator.data.corpus_config import ROW_FORMAT, AugmentConfig, CorpusConfig
from orchestrator.errors import DataError


class CorpusBlock(StrictModel):
    """A training config's corpus: augmented shards (``augment_corpus``'s folder), or a raw corpus augmented first."""

    shards: str | None = None
    corpus: str = "data/corpus/wikisplit_sample.txt"
    column: str = Field("text", description="a TSV's or parquet file's column holding the sentences")
    limit: int | None = Field(None, gt=0)
    parser_workers: int = Field(2, ge=1)
    min_words: int = Field(3, ge=1)
    max_words: int = Field(64, ge=1, description="longer sentences are cut to this many words before parsing")
    drop_capitalised_splits: bool = Field(
        False,
        description="drop a sentence ending in a capitalised word and the line after it (a bad split in WikiSplit; on in the WikiSplit presets only)",
    )
    augment: AugmentConfig = AugmentConfig()

    def sources(self, key: str = "data") -> list[tuple[str, str]]:  # what preflight checks exists
        return [(f"{key}.shards", self.shards)] if self.shards else [(f"{key}.corpus", self.corpus)]

    def check(self, key: str = "data") -> None:
        """Before Ray: a local text or TSV corpus holds at least one line of ``min_words`` words (read until the
        first one: a blank or header-only corpus is refused in seconds, not after the cluster starts). An
        ``s3://`` or parquet corpus is checked by the pipeline itself."""
        if self.shards or storage.is_s3(self.corpus):
            return
        files = [f for f in input_files(repo_path(self.corpus)) if not f.endswith(".parquet")]
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                lines = iter(fh)
                col = None
                if f.endswith(".tsv"):
                    header = next(lines, "").rstrip("\n").split("\t")
                    col = header.index(self.column) if self.column in header else None
                    if col is None:
                        raise DataError(
                            f"{f}:1: no column {self.column!r} ({key}.column; header: {', '.join(header)})"
                        )
                for line in lines:
                    text = line.rstrip("\n").split("\t")[col] if col is not None and "\t" in line else line
                    if len(text.split()) >= self.min_words:
                        return
        if files:
            raise DataError(
                f"{key}.corpus: {self.corpus}: no line of {self.min_words} or more words ({key}.min_words): nothing to train on"
            )


def corpus_key(input_uri: str, corpus_cfg_json: str) -> str:
    """Content address of an augmented corpus: input bytes (local) or key + size (s3), config, ROW_FORMAT."""
    h = hashlib.sha256(f"{ROW_FORMAT}\x00{corpus_cfg_json}".encode())
    for f in input_files(input_uri):
        if storage.is_s3(f):  # a bucket key is stable (local paths are not); its size + ETag, not its bytes
            h.update(f.encode())
            h.update(storage.object_signature(f).encode())
        else:
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def prepare_corpus(cfg, progress: bool = True) -> str:
    """The augmented shards a method config (``data``: a :class:`CorpusBlock`) trains on: the
    configured ones, or the corpus augmented once and cached under ``<storage>/corpora/<content
    hash>`` (reused when the manifest exists); the corpus seed is the training seed."""
    data, storage_root, seed = cfg.data, cfg.run.storage, cfg.train.seed
    if data.shards:
        built = storage.resolve_build(data.shards)
        if built is None:
            raise DataError(
                f"{data.shards}: no committed build (not an augmented corpus from augment_corpus)"
            )
        return built
    cfg = CorpusConfig(
        input=repo_path(data.corpus),
        column=data.column,
        limit=data.limit,
        seed=seed,
        min_words=data.min_words,
        max_words=data.max_words,
        drop_capitalised_splits=data.drop_capitalised_splits,
        augment=data.augment,
        parser={"workers": data.parser_workers, "cpus_per_worker": 0.5},
    )
    out = storage.join(
        storage.absolute(storage_root),
        "corpora",
        corpus_key(cfg.input, cfg.model_dump_json(exclude={"input"})),
    )
    if (done := storage.resolve_build(out)) is not None:
        print(f"augmented corpus: reusing {done}")
        return done
    print(f"augmented corpus: building under {out}")
    # lazy: Ray Data, for the driver that builds; configs import this module
    from orchestrator.data.corpus import run_pipeline

    return storage.build_committed(out, lambda folder: run_pipeline(cfg, folder, progress=progress))
