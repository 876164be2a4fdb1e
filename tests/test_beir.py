"""Your own retrieval data in BEIR's format: scored as sentence-transformers' InformationRetrievalEvaluator scores
the same folder on the same model, and every malformed file refused in one line naming its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import DataError
from orchestrator.evaluation.beir import BeirEvaluator, read_beir
from orchestrator.evaluation.retrieval import QQP_DEV


def beir_folder(root: Path, n: int = 120) -> Path:
    """A BEIR folder from a slice of the shipped QQP pairs: each duplicate's first question a query, its second a
    document with a title (graded 2), the non-duplicates' questions distractors; a 0-score row and a query
    without qrels, which no metric counts."""
    lines = QQP_DEV.read_text(encoding="utf-8").splitlines()[1:]
    dup = [x.split("\t") for x in lines if x.split("\t")[2] == "1"][:n]
    non = [x.split("\t") for x in lines if x.split("\t")[2] == "0"][:n]
    corpus = [{"_id": f"d{i}", "title": "question", "text": b} for i, (_, b, *_) in enumerate(dup)]
    corpus += [
        {"_id": f"n{i}{s}", "text": t} for i, (a, b, *_) in enumerate(non) for s, t in (("a", a), ("b", b))
    ]
    queries = [{"_id": f"q{i}", "text": a} for i, (a, *_) in enumerate(dup)] + [
        {"_id": "lonely", "text": "x"}
    ]
    qrels = [f"q{i}\td{i}\t2" for i in range(len(dup))] + ["q0\tn0a\t0"]
    folder = root / "mine"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    return folder


def test_equals_sentence_transformers_information_retrieval_evaluator(tmp_path, tiny_bert_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import load_encoder, resolve_model_source

    folder = beir_folder(tmp_path)
    model_dir = resolve_model_source(str(tiny_bert_dir))  # a random encoder: imperfect rankings
    model, tok = load_encoder(str(model_dir))
    ours = BeirEvaluator("beir_mine", str(folder))(HFEncoder(model, tok, pooling="mean", batch_size=64))

    # the reference reads the same files its own way: BEIR's title + " " + text, relevant where score > 0
    corpus = {}
    for line in (folder / "corpus.jsonl").read_text().splitlines():
        row = json.loads(line)
        corpus[row["_id"]] = (row.get("title", "") + " " + row["text"]).strip()
    queries = {
        r["_id"]: r["text"] for r in map(json.loads, (folder / "queries.jsonl").read_text().splitlines())
    }
    relevant: dict[str, set[str]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, score = line.split("\t")
        if int(score) > 0:
            relevant.setdefault(q, set()).add(d)
    ir = InformationRetrievalEvaluator(
        {q: queries[q] for q in relevant},
        corpus,
        relevant,
        accuracy_at_k=[1, 10],
        precision_recall_at_k=[1, 5, 10, 100],
        write_csv=False,
    )
    theirs = {
        k: v for k, v in ir(SentenceTransformer(str(model_dir), device="cpu")).items() if "cosine_" in k
    }
    names = ["ndcg@10", "mrr@10", "map@100", "accuracy@1", "accuracy@10"]
    names += [f"recall@{k}" for k in (1, 5, 10, 100)]
    for name in names:
        [value] = [v for key, v in theirs.items() if key.endswith(f"cosine_{name}")]
        key = "beir_mine_" + name.replace("@", "_at_")
        assert ours[key] == pytest.approx(value, abs=1e-9), (key, ours[key], value)
    assert 0.0 < ours["beir_mine_ndcg_at_10"] < 0.9  # neither all misses nor all hits
    assert next(iter(ours)) == "beir_mine_ndcg_at_10"  # the headline


BAD = [
    ("corpus.jsonl", 2, "{not json\n", "corpus.jsonl:2: invalid JSON"),
    ("corpus.jsonl", 2, '["a list"]\n', "corpus.jsonl:2: not a JSON object"),
    ("corpus.jsonl", 2, '{"text": "no id"}\n', "corpus.jsonl:2: no _id"),
    (
        "corpus.jsonl",
        2,
        '{"_id": "d0", "text": "again"}\n',
        "corpus.jsonl:2: _id 'd0' repeats an earlier line's",
    ),
    ("queries.jsonl", 2, '{"_id": "q9", "text": "  "}\n', "queries.jsonl:2: _id 'q9' has no text"),
    ("qrels/test.tsv", 3, "q0\tnowhere\t1\n", "qrels/test.tsv:3: corpus-id 'nowhere' is not in corpus.jsonl"),
    ("qrels/test.tsv", 3, "q404\td0\t1\n", "qrels/test.tsv:3: query-id 'q404' is not in queries.jsonl"),
    ("qrels/test.tsv", 3, "q0\td0\t-1\n", "qrels/test.tsv:3: score -1 is negative"),
    ("qrels/test.tsv", 3, "q0\td0\thigh\n", "qrels/test.tsv:3: score 'high' is not an integer"),
]


@pytest.mark.parametrize(("name", "line", "text", "message"), BAD, ids=[b[3].split(": ", 1)[1] for b in BAD])
def test_a_malformed_file_is_refused_naming_its_file_and_line(tmp_path, name, line, text, message):
    folder = tmp_path / "mine"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text('{"_id": "d0", "title": "t", "text": "a cat"}\n')
    (folder / "queries.jsonl").write_text('{"_id": "q0", "text": "cats"}\n')
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    assert read_beir(str(folder)).relevant == [{0}]
    target = folder / name
    lines = target.read_text().splitlines(keepends=True)
    target.write_text("".join(lines[: line - 1]) + text)
    with pytest.raises(DataError) as err:
        read_beir(str(folder))
    assert str(err.value).startswith(f"{folder}/{message}")  # the file, the line, what is wrong


def test_a_domain_task_without_its_folder_and_a_preflight_that_reads_it(tmp_path):
    from orchestrator.evaluation.domain import check_domain_tasks

    with pytest.raises(DataError, match=r"'beir_mine': give its BEIR folder \(eval.domain_paths.beir_mine\)"):
        check_domain_tasks(["beir_mine"], {})
    folder = beir_folder(tmp_path, n=5)
    check_domain_tasks(["beir_mine"], {"beir_mine": str(folder)})
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\tgone\t1\n")
    with pytest.raises(DataError, match=r"test.tsv:3: corpus-id 'gone' is not in corpus.jsonl"):
        check_domain_tasks(["beir_mine"], {"beir_mine": str(folder)})


def test_running_top_over_chunks_is_the_whole_corpus_ranking_ties_included():
    """Chunk by chunk, the running top-k equals ``ranked`` over the whole corpus at once - the same positions in
    the same order, exact ties (repeated documents) by ascending position, across chunk boundaries."""
    import numpy as np

    from orchestrator.evaluation.beir import RunningTop, unit
    from orchestrator.evaluation.retrieval import ranked

    rng = np.random.default_rng(0)
    # one-hot documents: each score is one coordinate of the query, exact however a product is blocked, and every
    # document sharing its coordinate ties with it exactly (about 7 each, across chunk boundaries)
    docs = np.eye(8)[rng.integers(0, 8, size=60)]
    queries = rng.normal(size=(6, 8))
    want = ranked(queries, docs, 12)
    assert len({tuple(row) for row in want}) == 6
    for chunk in (1, 7, 13, 60):
        top = RunningTop(unit(queries), 12)
        for start in range(0, len(docs), chunk):
            top.add(unit(docs[start : start + chunk]))
        assert np.array_equal(top.indices, want), chunk


def test_the_corpus_is_encoded_once_a_chunk_at_a_time_and_scores_as_read_whole(tmp_path, tiny_bert_dir):
    """The test never holds more than ``chunk_rows`` documents: each corpus document is encoded once, in calls of at
    most that many; the figures are those of the corpus encoded in one call."""
    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import load_encoder

    model, tok = load_encoder(str(tiny_bert_dir))
    encoder = HFEncoder(model, tok, pooling="mean", batch_size=64)
    calls: list[int] = []

    class Counting:
        def encode(self, texts, **kw):
            calls.append(len(texts))
            return encoder.encode(texts, **kw)

    folder = beir_folder(tmp_path, n=40)
    whole = BeirEvaluator("b", str(folder), chunk_rows=10**6)(encoder)
    chunked = BeirEvaluator("b", str(folder), chunk_rows=16)(Counting())
    queries, *corpus = calls
    assert queries == 40 and sum(corpus) == 40 * 3 and max(corpus) == 16  # each document once, 16 at a time
    assert chunked == pytest.approx(whole, abs=1e-9)
