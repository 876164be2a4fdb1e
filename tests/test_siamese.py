"""Siamese adaptation: balanced deterministic episodes, Δ cosine distance on a toy set, the
losses, NAIVE's head dropped at export, and a Ray Train run whose model loads in SentenceTransformer."""

from __future__ import annotations

import json
import time
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
    """#36.3: ``head_warmup_steps: 2`` - through the recipe's own optimiser groups and loss, the encoder stays
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


def test_experiment_presets_expand_into_valid_runs(monkeypatch):
    from orchestrator.config import load_config
    from orchestrator.drivers.experiments_config import ExperimentsConfig
    from orchestrator.errors import ConfigError

    monkeypatch.setenv("SIEVE_STORAGE", "s3://acme-sieve")  # the paper preset reads its data from the bucket
    for preset in ("smoke", "paper"):
        cfg = load_config(ExperimentsConfig, f"configs/siamese_experiments/{preset}.yaml")
        assert set(cfg.experiments) == {"sentiment", "topics", "crisis"}
        naive = cfg.run_config("crisis", "naive")
        assert naive.mode == "naive" and [s.name for s in naive.train_sets] == ["crisis_seen_events"]
        every = cfg.run_config(None, "all")
        assert len(every.train_sets) == 3 and every.n_pairs == cfg.all_pairs // 3 and every.mode == "siamese"
        # the paper's roles: Sentiment140 trains and Sanders tests; Sanders' topics train, SemEval's test
        roles = {e: (b.train.name, [t.name for t in b.test]) for e, b in cfg.experiments.items()}
        assert roles["sentiment"] == ("sentiment140", ["sanders_sentiment"])
        assert roles["topics"] == ("sanders_topics", ["pit2015_topics"])
    # seen and unseen crisis events never overlap
    train_events = set(naive.train_sets[0].where["event"])
    assert not train_events & set(naive.test_sets[0].where["event"])
    # NAIVE's own keys reach NAIVE runs only
    cfg = load_config(
        ExperimentsConfig,
        "configs/siamese_experiments/smoke.yaml",
        ["naive.head_warmup_steps=60", "naive.train.max_steps=120", "naive.train.batch_size=32"],
    )
    naive, siamese = cfg.run_config("sentiment", "naive"), cfg.run_config("sentiment", "siamese")
    assert (naive.head_warmup_steps, naive.train.max_steps, naive.train.batch_size) == (60, 120, 32)
    assert (siamese.head_warmup_steps, siamese.train.max_steps, siamese.train.batch_size) == (0, 60, 16)
    with pytest.raises(ConfigError, match=r"experiments\.x\.test: .*at least 1"):
        load_config(
            ExperimentsConfig,
            None,
            ["experiments.x.train.name=a", "experiments.x.train.path=b", "experiments.x.test=[]"],
        )


def test_results_table_and_chart(tmp_path):
    """The experiments job's per-set bookkeeping and its report (no training: hand-made results)."""
    from orchestrator.config import load_config
    from orchestrator.drivers.experiments import _per_set, write_results
    from orchestrator.drivers.experiments_config import ExperimentsConfig

    assert _per_set({"sentiment140_delta": 0.1, "sentiment140_map": 0.6, "sanders_topics_delta": 0.2}) == {
        "sentiment140": {"delta": 0.1, "map": 0.6},
        "sanders_topics": {"delta": 0.2},
    }
    cfg = load_config(ExperimentsConfig, "configs/siamese_experiments/smoke.yaml")
    sets = ["sanders_sentiment", "pit2015_topics", "crisis_unseen_events"]
    results = {
        m: {s: {"delta": 0.1 * (i + 1), "map": 0.5} for s in sets}
        for i, m in enumerate(["orig", "siamese", "all"])
    }
    write_results(tmp_path / "r", "toy", cfg, results, {"siamese-sentiment": 1}, 60.0)
    md = (tmp_path / "r" / "results.md").read_text()
    assert (
        "| sentiment | sanders_sentiment | 10.00 | 20.00 | 30.00 |" in md and "| ORIG | SIAMESE | ALL |" in md
    )
    assert (tmp_path / "r" / "delta.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_experiments_job_survives_a_cut_publish_and_resumes_once(
    ray_cluster, tiny_bert_dir, tmp_path, embedded_tracking, monkeypatch
):
    """#18: the experiments job trains and tests first (each model committed to its storage as it finishes),
    then publishes. The tracking server going away mid-publish ends the job with one line and the --resume
    command; the resume trains nothing again, finishes the publish, and a second resume adds no run and no
    version. (The outage is injected: the registry call after the first registration raises the error the
    MLflow client raises for a refused connection - a server killed at that instant is not reproducible.)"""
    import mlflow

    from orchestrator.drivers import experiments as ex
    from orchestrator.drivers import publish as pub
    from orchestrator.errors import ConfigError, TrackingError

    cfg = ex.ExperimentsConfig.model_validate(
        {
            "base": {
                "model": {"name_or_path": str(tiny_bert_dir), "max_length": 32, "pooling": "mean"},
                "n_pairs": 160,
                "eval_pairs": 100,
                "train": {"lr": 1e-3, "batch_size": 16, "max_steps": 4, "eval_steps": 2},
                "scaling": {"num_workers": 1, "cpus_per_worker": 1},
                "run": {"storage": str(tmp_path / "store")},
            },
            "experiments": {
                "sentiment": {
                    "train": {
                        "name": "sanders",
                        "path": "data/tweets/sanders.tsv",
                        "label_column": "sentiment",
                        "where": {"sentiment": ["positive", "negative"]},
                    },
                    "test": [{"name": "s140", "path": "data/tweets/sentiment140-test.tsv"}],
                }
            },
            "all_pairs": 160,
            "models": ["orig", "siamese", "all"],
        }
    )
    fits, registrations = [], []
    real_fit, real_register = ex.fit, pub.register

    def timed_fit(*a, **k):
        start = time.time()
        out = real_fit(*a, **k)
        fits.append((start, time.time()))
        return out

    monkeypatch.setattr(ex, "fit", timed_fit)

    def register_then_gone(*a, **k):
        if registrations:
            raise ConnectionError("HTTPConnectionPool: Max retries exceeded (Connection refused)")
        registrations.append(1)
        return real_register(*a, **k)

    monkeypatch.setattr(pub, "register", register_then_gone)
    with pytest.raises(TrackingError) as cut:
        ex.run_experiments(cfg, "exp", out_root=tmp_path / "outputs")
    line = str(cut.value)
    assert "went away while experiments 'exp'" in line and "--name exp --resume" in line
    assert str(tmp_path / "store") in line and len(fits) == 2
    # #22.4: two 1-CPU models fit the session's 4 logical CPUs: the second started before the first ended
    assert max(start for start, _ in fits) < min(end for _, end in fits)
    with pytest.raises(ConfigError, match="already exist"):  # a new job may not reuse the name
        ex.run_experiments(cfg, "exp", out_root=tmp_path / "outputs")

    monkeypatch.setattr(pub, "register", real_register)
    out = ex.run_experiments(cfg, "exp", out_root=tmp_path / "outputs", resume=True)
    assert len(fits) == 2  # nothing trained again
    assert out["registered"] == {"siamese-sentiment": 1, "siamese-all": 1}
    assert "published before" in out["gates"][0] and "published before" not in out["gates"][1]
    again = ex.run_experiments(cfg, "exp", out_root=tmp_path / "outputs", resume=True)
    assert len(fits) == 2 and again["registered"] == out["registered"]
    assert all("published before" in g for g in again["gates"])
    assert again["results"] == out["results"] and {"orig", "siamese", "all"} <= set(out["results"])

    client = mlflow.MlflowClient()
    exp_id = mlflow.get_experiment_by_name("sieve").experiment_id
    runs = client.search_runs([exp_id], "tags.`sieve.sweep` = 'exp'")
    assert sorted(r.data.tags.get("sieve.trial", "parent") for r in runs) == [
        "all",
        "orig",
        "parent",
        "siamese-sentiment",
    ]
    for name in ("siamese-sentiment", "siamese-all"):
        assert len(client.search_model_versions(f"name = '{name}'")) == 1
        # #38.2: Sieve's one card, as the version's description (no front matter) and in the exported folder
        desc = client.get_model_version(name, "1").description
        assert "Trained by Sieve's `siamese` recipe" in desc and "| metric | base | candidate |" in desc
        assert "No champion yet" in desc and not desc.startswith("---") and "language: en" not in desc
    card = next((tmp_path / "outputs").rglob("siamese-sentiment/README.md")).read_text()
    assert card.startswith("---") and "experiments `exp`, siamese-sentiment" in card and "Unknown" not in card
    assert (tmp_path / "outputs" / "reports" / "exp" / "results.md").is_file()
    with pytest.raises(ConfigError, match="no experiments 'nope'"):
        ex.run_experiments(cfg, "nope", out_root=tmp_path / "outputs", resume=True)


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
