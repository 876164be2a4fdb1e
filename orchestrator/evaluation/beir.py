"""Retrieval on your own data, in BEIR's format: a folder (local or ``s3://``) with

    corpus.jsonl       one JSON object a line: ``_id``, ``text``, optional ``title``
    queries.jsonl      one JSON object a line: ``_id``, ``text``
    qrels/<split>.tsv  a header, then ``query-id <tab> corpus-id <tab> score`` (an integer ≥ 0; > 0 relevant)

streamed (never read whole: a corpus larger than memory is tested in bounded memory) and checked before anything
runs: a line that is not a JSON object, a missing or repeated ``_id``, an empty text, a qrels row with an id absent
from the corpus or the queries, a score that is not a non-negative integer - each refused in one line naming the
file and the line. A document is encoded as ``title + " " + text`` (sentence-transformers' BEIR examples); a
query is scored only when its split's qrels give it a relevant document. The metrics are
:func:`orchestrator.evaluation.retrieval.retrieval_metrics` (nDCG@10, MRR@10, recall@1/5/10/100, accuracy@1/10,
MAP@100, as sentence-transformers' ``InformationRetrievalEvaluator`` computes them: ``tests/test_beir.py``).

The test holds the queries' embeddings and, per query, its 100 best documents so far: the corpus is encoded once
per model, ``chunk_rows`` documents at a time, each chunk's scores merged into that running top 100 (ties by
ascending corpus position, as a whole-corpus sort orders them). Memory: the corpus ids (the qrels are checked
against them) and one chunk, whatever the corpus size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from orchestrator import storage
from orchestrator.config import repo_path
from orchestrator.errors import DataError
from orchestrator.evaluation.retrieval import retrieval_metrics

RECALL_AT = (1, 5, 10, 100)
DOCUMENT = ("title", "text")  # a corpus document: its title, then its text


@dataclass
class BeirSet:
    queries: list[str]
    relevant: list[set[int]]  # per query, the positions of its relevant documents in the corpus file
    corpus_uri: str  # corpus.jsonl, streamed again for its texts (:meth:`documents`)
    size: int  # documents in the corpus

    def documents(self) -> Iterator[str]:
        """Every document's text as the test encodes it, in file order (position 0, 1, ...), streamed."""
        for n, row in json_lines(self.corpus_uri):
            yield document_text(row, f"{self.corpus_uri}:{n}")

    def texts_at(self, positions: set[int]) -> dict[int, str]:
        """The texts of the documents at ``positions`` (one streamed pass, only those kept)."""
        return {i: text for i, text in enumerate(self.documents()) if i in positions}


