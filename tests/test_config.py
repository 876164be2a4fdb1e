import pytest
from pydantic import Field

from orchestrator.config import (
    ModelConfig,
    StrictModel,
    apply_overrides,
    config_hash,
    load_config,
)
from orchestrator.errors import ConfigError


class Train(StrictModel):
    lr: float = 1e-5
    steps: int = Field(10, gt=0)


class Cfg(StrictModel):
    model: ModelConfig = ModelConfig()
    train: Train = Train()
    tags: list[str] = []


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_loads_yaml_and_applies_overrides(tmp_path):
    p = write(tmp_path, "train:\n  lr: 3.0e-5\nmodel:\n  pooling: mean\n")
    cfg = load_config(Cfg, p, ["train.steps=7", "tags=[a, b]", "model.name_or_path=/x"])
    assert cfg.train.lr == 3e-5 and cfg.train.steps == 7
    assert cfg.tags == ["a", "b"] and cfg.model.pooling == "mean" and cfg.model.name_or_path == "/x"


def test_unknown_key_names_file_and_key(tmp_path):
    p = write(tmp_path, "train:\n  lrr: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_config(Cfg, p)
    assert str(exc.value) == f"{p}: train.lrr: unknown key"


def test_wrong_type_names_key_and_value(tmp_path):
    p = write(tmp_path, "train:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: train\.lr: .*number.*'fast'"):
        load_config(Cfg, p)


def test_constraint_violation(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.steps: Input should be greater than 0 \(got -1\)"):
        load_config(Cfg, None, ["train.steps=-1"])


def test_unknown_override_key_is_an_error():
    with pytest.raises(ConfigError, match=r"<defaults> \(\+ overrides\): train\.nope: unknown key"):
        load_config(Cfg, None, ["train.nope=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(Cfg, tmp_path / "nope.yaml")
    p = write(tmp_path, "train:\n  lr: [1, 2\nmodel: x\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: invalid YAML"):
        load_config(Cfg, p)
    p = write(tmp_path, "- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(Cfg, p)


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="empty key"):
        apply_overrides({}, ["train..lr=1"])


def test_config_hash_is_stable_and_sensitive():
    a, b = Cfg(), Cfg()
    assert config_hash(a) == config_hash(b)
    b.train.lr = 2e-5
    assert config_hash(a) != config_hash(b)


def test_storage_reference_expands_or_names_the_key(tmp_path, monkeypatch):
    """Presets say ``${SIEVE_STORAGE}/models/...`` instead of a bucket name nobody owns."""
    import argparse

    from orchestrator.config import expand_storage
    from orchestrator.drivers.cli import location_overrides

    data = {
        "model": {"name_or_path": "${SIEVE_STORAGE}/models/bert"},
        "data": [{"path": "${SIEVE_STORAGE}/c.txt"}],
    }
    monkeypatch.delenv("SIEVE_STORAGE", raising=False)
    with pytest.raises(ConfigError, match=r"^p.yaml: model.name_or_path = .* SIEVE_STORAGE=s3://BUCKET"):
        expand_storage(data, "p.yaml")
    args = argparse.Namespace(storage=None, tracking_uri=None)
    assert location_overrides(args) == []  # unset: the preset's own run.storage
    monkeypatch.setenv("SIEVE_STORAGE", "s3://acme/")
    assert expand_storage(data, "p.yaml") == {
        "model": {"name_or_path": "s3://acme/models/bert"},
        "data": [{"path": "s3://acme/c.txt"}],
    }
    assert location_overrides(args) == ["run.storage=s3://acme/runs"]
    args.storage = "/tmp/mine"
    assert location_overrides(args, "base.") == ["base.run.storage=/tmp/mine"]  # an explicit flag wins
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  name_or_path: ${SIEVE_STORAGE}/models/bert\n")
    assert load_config(Cfg, p).model.name_or_path == "s3://acme/models/bert"


def test_steps_past_the_data_are_not_promised_and_the_schedule_fits_the_steps_run():
    """37 rows per worker at batch 8 give 4 steps an epoch: max_steps 8 with 1 epoch runs 4, and the linear
    schedule reaches 0 at step 4 (it was sized for 8: the run stopped at half the learning rate); 3 epochs
    give the 8 asked for; without max_steps every epoch is run."""
    import torch

    from orchestrator.config import TrainLoopConfig
    from trainers.common import make_stepper
    from trainers.sifter_simcse import ContrastiveConfig

    assert TrainLoopConfig(batch_size=8, max_steps=8).planned_steps(37) == 4
    assert TrainLoopConfig(batch_size=8, max_steps=8, epochs=3).planned_steps(37) == 8
    assert TrainLoopConfig(batch_size=8, epochs=2).planned_steps(37) == 8
    cfg = ContrastiveConfig.model_validate({"train": {"batch_size": 8, "max_steps": 8, "lr": 1e-3}})
    stepper = make_stepper(torch.nn.Linear(2, 2), cfg, rows_per_worker=37)
    for _ in range(4):
        stepper.optimizer.step()
        stepper.scheduler.step()
    assert stepper.optimizer.param_groups[0]["lr"] == 0.0


def test_preflight_changes_nothing_and_settled_resolves_the_pooling_on_a_copy(tiny_bert_dir, tmp_path):
    """The checks leave the config as given; the resolved pooling (the folder's own: mean) is a new config."""
    from orchestrator.drivers.train import preflight, settled
    from trainers.sifter_simcse import ContrastiveConfig

    cfg = ContrastiveConfig.model_validate(
        {
            "model": {"name_or_path": str(tiny_bert_dir)},
            "run": {"storage": str(tmp_path / "store")},
            "data": {"shards": str(tmp_path)},
            "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        }
    )
    before = cfg.model_dump()
    preflight(cfg)
    assert cfg.model_dump() == before and cfg.model.pooling is None
    done = settled(cfg)
    assert done.model.pooling == "mean" and cfg.model.pooling is None and settled(done) is done


def test_a_location_given_in_part_keeps_the_methods_tracking_defaults():
    """``--tracking-uri`` (``tracking.tracking_uri=...``) or a file's ``tracking: {tracking_uri: ...}`` keeps the
    method's own registry name (TSDAE's ``tsdae``), not the bare block's None; a name given still wins."""
    from orchestrator.config import apply_overrides, validate
    from trainers.tsdae import TSDAEConfig

    got = validate(TSDAEConfig, apply_overrides({}, ["tracking.tracking_uri=http://mlflow:5000"]), "x.yaml")
    assert got.tracking.tracking_uri == "http://mlflow:5000" and got.tracking.registry_model_name == "tsdae"
    named = {"tracking": {"tracking_uri": "u", "registry_model_name": "mine"}}
    assert validate(TSDAEConfig, named, "x.yaml").tracking.registry_model_name == "mine"
