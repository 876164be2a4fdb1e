"""Siamese adaptation: balanced deterministic episodes, Δ cosine distance on a toy set, the
losses, NAIVE's head dropped at export, and a Ray Train run whose model loads in SentenceTransformer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.data.episodes import ClassIndex, make_pairs
from orchestrator.errors import DataError
from orchestrator.evaluation.separation import delta_cosine_distance, same_class_map
from trainers.siamese import SiameseConfig, pair_loss

ROWS = [(f"text {i}", c) for i, c in enumerate("aaaabbbcccccd")]  # 'd' is a singleton class


def test_pairs_are_balanced_and_deterministic():
    ix = ClassIndex.build("toy", ROWS + [("   ", "a")])
    assert ix.skipped_empty == 1 and ix.singletons == ["d"]
    pairs = make_pairs(ix, 400, seed=7)
    assert sum(y for _, _, y in pairs) == 200  # exactly half same-class
    label = dict(ROWS)
    for a, b, y in pairs:
        assert a != b and (label[a] == label[b]) == (y == 1.0)
    assert make_pairs(ix, 400, seed=7) == pairs and make_pairs(ix, 400, seed=8) != pairs
    assert make_pairs(ix, 100, seed=7, start=300) == pairs[300:]  # pair k does not depend on the batching
    assert any("text 12" in (a, b) for a, b, y in pairs if y == 0)  # the singleton appears in different pairs


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("x", "a"), ("y", "a")], "1 class"),
        ([("x", "a"), ("y", "b")], "no class has two texts"),
        ([("", "a"), (" ", "b")], "0 class"),
    ],
)
def test_pairs_refuse_unusable_sets(rows, message):
    with pytest.raises(DataError, match=f"data set 'bad': .*{message}"):
        ClassIndex.build("bad", rows)


def test_delta_cosine_distance_on_a_hand_made_set():
    """Same-class pairs are at cosine distance 0.4, different-class pairs at 1: Δ = 0.6 exactly,
    whichever pairs are drawn."""
    a = 0.5
    emb = np.array([[1, a, 0, 0], [1, -a, 0, 0], [0, 0, 1, a], [0, 0, 1, -a]], dtype=float)
    d = delta_cosine_distance(emb, ["x", "x", "y", "y"], n_pairs=200)
    assert d["same_distance"] == pytest.approx(0.4) and d["different_distance"] == pytest.approx(1.0)
    assert d["delta"] == pytest.approx(0.6)
    # shuffled classes: no separation
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(200, 8))
    assert abs(delta_cosine_distance(noise, list("xy" * 100), n_pairs=500)["delta"]) < 0.05
    assert same_class_map(emb, ["x", "x", "y", "y"]) == pytest.approx(1.0)


def test_pair_losses():
    cfg = SiameseConfig.model_validate({"train_sets": [{"name": "t", "path": "x.tsv"}]})
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([1.0, 0.0])
    assert pair_loss(u, v, y, cfg).item() == pytest.approx(0.0)  # cos 1 for same, 0 for different
    assert pair_loss(u, v, 1 - y, cfg).item() == pytest.approx(1.0)
    contrastive = cfg.model_copy(update={"loss": "contrastive", "margin": 0.5})
    # same pair at d=0 → 0; different pair at d=1 ≥ margin → 0; swapped: ½(1²) / 2 + ½(0.5²) / 2
    assert pair_loss(u, v, y, contrastive).item() == pytest.approx(0.0)
    assert pair_loss(u, v, 1 - y, contrastive).item() == pytest.approx((0.5 * 1 + 0.5 * 0.25) / 2)


def test_config_errors():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exactly one train set"):
        SiameseConfig.model_validate(
            {"mode": "naive", "train_sets": [{"name": "a", "path": "a"}, {"name": "b", "path": "b"}]}
        )
    with pytest.raises(ValidationError, match="train_sets"):
        SiameseConfig.model_validate({"train_sets": []})


def test_naive_head_is_gone_from_the_export(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from trainers.siamese import build_model, classes_of, export_model

    cfg = SiameseConfig.model_validate(
        {
            "mode": "naive",
            "model": {"name_or_path": str(tiny_bert_dir), "max_length": 32},
            "train_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}],
        }
    )
    classes = classes_of(cfg)
    assert classes == ["negative", "positive"]
    model, _ = build_model(cfg, len(classes))
    assert model.head is not None and model.head[2].out_features == 2
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": model.state_dict()}, ckpt / "model.pt")
    out = export_model(cfg, ckpt, tmp_path / "model")
    keys = AutoModel.from_pretrained(out).state_dict().keys()
    assert not any(k.startswith("head") for k in keys) and "embeddings.word_embeddings.weight" in keys
    assert json.loads((Path(out) / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    assert SentenceTransformer(str(out), device="cpu").encode(["a tweet"]).shape == (1, 32)


def test_naive_head_warm_up_holds_the_encoder_bit_identical_then_lets_it_move(tiny_bert_dir):
    """``head_warmup_steps: 2`` - through the recipe's own optimiser groups and loss, the encoder stays
    bit-identical for 2 steps while NAIVE's head learns (at ``head_lr``); at step 3 the encoder moves."""
    from trainers import common
    from trainers.siamese import SiameseRecipe

    cfg = SiameseConfig.model_validate(
        {
            "mode": "naive",
            "head_warmup_steps": 2,
            "head_lr": 1e-2,
            "model": {"name_or_path": str(tiny_bert_dir), "max_length": 32},
            "train": {"lr": 1e-3, "batch_size": 4},
            "train_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}],
        }
    )
    torch.manual_seed(0)
    recipe = SiameseRecipe(cfg, {})
    recipe.setup()
    module = recipe.build()
    recipe.stepper = stepper = common.make_stepper(module, cfg, 64, **recipe.optimizer_extras(module))
    lrs = {g["part"]: g["lr"] for g in stepper.optimizer.param_groups}
    assert lrs == {"encoder": 1e-3, "head": 1e-2}
    enc0 = {n: p.detach().clone() for n, p in module.encoder.named_parameters()}
    batch = {
        "text": ["i love it", "awful day", "so happy", "worst ever"],
        "label": ["positive", "negative"] * 2,
    }
    for step in range(3):
        head0 = [p.detach().clone() for p in module.head.parameters()]
        loss, _ = recipe.loss(stepper.model, batch, {"step": step, "epoch": 0})
        stepper.step(loss)
        same = all(torch.equal(enc0[n], p) for n, p in module.encoder.named_parameters())
        assert same == (step < 2), step
        assert all(not torch.equal(a, b) for a, b in zip(head0, module.head.parameters(), strict=True))


