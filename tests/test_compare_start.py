"""A compare arm's start stage (``arms.<name>.start``, orchestrator/drivers/compare_start.py): refused where the
arm could not stand beside the others (no Ray), and on the session's Ray cluster trained once with the arm's
seed on a tiny random BERT, its last checkpoint's encoder exported to the comparison's storage, the arm's config
pointed there, and not trained again when the trial resumes."""

from __future__ import annotations

import json

import pytest
import torch

from orchestrator.config import validate
from orchestrator.drivers.compare_plan import arm_config, start_config
from orchestrator.errors import ConfigError
from orchestrator.job_files import CompareJobConfig


def job(start: dict) -> CompareJobConfig:
    return validate(
        CompareJobConfig,
        {
            "seeds": [1],
            "arms": {
                "sbert": {"method": "sbert", "config": "configs/sbert/smoke.yaml"},
                "tsdae_sbert": {"method": "sbert", "config": "configs/sbert/smoke.yaml", "start": start},
            },
            "common_overrides": {"train.max_steps": 7},
        },
        "compare.yaml",
    )


def resolved(j: CompareJobConfig):
    return start_config(
        j, "tsdae_sbert", "compare.yaml", [], arm_config(j, "tsdae_sbert", "compare.yaml", [])
    )


def test_a_start_stage_is_validated_and_refused_where_the_arm_could_not_stand_beside_the_others():
    recipe, cfg = resolved(job({"method": "tsdae", "config": "configs/tsdae/smoke.yaml"}))
    assert recipe.name == "tsdae" and cfg.train.max_steps == 40  # the common overrides do not reach a stage
    for start, message in [
        (
            {
                "method": "tsdae",
                "config": "configs/tsdae/smoke.yaml",
                "overrides": {"model.name_or_path": "/x"},
            },
            r"arm 'tsdae_sbert': start \(tsdae\) starts from '/x', the arm from 'default'",
        ),
        (
            {
                "method": "tsdae",
                "config": "configs/tsdae/smoke.yaml",
                "overrides": {"run.storage": "elsewhere"},
            },
            r"start \(tsdae\): run.storage 'elsewhere' differs from the arm's 'outputs'",
        ),
        (
            {"method": "sifter_lstm", "config": "configs/sifter_lstm/smoke.yaml"},
            r"start \(sifter_lstm\): the method exports no sentence encoder folder",
        ),
        (
            {"method": "tsdae", "config": "configs/tsdae/smoke.yaml", "overrides": {"deletion_ratio": 2}},
            r"the start of arm 'tsdae_sbert'.*deletion_ratio",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            resolved(job(start))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_stage_trains_once_with_the_arms_seed_and_the_arm_reads_its_model(
    ray_cluster, tiny_bert_dir, tiny_shards, tmp_path
):
    from orchestrator import storage
    from orchestrator.drivers.compare_plan import seeded
    from orchestrator.drivers.compare_start import start_from, start_uri
    from orchestrator.models import load_encoder
    from trainers.common import load_module_state
    from trainers.sbert import SBERTConfig
    from trainers.tsdae import TSDAEConfig

    store = str(tmp_path / "store")
    common = {"name_or_path": str(tiny_bert_dir), "max_length": 16, "pooling": "mean"}
    stage = TSDAEConfig.model_validate(
        {
            "model": common,
            "data": {"shards": tiny_shards},
            "train": {"batch_size": 4, "max_steps": 2, "eval_steps": 2, "lr": 1e-3},
            "scaling": {"num_workers": 1},
            "eval": {"tasks": ["stsb"], "max_length": 32},
            "run": {"storage": store},
        }
    )
    arm = seeded(SBERTConfig.model_validate({"model": common, "run": {"storage": store}}), 7)
    where = str(tmp_path / "store" / "sweeps" / "cmp")
    got = start_from(("tsdae", stage), arm, trial="t1", shards=tiny_shards, where=where)

    model = start_uri(where, "t1")
    assert got.model.name_or_path == model and storage.is_complete(model)
    assert got.model_copy(update={"model": arm.model}) == arm  # nothing else of the arm changed
    (started,) = (tmp_path / "store" / "sweeps" / "cmp" / "start-invocations").iterdir()
    assert json.loads(started.read_text())["seed"] == 7  # the stage ran with the arm's seed, not its own 42
    reports = json.loads((tmp_path / "store" / "sweeps" / "cmp" / "reports" / "t1-start.json").read_text())
    last = max(reports, key=lambda r: r["step"])
    assert last["step"] == 2 and "checkpoint_path" in last
    # the exported encoder is the stage's last checkpoint's, not the untouched base
    trained = {
        k.removeprefix("encoder."): v
        for k, v in load_module_state(last["checkpoint_path"]).items()
        if k.startswith("encoder.")
    }
    exported, _ = load_encoder(model, add_pooling_layer=False)
    base, _ = load_encoder(str(tiny_bert_dir), add_pooling_layer=False)
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(exported.state_dict()[name], trained[name])
    assert not torch.equal(exported.state_dict()[name], base.state_dict()[name])

    again = start_from(("tsdae", stage), arm, trial="t1", shards=tiny_shards, where=where)  # a resumed trial
    assert again == got and len(list(started.parent.iterdir())) == 1  # not trained again


def test_the_leaderboard_names_the_start_stage_and_what_it_trained_for():
    from orchestrator.drivers.compare_plan import ComparePlan
    from orchestrator.results import leaderboard as lb

    j = job({"method": "tsdae", "config": "configs/tsdae/smoke.yaml"})
    arms = {n: arm_config(j, n, "compare.yaml", []) for n in j.arms}
    plan = ComparePlan(
        "cmp",
        j.model_copy(update={"reference": "sbert", "headline": "twitterpara_ap"}),
        arms,
        "0",
        starts={"tsdae_sbert": resolved(j)},
    )
    assert plan.method_label("tsdae_sbert") == "tsdae → sbert" and plan.method_label("sbert") == "sbert"
    from orchestrator.drivers.compare import leaderboard

    rows = [
        {"arm": a, "seed": 1, "test": {"twitterpara_ap": 0.7}, "best_dev": 7, "history": [{"loss": 1.0}]}
        for a in arms
    ]
    text = lb.markdown(leaderboard(plan, rows, {}))
    assert "| tsdae_sbert | tsdae → sbert |" in text
    assert "sbert 7 × 16; tsdae_sbert 7 × 16 (after tsdae 40 × 16)." in text
