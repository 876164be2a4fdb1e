"""Hard-negative mining (``jobs/mine_negatives.py``): the same rows as sentence-transformers'
``util.mine_hard_negatives`` on the same model, rows, corpus and filters; the running top-k equal to one top-k over
the whole corpus; the passages the driver keeps bounded; bad inputs refused before Ray, naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from orchestrator.config import validate
from orchestrator.data.labelled import read_table
from orchestrator.data.negatives import CorpusScan, MineConfig, RunningTopK, check, mine
from orchestrator.data.pairs import TrainingRows
from orchestrator.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]


def test_running_topk_over_blocks_equals_one_topk_over_the_whole_corpus():
    torch.manual_seed(0)
    queries, corpus = torch.randn(7, 16), torch.randn(300, 16)
    top = RunningTopK(queries, 12)
    for start in range(0, 300, 37):  # uneven blocks, the last one short
        top.add(corpus[start : start + 37], torch.arange(start, min(start + 37, 300)))
    want_scores, want_indices = torch.topk(queries @ corpus.T, 12, dim=1)
    assert torch.equal(top.indices, want_indices)
    assert torch.allclose(top.scores, want_scores)
    short = RunningTopK(queries, 12)  # fewer rows than k: padded with -inf / -1, as the reference pads
    short.add(corpus[:5], torch.arange(5))
    assert (short.indices[:, 5:] == -1).all() and torch.isinf(short.scores[:, 5:]).all()


def test_the_driver_keeps_the_texts_of_the_k_best_only():
    torch.manual_seed(1)
    queries = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1)
    scan = CorpusScan(queries, [["p0"], ["p1"], ["p2"]], k=2)
    corpus = torch.nn.functional.normalize(torch.randn(400, 8), dim=-1)
    texts = [f"p{i}" for i in range(400)]
    for start in range(0, 400, 10):
        scan.add(
            texts[start : start + 10] + texts[:2], corpus[start : start + 10].numpy()
        )  # repeats: counted once
        assert len(scan.texts) <= 2 * 6 + 10  # flat: never the corpus
    assert scan.n == 400
    want = torch.topk(queries @ corpus.T, 2, dim=1).indices
    assert torch.equal(scan.top.indices, want)
    assert all(scan.texts[int(i)] == f"p{int(i)}" for i in want.flatten())
    ids, scores = scan.positives([["p0"], ["p1"], ["p2"]])
    assert ids == [[0], [1], [2]]
    assert scores[2][0] == pytest.approx(float(queries[2] @ corpus[2]), abs=1e-6)


def qqp_case(tmp_path: Path) -> tuple[list[list[str]], Path]:
    """150 QQP duplicate pairs (one question given a second positive) and a BEIR corpus of 200 other QQP questions,
    every third with a title."""
    rows = [
        v
        for _, v in read_table(
            str(ROOT / "data/paraphrase/qqp-train-duplicates.tsv"), ("sentence1", "sentence2"), limit=150
        )
    ]
    rows.insert(5, [rows[0][0], rows[7][1]])  # a query with two positives: the margin reads its weaker one
    dev = [v[0] for _, v in read_table(str(ROOT / "data/paraphrase/qqp-dev.tsv"), ("sentence1",), limit=200)]
    folder = tmp_path / "beir"
    folder.mkdir()
    with open(folder / "corpus.jsonl", "w") as f:
        for i, text in enumerate(dev):
            f.write(
                json.dumps({"_id": f"d{i}", "text": text, **({"title": "Quora"} if i % 3 == 0 else {})})
                + "\n"
            )
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("q\tpos\n" + "".join(f"{a}\t{p}\n" for a, p in rows))
    return rows, folder


@pytest.mark.slow
@pytest.mark.services
def test_mined_negatives_are_sentence_transformers_mine_hard_negatives(
    ray_cluster, tmp_path, default_encoder
):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from orchestrator.models import resolve_model_source

    rows, folder = qqp_case(tmp_path)
    settings = dict(range_min=1, relative_margin=0.05, max_score=0.8, min_score=0.1, num_negatives=3)
    cfg = MineConfig(
        pairs=TrainingRows(path=str(tmp_path / "pairs.tsv"), anchor_column="q", positive_column="pos"),
        corpus={"path": str(folder), "format": "beir"},
        block_rows=64,  # several blocks: the running top-k merges
        output=str(tmp_path / "mined.parquet"),
        **settings,
    )
    summary = mine(cfg, check(cfg))
    ours = pq.read_table(tmp_path / "mined.parquet").to_pydict()

    model = SentenceTransformer(str(resolve_model_source("default")), device="cpu")
    corpus = [
        (f"Quora {json.loads(line)['text']}" if i % 3 == 0 else json.loads(line)["text"])
        for i, line in enumerate((folder / "corpus.jsonl").read_text().splitlines())
    ]
    ref = mine_hard_negatives(
        Dataset.from_dict({"q": [a for a, _ in rows], "pos": [p for _, p in rows]}),
        model,
        corpus=corpus,
        output_format="n-tuple",
        batch_size=64,
        verbose=False,
        **settings,
    ).to_dict()
    assert summary["dropped"].get("relative_margin") and summary["dropped"].get(
        "max_score"
    )  # the filters bit
    assert summary["corpus"] == len(set(corpus) | {p for _, p in rows})
    assert ours["anchor"] == ref["q"] and ours["positive"] == ref["pos"]
    assert len(ours["anchor"]) > 120
    for m in (1, 2, 3):
        assert ours[f"negative_{m}"] == ref[f"negative_{m}"], m
    assert summary["rows"] == len(ref["q"])
    # and the recipe reads the file as it was written
    read = TrainingRows(
        path=str(tmp_path / "mined.parquet"),
        format="parquet",
        anchor_column="anchor",
        positive_column="positive",
        negative_columns=["negative_1", "negative_2", "negative_3"],
    ).rows()
    assert read[0] == [ours[c][0] for c in ("anchor", "positive", "negative_1", "negative_2", "negative_3")]


def test_bad_inputs_are_refused_before_ray_naming_file_and_line(tmp_path):
    rows, folder = qqp_case(tmp_path)
    base = {
        "pairs": {"path": str(tmp_path / "pairs.tsv"), "anchor_column": "q", "positive_column": "pos"},
        "corpus": {"path": str(folder)},
        "output": str(tmp_path / "out.parquet"),
    }
    check(validate(MineConfig, base, "mine.yaml"))  # the good case passes
    with open(folder / "corpus.jsonl", "a") as f:
        f.write('{"_id": "x", "text": "fine"}\n{"_id": "y" "text": "broken"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl:202: invalid JSON"):
        check(validate(MineConfig, base, "mine.yaml"))
    (folder / "corpus.jsonl").write_text('{"text": "no id"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl:1: no _id"):
        check(validate(MineConfig, base, "mine.yaml"))
    (folder / "corpus.jsonl").write_text('{"_id": "a", "text": "fine"}\n')
    (tmp_path / "out.parquet").write_bytes(b"an earlier run's")
    with pytest.raises(DataError, match=r"out.parquet: exists already"):
        check(validate(MineConfig, base, "mine.yaml"))
    assert (tmp_path / "out.parquet").read_bytes() == b"an earlier run's"  # untouched
    with pytest.raises(ConfigError, match="num_negatives 5 exceeds the 3 candidates"):
        validate(MineConfig, {**base, "num_negatives": 5, "range_min": 1, "range_max": 4}, "mine.yaml")
    (tmp_path / "pairs.tsv").write_text("q\tpos\nonly a query\t\n")
    with pytest.raises(DataError, match=r"pairs.tsv:2: "):
        check(validate(MineConfig, base, "mine.yaml"))


@pytest.mark.parametrize(
    "preset", sorted(p.stem for p in (ROOT / "configs" / "mine_negatives").glob("*.yaml"))
)
def test_every_mining_preset_validates(preset):
    from orchestrator.config import load_config

    cfg = load_config(MineConfig, ROOT / "configs" / "mine_negatives" / f"{preset}.yaml")
    assert cfg.pairs.rows() and cfg.output.endswith(".parquet")
