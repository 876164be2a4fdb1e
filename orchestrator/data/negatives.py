"""Hard negatives for (anchor, positive) rows, mined as a streaming Ray Data job (``jobs/mine_negatives.py``).

What it computes is sentence-transformers' ``util.mine_hard_negatives`` (``output_format="n-tuple"``, ``sampling_strategy="top"``,
no cross-encoder), to the row: ``tests/test_negatives.py`` checks it on the same model, rows and settings.

1. The rows' queries and positives are deduplicated as there: each distinct anchor once, with its distinct positives.
2. **Encoder actors** (Ray Data ``map_batches`` over a fixed actor pool: GPU actors on a cluster, CPU here) embed
   the queries, then stream the corpus - a BEIR folder's ``corpus.jsonl``, a text file (a passage a line), or, by
   default, the positives themselves - block by block, each text normalised (cosine = dot product).
3. The driver keeps, per query, the running **exact top-k** of the corpus seen so far (k = ``range_max`` plus
   the most positives a query has): each block's scores are one matrix product, merged with the kept k by
   ``torch.topk``. It holds the query embeddings, the k best per query, and the texts of the passages now among
   them - never the corpus: its memory is flat in corpus size (``bench/results/mine_negatives.md``). A text seen
   twice counts once (by a hash of it), as the reference deduplicates its corpus.
4. sentence-transformers' filters, in its order: the query's own positives out; ``absolute_margin`` /
   ``relative_margin`` against the query's weakest positive (a candidate about as close as a positive is likely
   an unlabelled positive - a false negative); ``max_score`` / ``min_score``; then the ``range_max`` best, the
   first ``range_min`` of them skipped, the first ``num_negatives`` taken. A row that keeps fewer is dropped.
5. One parquet file: ``anchor``, ``positive``, ``negative_1`` ... ``negative_n`` - a row per (query, positive) -
   which ``train_pairs: {format: parquet, anchor_column: anchor, positive_column: positive, negative_columns:
   [negative_1, ...]}`` trains on. An existing output is never overwritten.
"""

from __future__ import annotations

import hashlib
import io
import math
import time
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
import torch
from pydantic import Field, model_validator
from sentence_transformers import SentenceTransformer

from orchestrator import storage
from orchestrator.config import StrictModel, repo_path
from orchestrator.data.pairs import TrainingRows
from orchestrator.errors import DataError, StorageError
from orchestrator.evaluation.beir import document_text, json_object
from orchestrator.models import resolve_model_source


# ---------------------------------------------------------------- the job's config
class CorpusFile(StrictModel):
    path: str = Field(..., description="a BEIR folder (its corpus.jsonl) or a text file, local or s3://")
    format: Literal["beir", "text"] = Field("beir", description="beir: corpus.jsonl; text: a passage a line")

    @property
    def uri(self) -> str:
        path = repo_path(self.path)
        return storage.join(path, "corpus.jsonl") if self.format == "beir" else path


class MineConfig(StrictModel):
    """``configs/mine_negatives/*.yaml``: the model, the rows, the corpus, sentence-transformers' filters, the
    actors, the output."""

    model: str = Field(
        "default", description="a sentence-transformers folder, s3:// URI, models:/ or 'default'"
    )
    pairs: TrainingRows
    corpus: CorpusFile | None = Field(None, description="null: the positives themselves are the corpus")
    num_negatives: int = Field(3, ge=1)
    range_min: int = Field(
        0, ge=0, description="the closest candidates skipped (likely unlabelled positives)"
    )
    range_max: int | None = Field(
        None, ge=1, description="candidates kept per query (default as sentence-transformers derives it)"
    )
    absolute_margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None
    batch_size: int = Field(64, ge=1, description="texts per encoder forward")
    block_rows: int = Field(1024, ge=1, description="corpus rows per streamed block (one top-k merge each)")
    actors: int = Field(1, ge=1, description="encoder actors")
    cpus_per_actor: float = Field(1.0, gt=0)
    gpus_per_actor: float = Field(0.0, ge=0)
    output: str = Field(..., description="the parquet file written (local or s3://); never overwritten")

    @model_validator(mode="after")
    def _a_range(self):
        if self.range_max is not None and self.num_negatives > self.range_max - self.range_min:
            raise ValueError(
                f"num_negatives {self.num_negatives} exceeds the {self.range_max - self.range_min} candidates "
                f"between range_min {self.range_min} and range_max {self.range_max}"
            )
        return self

    def candidates(self, max_positives: int) -> int:
        """``range_max`` as sentence-transformers derives it when unset: room for the filters to drop some."""
        if self.range_max is not None:
            return self.range_max
        filtered = any(v is not None for v in (self.absolute_margin, self.relative_margin, self.max_score))
        return self.range_min + self.num_negatives * (10 if filtered else 1) + max_positives


