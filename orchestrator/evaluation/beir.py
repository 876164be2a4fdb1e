"""Retrieval on your own data, in BEIR's format: a folder (local or ``s3://``) with

    corpus.jsonl       one JSON object a line: ``_id``, ``text``, optional ``title``
    queries.jsonl      one JSON object a line: ``_id``, ``text``
    qrels/<split>.tsv  a header, then ``query-id <tab> corpus-id <tab> score`` (an integer ≥ 0; > 0 relevant)

read whole and checked before anything runs: a line that is not a JSON object, a missing or repeated ``_id``, an
empty text, a qrels row with an id absent from the corpus or the queries, a score that is not a non-negative
integer - each refused in one line naming the file and the line. A document is encoded as
``title + " " + text`` (sentence-transformers' BEIR examples); a query is scored only when its split's qrels give
it a relevant document. The metrics are :func:`orchestrator.evaluation.retrieval.retrieval_metrics` (nDCG@10,
MRR@10, recall@1/5/10/100, accuracy@1/10, MAP@100, as sentence-transformers' ``InformationRetrievalEvaluator``
computes them: ``tests/test_beir.py``), the corpus encoded once per model.

Limit: the corpus is read into memory (a corpus larger than memory, streamed, is not built yet).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator import storage
from orchestrator.config import repo_path
from orchestrator.errors import DataError
from orchestrator.evaluation.retrieval import ranked, retrieval_metrics

RECALL_AT = (1, 5, 10, 100)
DOCUMENT = ("title", "text")  # a corpus document: its title, then its text


@dataclass
class BeirSet:
    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]  # per query, the indices of its relevant documents in ``corpus``


def _lines(uri: str) -> list[str]:
    try:
        return storage.read_bytes(uri).decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{uri}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def json_lines(uri: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file; a line that is not a JSON object is refused
    naming it."""
    for n, line in enumerate(_lines(uri), start=1):
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


def read_qrels(uri: str, queries: dict[str, str], corpus: dict[str, str]) -> dict[str, dict[str, int]]:
    """query id → {corpus id: score}; every id known, every score a non-negative integer."""
    lines = _lines(uri)
    if not lines or "\t" not in lines[0]:
        raise DataError(f"{uri}:1: expected a header query-id<TAB>corpus-id<TAB>score")
    out: dict[str, dict[str, int]] = {}
    for n, line in enumerate(lines[1:], start=2):
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
    corpus = read_jsonl(storage.join(folder, "corpus.jsonl"), texts=DOCUMENT)
    queries = read_jsonl(storage.join(folder, "queries.jsonl"), texts=("text",))
    qrels = read_qrels(storage.join(folder, "qrels", f"{split}.tsv"), queries, corpus)
    index = {d: i for i, d in enumerate(corpus)}
    scored = [(q, {index[d] for d, s in docs.items() if s > 0}) for q, docs in qrels.items()]
    scored = [(q, rel) for q, rel in scored if rel]
    if not scored:
        raise DataError(f"{storage.join(folder, 'qrels', f'{split}.tsv')}: no query with a relevant document")
    return BeirSet(
        queries=[queries[q] for q, _ in scored],
        corpus=list(corpus.values()),
        relevant=[rel for _, rel in scored],
    )


@dataclass
class BeirEvaluator:
    """A BEIR folder as a test task: ``eval.domain: [beir_<name>]`` with ``eval.domain_paths.beir_<name>``."""

    name: str
    path: str
    split: str = "test"

    def check(self) -> None:
        read_beir(self.path, self.split)

    def __call__(self, encoder) -> dict[str, float]:
        data = read_beir(self.path, self.split)
        corpus_emb = encoder.encode(data.corpus)  # once per model
        query_emb = encoder.encode(data.queries)
        top = ranked(query_emb, corpus_emb, 100)  # MAP@100 and recall@100 read the first 100
        metrics = retrieval_metrics(top, data.relevant, recall_at=RECALL_AT)
        return {f"{self.name}_{k}": v for k, v in metrics.items()}  # nDCG@10 first: the headline
