"""Retrieval: rank a corpus for every query by cosine similarity, scored as sentence-transformers'
``InformationRetrievalEvaluator`` scores it (``tests/test_retrieval.py`` checks equality on the same model):
nDCG@10, MRR@10, recall@1/5/10, accuracy@1/10 and MAP@100, each averaged over the queries. Ties are broken
by ascending corpus index, as that evaluator breaks them by ascending corpus id.

The shipped set, ``qqp_retrieval``: duplicate-question retrieval built from ``data/paraphrase/qqp-dev.tsv``
(the BiMPM QQP dev sample) when it is read - each of the first 1,000 duplicate pairs gives a query (its
first question) and its one relevant document (its second); the corpus is those 1,000 answers plus every
question of the first 2,000 non-duplicate pairs (distractors), each text once; a query whose own text is in
the corpus is dropped. Another TSV of ``sentence1, sentence2, label`` pairs builds the same way from its path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.errors import DataError
from orchestrator.evaluation.sts import read_sts_tsv

QQP_DEV = Path(__file__).resolve().parents[2] / "data" / "paraphrase" / "qqp-dev.tsv"


def ranked(query_emb: np.ndarray, corpus_emb: np.ndarray, depth: int) -> np.ndarray:
    """(queries, depth) corpus indices, best first: cosine similarity, ties by ascending index."""
    q = query_emb / np.clip(np.linalg.norm(query_emb, axis=1, keepdims=True), 1e-12, None)
    c = corpus_emb / np.clip(np.linalg.norm(corpus_emb, axis=1, keepdims=True), 1e-12, None)
    scores = q.astype(np.float32) @ c.astype(np.float32).T
    order = np.argsort(-scores, axis=1, kind="stable")  # stable: equal scores keep ascending index
    return order[:, :depth]


def retrieval_metrics(
    top: np.ndarray, relevant: list[set[int]], recall_at: tuple[int, ...] = (1, 5, 10)
) -> dict[str, float]:
    """Each query's ranked corpus indices ``top`` against its relevant set, averaged (the IR evaluator's
    definitions: nDCG with binary gains over min(|relevant|, k) ideal hits, MAP@k divided by min(k, |relevant|));
    recall at each of ``recall_at``."""
    out: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        out.setdefault(key, []).append(value)

    for hits, rel in zip(top.tolist(), relevant, strict=True):
        flags = [1 if h in rel else 0 for h in hits]
        dcg = sum(f / np.log2(i + 2) for i, f in enumerate(flags[:10]))
        ideal = sum(1 / np.log2(i + 2) for i in range(min(len(rel), 10)))
        add("ndcg_at_10", dcg / ideal)
        first = next((i for i, f in enumerate(flags[:10]) if f), None)
        add("mrr_at_10", 0.0 if first is None else 1 / (first + 1))
        for k in recall_at:
            add(f"recall_at_{k}", sum(flags[:k]) / len(rel))
        for k in (1, 10):
            add(f"accuracy_at_{k}", float(any(flags[:k])))
        correct, precisions = 0, 0.0
        for i, f in enumerate(flags[:100]):
            if f:
                correct += 1
                precisions += correct / (i + 1)
        add("map_at_100", precisions / min(100, len(rel)))
    return {k: float(np.mean(v)) for k, v in out.items()}


def pairs_retrieval_set(path: Path, n_queries: int = 1000, n_distractor_pairs: int = 2000):
    """(queries, corpus, relevant corpus indices per query) from a labelled pair file, as described above."""
    data = read_sts_tsv(path, path.name, score_column="label")
    dup = [(a, b) for a, b, y in zip(data.sentence1, data.sentence2, data.scores) if y == 1][:n_queries]
    other = [(a, b) for a, b, y in zip(data.sentence1, data.sentence2, data.scores) if y == 0][
        :n_distractor_pairs
    ]
    corpus = list(dict.fromkeys([b for _, b in dup] + [t for pair in other for t in pair]))
    index = {t: i for i, t in enumerate(corpus)}
    queries, relevant = [], []
    for a, b in dup:
        if a in index or a in queries:  # its own text would be its best hit; a repeated query counts once
            continue
        queries.append(a)
        relevant.append({index[b]})
    if not queries:
        raise DataError(f"{path}: no duplicate pair (label 1) to make a query from")
    return queries, corpus, relevant


@dataclass
class RetrievalEvaluator:
    name: str = "qqp_retrieval"
    path: Path = QQP_DEV

    def __call__(self, encoder) -> dict[str, float]:
        queries, corpus, relevant = pairs_retrieval_set(self.path)
        emb = encoder.encode(queries + corpus)
        metrics = retrieval_metrics(ranked(emb[: len(queries)], emb[len(queries) :], 100), relevant)
        return {f"{self.name}_{k}": v for k, v in metrics.items()}  # nDCG@10 first: the headline
