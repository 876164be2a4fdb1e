"""SBERT (trainers/sbert.py): the loss against the cosine regression computed by hand, the scored pairs' reader
(every bad row named by file and line), and the recipe's hooks on a tiny model - no Ray here: the shared loop
is tested with the other recipes, the compare arm that starts from another stage in test_compare_start.py."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.data.labelled import ScoredPairs
from orchestrator.errors import DataError
from trainers.sbert import SBERTConfig, SBERTRecipe, compute_loss, export_model, prepare_data


def tiny_cfg(model_dir, pairs: str = "data/sts/stsb-train.tsv", **kw) -> SBERTConfig:
    return SBERTConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir), "max_length": 32, "pooling": "mean"},
            "train_pairs": {"path": pairs},
            "eval": {"batch_size": 64, "max_length": 32, "tasks": ["stsb"]},
            **kw,
        }
    )


def test_loss_is_the_mse_between_the_cosine_and_the_scaled_score(tiny_bert_dir):
    """L = mean (cos(u, v) − s / s_max)², u and v the mean-pooled states of each side, computed by hand."""
    cfg = tiny_cfg(tiny_bert_dir)
    recipe = SBERTRecipe(cfg, {"shards": "", "rows_per_worker": 8})
    torch.manual_seed(0)
    model = recipe.build().eval()
    batch = {
        "text_a": ["a man is playing a guitar", "the cat sat on the mat"],
        "text_b": ["a man plays the guitar loudly", "two dogs run across a field"],
        "label": [0.9, 0.1],
    }
    got, logs = compute_loss(model, recipe.tokenizer, batch, cfg)
    with torch.no_grad():
        cosines = []
        for a, b in zip(batch["text_a"], batch["text_b"], strict=True):
            vecs = []
            for text in (a, b):  # one sentence at a time: no padding, the mean over every token
                ids = recipe.tokenizer(text, return_tensors="pt")["input_ids"]
                states = model.encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[
                    0
                ]
                vecs.append(states.mean(0))
            cosines.append(float(vecs[0] @ vecs[1] / (vecs[0].norm() * vecs[1].norm())))
    want = sum((c - y) ** 2 for c, y in zip(cosines, batch["label"], strict=True)) / 2
    assert float(got.detach()) == pytest.approx(want, rel=1e-4) and logs["loss"] == pytest.approx(
        want, rel=1e-4
    )


def write(tmp_path, text: str):
    p = tmp_path / "pairs.tsv"
    p.write_text(text)
    return str(p)


def test_scored_pairs_are_scaled_and_every_bad_row_is_named_by_line(tmp_path):
    good = write(tmp_path, "sentence1\tsentence2\tscore\na b\tc d\t5.000\ne f\tg h\t1.25\n")
    assert ScoredPairs(path=good).rows() == [("a b", "c d", 1.0), ("e f", "g h", 0.25)]
    assert ScoredPairs(path=good, score_max=10, limit=1).rows() == [("a b", "c d", 0.5)]
    for body, message in [
        ("sentence1\tsentence2\tscore\na\tb\tfive\n", r"pairs\.tsv:2: score 'five' is not a number"),
        (
            "sentence1\tsentence2\tscore\na\tb\t1\nc\td\t5.5\n",
            r"pairs\.tsv:3: score 5\.5 is outside \[0, 5\.0\]",
        ),
        ("sentence1\tsentence2\tscore\na\t \t1\n", r"pairs\.tsv:2: empty sentence2"),
        ("sentence1\tscore\na\t1\n", r"pairs\.tsv:1: missing column\(s\) sentence2"),
        ("", r"pairs\.tsv: empty file"),
    ]:
        with pytest.raises(DataError, match=message):
            ScoredPairs(path=write(tmp_path, body)).rows()
    with pytest.raises(DataError, match=r"pairs\.tsv:2: score 4\.0 is outside \[0, 1\.0\]"):
        ScoredPairs(path=write(tmp_path, "sentence1\tsentence2\tscore\na\tb\t4\n"), score_max=1.0).rows()


def test_a_bad_pairs_file_fails_the_preflight_check(tmp_path, tiny_bert_dir):
    cfg = tiny_cfg(tiny_bert_dir, write(tmp_path, "sentence1\tsentence2\tsimilarity\na\tb\t1\n"))
    with pytest.raises(DataError, match=r"missing column\(s\) score"):
        cfg.check_data()


def test_recipe_hooks_fit_the_pairs_and_export_the_encoder(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    pairs = write(
        tmp_path,
        "sentence1\tsentence2\tscore\n"
        "a man is playing a guitar\ta man plays a guitar\t5\n"
        "the cat sat on the mat\ttwo dogs run across a field\t0\n"
        "a woman is slicing onions\ta woman cuts an onion\t4\n",
    )
    cfg = tiny_cfg(tiny_bert_dir, pairs, run={"storage": str(tmp_path / "store")})
    shards = prepare_data(cfg)
    assert prepare_data(cfg) == shards  # content-addressed: written once
    import pyarrow.parquet as pq

    table = pq.read_table(f"{shards}/shards").to_pydict()
    assert table["label"] == [1.0, 0.0, 0.8] and table["text_b"][1] == "two dogs run across a field"
    recipe = SBERTRecipe(cfg, {"shards": shards, "rows_per_worker": 3})
    recipe.setup()
    torch.manual_seed(0)
    model = recipe.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first, _ = recipe.loss(model, table, {"step": 0, "epoch": 0})
    for _ in range(10):
        loss, _ = recipe.loss(model, table, {"step": 0, "epoch": 0})
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert math.isfinite(float(first)) and float(loss) < float(first) / 2
    assert recipe.dev(model) == {}  # no labelled dev set unless one is configured
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": model.state_dict()}, ckpt / "model.pt")
    out = export_model(cfg, ckpt, tmp_path / "model")
    st = SentenceTransformer(str(out), device="cpu")
    got = st.encode(["a man is playing a guitar"], convert_to_tensor=True)
    with torch.no_grad():
        enc = recipe.tokenizer(["a man is playing a guitar"], return_tensors="pt")
        want = model(enc["input_ids"], enc["attention_mask"])
    assert torch.allclose(got, want, atol=1e-5)  # the export is the trained encoder, read with its pooling
    from trainers.tsdae import TSDAERecipe

    test = "the test (the method's evaluation)"
    assert SBERTRecipe.comparable(cfg)[test] == TSDAERecipe.comparable(cfg)[test]  # one test: one comparison