def test_naive_head_options_refused_where_they_mean_nothing():
    base = {"train_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}]}
    with pytest.raises(ValueError, match="NAIVE's .*a SIAMESE run has no head"):
        SiameseConfig.model_validate({**base, "head_warmup_steps": 5})
    with pytest.raises(ValueError, match="must be below train.max_steps"):
        SiameseConfig.model_validate(
            {**base, "mode": "naive", "head_warmup_steps": 5, "train": {"max_steps": 5}}
        )
    with pytest.raises(ValueError, match="not under DeepSpeed"):
        SiameseConfig.model_validate(
            {**base, "mode": "naive", "head_warmup_steps": 5, "deepspeed": {"stage": 2}}
        )


def test_naive_and_siamese_compare_at_equal_encoder_work():
    """A comparison counts the encoder's steps and texts per step: NAIVE with a 60-step head warm-up, 120 steps
    and batch 32 is comparable with SIAMESE at 60 steps of 16 pairs; without the warm-up it is refused."""
    from orchestrator.drivers.compare_plan import check_comparable
    from orchestrator.errors import ConfigError
    from trainers.siamese import SiameseRecipe

    sets = {"train_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}]}
    siamese = SiameseConfig.model_validate({**sets, "train": {"batch_size": 16, "max_steps": 60}})
    naive = SiameseConfig.model_validate(
        {**sets, "mode": "naive", "head_warmup_steps": 60, "train": {"batch_size": 32, "max_steps": 120}}
    )
    arms = {"siamese": (SiameseRecipe, siamese), "naive": (SiameseRecipe, naive)}
    check_comparable(arms, "t.yaml")
    cold = naive.model_copy(update={"head_warmup_steps": 0})
    with pytest.raises(ConfigError, match="arm 'naive' differs .* step budget"):
        check_comparable({**arms, "naive": (SiameseRecipe, cold)}, "t.yaml")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_siamese_under_ray_train(ray_cluster, tiny_bert_dir, tmp_path):
    import pyarrow.parquet as pq
    from sentence_transformers import SentenceTransformer

    from orchestrator.data.episodes import write_episodes
    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer, export_and_test, fit

    # episodes on Ray Data: the same pairs whatever the block count
    sets = {"toy": ROWS}
    m1 = write_episodes(sets, 60, str(tmp_path / "e1"), seed=3, blocks=1)
    write_episodes(sets, 60, str(tmp_path / "e3"), seed=3, blocks=3)

    def pairs(d):
        t = pq.read_table(tmp_path / d / "shards").to_pydict()
        return sorted(zip(t["text_a"], t["text_b"], t["label"], strict=True))

    assert pairs("e1") == pairs("e3") == sorted(make_pairs(ClassIndex.build("toy", ROWS), 60, 3))
    assert m1["same_class_pairs"] == {"toy": 30} and m1["sets"]["toy"]["singleton_classes"] == ["d"]

    method = get_method("siamese")
    cfg = SiameseConfig.model_validate(
        {
            "model": {"name_or_path": str(tiny_bert_dir), "max_length": 32},
            "train_sets": [
                {
                    "name": "sanders",
                    "path": "data/tweets/sanders.tsv",
                    "label_column": "sentiment",
                    "where": {"sentiment": ["positive", "negative"]},
                }
            ],
            "test_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}],
            "n_pairs": 160,
            "eval_pairs": 200,
            "train": {"lr": 1e-3, "batch_size": 16, "max_steps": 4, "eval_steps": 2},
            "scaling": {"num_workers": 2, "cpus_per_worker": 1},
            "run": {"storage": str(tmp_path / "store")},
        }
    )
    shards = method.prepare_data(cfg)
    manifest = json.loads((Path(shards) / "manifest.json").read_text())
    assert manifest["rows"] == 160 and manifest["same_class_pairs"] == {"sanders": 80}
    outcome = fit(build_trainer(method, cfg, shards, name="siamese"), method, cfg)
    assert [int(r["step"]) for r in outcome.history] == [2, 4]
    out, report = export_and_test(method, cfg, outcome, tmp_path / "model")
    assert report.headline == "delta_mean" and {"s140_delta", "s140_map"} <= set(report.metrics)
    assert SentenceTransformer(str(out), device="cpu").encode(["a tweet"]).shape == (1, 32)


def test_the_table_1_comparisons_put_each_set_in_the_papers_role():
    """The paper's Table 1 is a comparison per experiment (ORIG measured, NAIVE the reference, SIAMESE, ALL):
    Sentiment140 trains and Sanders tests; Sanders' topics train and SemEval's (PIT-2015) test; seen and unseen
    crisis events never overlap; ALL trains on the three training sets at once."""
    import yaml

    from orchestrator.config import REPO_ROOT

    roles = {}
    for exp in ("sentiment", "topics", "crisis"):
        job = yaml.safe_load((REPO_ROOT / "configs" / "compare" / f"siamese_{exp}.yaml").read_text())
        common = job["common_overrides"]
        roles[exp] = ([s["name"] for s in common["train_sets"]], [s["name"] for s in common["test_sets"]])
        assert set(job["arms"]) == {"naive", "siamese", "all"} and job["reference"] == "naive"
        assert len(job["arms"]["all"]["overrides"]["train_sets"]) == 3 and len(job["seeds"]) >= 3
        if exp == "crisis":
            seen = set(common["train_sets"][0]["where"]["event"])
            assert not seen & set(common["test_sets"][0]["where"]["event"])
    assert roles["sentiment"] == (["sentiment140"], ["sanders_sentiment"])
    assert roles["topics"] == (["sanders_topics"], ["pit2015_topics"])
    assert roles["crisis"] == (["crisis_seen_events"], ["crisis_unseen_events"])


def test_a_wrong_column_fails_the_preflight_naming_the_file(tmp_path, monkeypatch):
    """A labelled set read with a column its file does not have (Sanders' class column is 'sentiment') fails
    in the preflight - before Ray, before any base model is measured - with the file, the line and the header."""
    from orchestrator.drivers.train import preflight

    monkeypatch.chdir(tmp_path)  # the preflight makes nothing there
    cfg = SiameseConfig.model_validate(
        {
            "train_sets": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}],
            "test_sets": [
                {
                    "name": "sanders",
                    "path": "data/tweets/sanders.tsv",
                    "where": {"label": ["positive", "negative"]},
                }
            ],
            "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/m.db"},
            "run": {"storage": str(tmp_path / "store")},
        }
    )
    with pytest.raises(
        DataError, match=r"sanders\.tsv:1: missing column\(s\) label \(header: sentence, sentiment, topic\)"
    ):
        preflight(cfg)
    assert not (tmp_path / "m.db").exists()
