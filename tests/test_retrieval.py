"""The retrieval evaluator (orchestrator/evaluation/retrieval.py) against sentence-transformers'
InformationRetrievalEvaluator on the same model and the same queries/corpus, and its metrics on hand-made
rankings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.evaluation.retrieval import QQP_DEV, pairs_retrieval_set, ranked, retrieval_metrics


def test_metrics_on_hand_made_rankings():
    top = np.array([[3, 1, 2], [0, 1, 2]])  # query 0: its document at rank 2; query 1: at rank 1 (and 2 more)
    got = retrieval_metrics(top, [{1}, {0, 2}])
    assert got["mrr_at_10"] == pytest.approx((1 / 2 + 1) / 2)
    ndcg0 = (1 / np.log2(3)) / 1
    ndcg1 = (1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3))
    assert got["ndcg_at_10"] == pytest.approx((ndcg0 + ndcg1) / 2)
    assert got["recall_at_1"] == pytest.approx((0 + 0.5) / 2) and got["accuracy_at_1"] == 0.5
    assert got["map_at_100"] == pytest.approx((1 / 2 + (1 + 2 / 3) / 2) / 2)


def test_ties_go_to_the_lower_corpus_index():
    q = np.array([[1.0, 0.0]])
    c = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 0.0]])  # documents 1 and 2 tie (cosine 1)
    assert ranked(q, c, 3).tolist() == [[1, 2, 0]]


def test_the_shipped_set_has_no_query_in_its_corpus():
    queries, corpus, relevant = pairs_retrieval_set(QQP_DEV)
    assert len(queries) > 900 and len(corpus) > 4000
    assert not set(queries) & set(corpus) and all(len(r) == 1 for r in relevant)


def test_equals_sentence_transformers_information_retrieval_evaluator(tmp_path, tiny_bert_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.evaluation.retrieval import RetrievalEvaluator
    from orchestrator.models import load_encoder, resolve_model_source

    pairs = Path(tmp_path / "pairs.tsv")  # a slice of the shipped pairs: 150 queries over ~450 texts
    lines = QQP_DEV.read_text(encoding="utf-8").splitlines()
    dup = [x for x in lines[1:] if x.split("\t")[2] == "1"][:150]
    non = [x for x in lines[1:] if x.split("\t")[2] == "0"][:150]
    pairs.write_text("\n".join([lines[0], *dup, *non]) + "\n", encoding="utf-8")
    folder = resolve_model_source(
        str(tiny_bert_dir)
    )  # a random encoder: imperfect rankings, every metric informative
    model, tok = load_encoder(str(folder))
    ours = RetrievalEvaluator("q", pairs)(
        HFEncoder(model, tok, pooling="mean", batch_size=64, max_length=128)
    )

    queries, corpus, relevant = pairs_retrieval_set(pairs)
    ir = InformationRetrievalEvaluator(
        {f"q{i}": t for i, t in enumerate(queries)},
        {f"{i:06d}": t for i, t in enumerate(corpus)},
        {f"q{i}": {f"{j:06d}" for j in r} for i, r in enumerate(relevant)},
        accuracy_at_k=[1, 10],
        precision_recall_at_k=[1, 5, 10],
        write_csv=False,
    )
    theirs = ir(SentenceTransformer(str(folder), device="cpu"))
    pick = {key: v for key, v in theirs.items() if "cosine_" in key}
    for ours_key, suffix in [
        ("q_ndcg_at_10", "ndcg@10"),
        ("q_mrr_at_10", "mrr@10"),
        ("q_map_at_100", "map@100"),
        ("q_recall_at_1", "recall@1"),
        ("q_recall_at_5", "recall@5"),
        ("q_recall_at_10", "recall@10"),
        ("q_accuracy_at_1", "accuracy@1"),
        ("q_accuracy_at_10", "accuracy@10"),
    ]:
        [value] = [v for key, v in pick.items() if key.endswith(f"cosine_{suffix}")]
        assert ours[ours_key] == pytest.approx(value, abs=1e-9), (ours_key, ours[ours_key], value)
    assert (
        0.0 < ours["q_ndcg_at_10"] < 0.9 and 0.0 < ours["q_recall_at_10"] < 1.0
    )  # neither all misses nor all hits