# ---------------------------------------------------------------- 1. rows, checked before Ray
def queries_and_positives(rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Each distinct anchor once (first-seen order), with its distinct positives (first-seen order)."""
    by_query: dict[str, dict[str, None]] = {}
    for anchor, positive, *_ in rows:
        by_query.setdefault(anchor, {})[positive] = None
    return list(by_query), [list(p) for p in by_query.values()]


def corpus_lines(cfg: MineConfig):
    """(line number, passage) of the corpus file, streamed (never read whole); a bad line names file and line."""
    try:
        for n, line in storage.iter_lines(cfg.corpus.uri):
            if line.strip():
                yield n, passage(line, cfg.corpus.format, f"{cfg.corpus.uri}:{n}")
    except StorageError as exc:  # as the other inputs: a corpus that cannot be read is the user's data error
        raise DataError(str(exc)) from None


def passage(line: str, fmt: str, where: str) -> str:
    return line.strip() if fmt == "text" else document_text(json_object(line, where), where)


def check(cfg: MineConfig) -> list[list[str]]:
    """Everything the inputs show, before Ray starts: the rows, every corpus line (streamed), the model folder, and
    an output that does not exist yet. Returns the rows."""
    rows = cfg.pairs.rows()
    if cfg.corpus is not None and sum(1 for _ in corpus_lines(cfg)) == 0:  # every line read and checked
        raise DataError(f"{cfg.corpus.uri}: no passages")
    resolve_model_source(cfg.model)
    if storage.exists(repo_path(cfg.output)):
        raise DataError(f"{cfg.output}: exists already; the mining job writes a new file, never over one")
    return rows


# ---------------------------------------------------------------- 2. encoder actors
class Embed:
    """A Ray Data actor: one sentence-transformers model, loaded once, embedding blocks of ``text``."""

    def __init__(self, model_dir: str, batch_size: int, query: bool):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = SentenceTransformer(
            model_dir, device=device, trust_remote_code=False, local_files_only=True
        )
        self.encode = self.model.encode_query if query else self.model.encode_document
        self.batch_size = batch_size

    def __call__(self, batch: dict) -> dict:
        batch["embedding"] = self.encode(
            list(batch["text"]),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        ).astype(np.float32)
        return batch


def embedded(ds, cfg: MineConfig, model_dir: str, query: bool):
    """``ds`` (a ``text`` column) with an ``embedding`` column, from ``cfg.actors`` encoder actors, a block each call."""
    return ds.map_batches(
        Embed,
        fn_constructor_args=(model_dir, cfg.batch_size, query),
        batch_size=cfg.block_rows,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=cfg.actors),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=cfg.gpus_per_actor,
    )


# ---------------------------------------------------------------- 3. the running top-k
class RunningTopK:
    """Per query, the k highest dot products with the corpus rows seen so far, and their corpus indices; a block
    is one matrix product merged with the kept k. Fewer than k rows seen: padded with -inf and index -1."""

    def __init__(self, queries: torch.Tensor, k: int):
        self.queries, self.k = queries, k
        self.scores = torch.full((len(queries), k), -math.inf)
        self.indices = torch.full((len(queries), k), -1, dtype=torch.long)

    def add(self, embeddings: torch.Tensor, ids: torch.Tensor) -> None:
        scores = torch.cat([self.scores, self.queries @ embeddings.T], dim=1)
        indices = torch.cat([self.indices, ids.expand(len(self.queries), -1)], dim=1)
        self.scores, at = torch.topk(scores, self.k, dim=1)
        self.indices = indices.gather(1, at)


# ---------------------------------------------------------------- 4. sentence-transformers' filters
def select(
    scores: torch.Tensor,
    indices: torch.Tensor,
    positives: list[list[int]],
    positive_scores: list[list[float]],
    cfg: MineConfig,
    range_max: int,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
    """(negative indices, their scores, candidates dropped per filter): ``mine_hard_negatives``' steps in its
    order; a dropped candidate's score is -inf."""
    scores = scores.clone()
    scores[indices == -1] = -math.inf
    scores[
        torch.stack([torch.isin(indices[q], torch.tensor(p)) for q, p in enumerate(positives)])
    ] = -math.inf
    dropped: dict[str, int] = {}

    def drop(name: str, mask: torch.Tensor) -> None:
        mask &= scores != -math.inf
        scores[mask] = -math.inf
        if n := int(mask.sum()):
            dropped[name] = n

    weakest = torch.tensor([min(s) for s in positive_scores], dtype=scores.dtype).unsqueeze(1)
    if cfg.absolute_margin is not None:
        drop("absolute_margin", scores + cfg.absolute_margin > weakest)
    if cfg.relative_margin is not None:
        drop("relative_margin", scores > weakest - weakest.abs() * cfg.relative_margin)
    if cfg.max_score is not None:
        drop("max_score", scores > cfg.max_score)
    if cfg.min_score is not None:
        drop("min_score", scores < cfg.min_score)
    top, at = torch.topk(scores, min(range_max, scores.size(1)), dim=1)
    keep = slice(cfg.range_min, cfg.range_min + cfg.num_negatives)
    return indices.gather(1, at)[:, keep], top[:, keep], dropped


# ---------------------------------------------------------------- the job
def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class CorpusScan:
    """Step 3 over the streamed corpus blocks: each distinct text (by hash) gets the next index; the running top-k;
    each positive's score with its queries as its block passes; the texts of the passages among the k best."""

    def __init__(self, queries: torch.Tensor, positives: list[list[str]], k: int):
        self.queries, self.top, self.n = queries, RunningTopK(queries, k), 0
        self.positive_of: dict[bytes, list[int]] = {}  # a positive's text → the queries it is positive for
        for q, texts in enumerate(positives):
            for t in texts:
                self.positive_of.setdefault(text_key(t), []).append(q)
        self.seen: set[bytes] = set()
        self.index: dict[bytes, int] = {}  # a positive's text → its corpus index
        self.positive_scores: dict[tuple[int, int], float] = {}  # (query, corpus index) → its score
        self.texts: dict[int, str] = {}

    def add(self, texts, embeddings: np.ndarray) -> None:
        fresh = []
        for j, text in enumerate(texts):
            key = text_key(text)
            if key in self.seen:
                continue
            self.seen.add(key)
            i = self.n + len(fresh)
            fresh.append(j)
            for q in self.positive_of.get(key, []):
                self.index[key] = i
                self.positive_scores[(q, i)] = float(self.queries[q] @ torch.from_numpy(embeddings[j].copy()))
        if not fresh:
            return
        self.top.add(torch.from_numpy(embeddings[fresh]), torch.arange(self.n, self.n + len(fresh)))
        for i in torch.unique(self.top.indices[self.top.indices >= self.n]).tolist():
            self.texts[i] = str(texts[fresh[i - self.n]])
        self.n += len(fresh)
        if len(self.texts) > 2 * self.top.indices.numel():  # forget the passages no query keeps
            wanted = set(self.top.indices.flatten().tolist())
            self.texts = {i: t for i, t in self.texts.items() if i in wanted}

    def positives(self, positives: list[list[str]]) -> tuple[list[list[int]], list[list[float]]]:
        ids = [[self.index[text_key(t)] for t in ps] for ps in positives]
        return ids, [[self.positive_scores[(q, i)] for i in row] for q, row in enumerate(ids)]


def embed_queries(queries: list[str], cfg: MineConfig, model_dir: str) -> torch.Tensor:
    ds = ray.data.from_items([{"i": i, "text": q} for i, q in enumerate(queries)])
    out = None
    # in block_rows batches, as the corpus: Ray Data coalesces blocks as a dataset grows (a large training qrels)
    for batch in embedded(ds, cfg, model_dir, query=True).iter_batches(
        batch_size=cfg.block_rows, batch_format="numpy"
    ):
        if out is None:
            out = torch.empty(len(queries), batch["embedding"].shape[1])
        out[torch.from_numpy(batch["i"].copy())] = torch.from_numpy(batch["embedding"].copy())
    return out


def corpus_dataset(cfg: MineConfig, positives: list[list[str]]):
    """The corpus file's passages (streamed from its storage), then the positives, as the reference orders them."""
    corpus = ray.data.from_items([{"text": t} for ps in positives for t in ps])
    if cfg.corpus is None:
        return corpus
    fs, key = storage.pyarrow_filesystem(cfg.corpus.uri)
    fmt, uri = cfg.corpus.format, cfg.corpus.uri
    return (
        ray.data.read_text(key, filesystem=fs)
        .map_batches(lambda b: {"text": [passage(t, fmt, uri) for t in b["text"]]}, batch_format="numpy")
        .union(corpus)
    )


def mine(cfg: MineConfig, rows: list[list[str]]) -> dict:
    """Steps 1-5 on the Ray cluster the caller started; returns the summary."""
    t0 = time.time()
    ray.data.DataContext.get_current().enable_progress_bars = False
    model_dir = str(resolve_model_source(cfg.model))
    queries, positives = queries_and_positives(rows)
    max_positives = max(len(p) for p in positives)
    range_max = cfg.candidates(max_positives)
    scan = CorpusScan(embed_queries(queries, cfg, model_dir), positives, range_max + max_positives)
    blocks = embedded(corpus_dataset(cfg, positives), cfg, model_dir, query=False)
    for batch in blocks.iter_batches(
        batch_size=cfg.block_rows, batch_format="numpy"
    ):  # bounded, whatever the blocks
        scan.add(batch["text"], batch["embedding"])
    pos_ids, pos_scores = scan.positives(positives)
    neg, neg_scores, dropped = select(scan.top.scores, scan.top.indices, pos_ids, pos_scores, cfg, range_max)
    keep = [q for q in range(len(queries)) if not torch.isinf(neg_scores[q]).any()]
    names = [f"negative_{m + 1}" for m in range(cfg.num_negatives)]
    table: dict[str, list[str]] = {"anchor": [], "positive": [], **{c: [] for c in names}}
    for q in keep:  # a row per (query, positive), the query's negatives on each
        for p in positives[q]:
            table["anchor"].append(queries[q])
            table["positive"].append(p)
            for m, c in enumerate(names):
                table[c].append(scan.texts[int(neg[q, m])])
    if not keep:
        raise DataError(
            f"{cfg.output}: no query kept {cfg.num_negatives} negatives after the filters {dropped}"
        )
    write_parquet(table, repo_path(cfg.output))
    wall = time.time() - t0
    return {
        "output": cfg.output,
        "rows": len(table["anchor"]),
        "queries": len(queries),
        "queries_kept": len(keep),
        "corpus": scan.n,
        "range_max": range_max,
        "dropped": dropped,
        "positive_score_mean": round(float(np.mean([s for q in keep for s in pos_scores[q]])), 4),
        "negative_score_mean": round(float(neg_scores[keep].mean()), 4),
        "wall_s": round(wall, 1),
        "passages_per_s": round(scan.n / wall, 1),
    }


def write_parquet(table: dict[str, list[str]], uri: str) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf)
    storage.write_bytes(uri, buf.getvalue())