def json_lines(uri: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file; a line that is not a JSON object is refused
    naming it."""
    for n, line in storage.iter_lines(uri):
        if line.strip():
            yield n, json_object(line, f"{uri}:{n}")


def json_object(line: str, where: str) -> dict:
    """One JSONL line's object; refused at ``where`` (file:line) when it is not JSON or not an object."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: not a JSON object")
    return row


def read_jsonl(uri: str, *, texts: tuple[str, ...]) -> dict[str, str]:
    """``_id`` → its text (the ``texts`` fields that are present, joined by a space), in file order."""
    out: dict[str, str] = {}
    for n, row in json_lines(uri):
        key, text = record(row, f"{uri}:{n}", texts)
        if key in out:
            raise DataError(f"{uri}:{n}: _id {key!r} repeats an earlier line's")
        out[key] = text
    if not out:
        raise DataError(f"{uri}: no rows")
    return out


def record(row: dict, where: str, texts: tuple[str, ...]) -> tuple[str, str]:
    """(``_id``, its text: the ``texts`` fields present, joined by a space) of one JSONL object; refused at ``where``
    (file:line) without an ``_id`` or a text."""
    key = row.get("_id")
    if not isinstance(key, str | int) or isinstance(key, bool) or str(key) == "":
        raise DataError(f"{where}: no _id")
    text = " ".join(str(row[k]).strip() for k in texts if isinstance(row.get(k), str) and row[k].strip())
    if not text:
        raise DataError(f"{where}: _id {str(key)!r} has no text")
    return str(key), text


def document_text(row: dict, where: str) -> str:
    """A corpus document's text as the test encodes it: ``title + " " + text``."""
    return record(row, where, DOCUMENT)[1]


def corpus_ids(uri: str) -> dict[str, int]:
    """Every corpus document's ``_id`` → its position, each line checked (a document needs an ``_id`` and a text);
    the texts are not kept."""
    out: dict[str, int] = {}
    for n, row in json_lines(uri):
        key, _ = record(row, f"{uri}:{n}", DOCUMENT)
        if key in out:
            raise DataError(f"{uri}:{n}: _id {key!r} repeats an earlier line's")
        out[key] = len(out)
    if not out:
        raise DataError(f"{uri}: no rows")
    return out


def read_qrels(uri: str, queries: dict[str, str], corpus: dict[str, int]) -> dict[str, dict[str, int]]:
    """query id → {corpus id: score}; every id known, every score a non-negative integer."""
    lines = storage.iter_lines(uri)
    first = next(lines, (1, ""))[1]
    if "\t" not in first:
        raise DataError(f"{uri}:1: expected a header query-id<TAB>corpus-id<TAB>score")
    out: dict[str, dict[str, int]] = {}
    for n, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(f"{uri}:{n}: expected 3 tab-separated fields, got {len(fields)}")
        qid, did, raw = (f.strip() for f in fields)
        if qid not in queries:
            raise DataError(f"{uri}:{n}: query-id {qid!r} is not in queries.jsonl")
        if did not in corpus:
            raise DataError(f"{uri}:{n}: corpus-id {did!r} is not in corpus.jsonl")
        try:
            score = int(raw)
        except ValueError:
            raise DataError(f"{uri}:{n}: score {raw!r} is not an integer") from None
        if score < 0:
            raise DataError(f"{uri}:{n}: score {score} is negative (relevance is 0 or more)")
        out.setdefault(qid, {})[did] = score
    return out


def read_beir(folder: str, split: str = "test") -> BeirSet:
    """The folder's queries with a relevant document in ``qrels/<split>.tsv``, against the whole corpus."""
    folder = repo_path(folder)
    corpus_uri = storage.join(folder, "corpus.jsonl")
    index = corpus_ids(corpus_uri)
    queries = read_jsonl(storage.join(folder, "queries.jsonl"), texts=("text",))
    qrels = read_qrels(storage.join(folder, "qrels", f"{split}.tsv"), queries, index)
    scored = [(q, {index[d] for d, s in docs.items() if s > 0}) for q, docs in qrels.items()]
    scored = [(q, rel) for q, rel in scored if rel]
    if not scored:
        raise DataError(f"{storage.join(folder, 'qrels', f'{split}.tsv')}: no query with a relevant document")
    return BeirSet(
        queries=[queries[q] for q, _ in scored],
        relevant=[rel for _, rel in scored],
        corpus_uri=corpus_uri,
        size=len(index),
    )


@dataclass
class BeirEvaluator:
    """A BEIR folder as a test task: ``eval.domain: [beir_<name>]`` with ``eval.domain_paths.beir_<name>``."""

    name: str
    path: str
    split: str = "test"
    chunk_rows: int = 4096  # corpus documents encoded and scored at a time

    def check(self) -> None:
        read_beir(self.path, self.split)

    def __call__(self, encoder) -> dict[str, float]:
        data = read_beir(self.path, self.split)
        top = RunningTop(unit(encoder.encode(data.queries)), DEPTH)
        chunk: list[str] = []
        for text in data.documents():  # once per model, a chunk at a time
            chunk.append(text)
            if len(chunk) == self.chunk_rows:
                top.add(unit(encoder.encode(chunk)))
                chunk = []
        if chunk:
            top.add(unit(encoder.encode(chunk)))
        metrics = retrieval_metrics(top.indices, data.relevant, recall_at=RECALL_AT)
        return {f"{self.name}_{k}": v for k, v in metrics.items()}  # nDCG@10 first: the headline


DEPTH = 100  # MAP@100 and recall@100 read the first 100


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1, float32: a dot product of two is their cosine (as ``retrieval.ranked`` scores)."""
    return (x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


class RunningTop:
    """Per query, the ``depth`` best corpus positions among the documents added so far, best first, ties by
    ascending position: after the last chunk, what ``retrieval.ranked`` gives over the whole corpus at once."""

    def __init__(self, queries: np.ndarray, depth: int):
        self.queries, self.depth, self.seen = queries, depth, 0
        self.scores = np.empty((len(queries), 0), np.float32)
        self.indices = np.empty((len(queries), 0), np.int64)

    def add(self, documents: np.ndarray) -> None:
        positions = np.arange(self.seen, self.seen + len(documents))
        self.seen += len(documents)
        scores = np.concatenate([self.scores, self.queries @ documents.T], axis=1)
        width = (len(self.queries), len(positions))
        indices = np.concatenate([self.indices, np.broadcast_to(positions, width)], axis=1)
        order = np.lexsort((indices, -scores), axis=1)[:, : self.depth]  # score down, then position up
        self.scores = np.take_along_axis(scores, order, 1)
        self.indices = np.take_along_axis(indices, order, 1)
