"""The sweep's space checks and its report's seed groups (mean ± std), without Ray."""

from __future__ import annotations

import pytest

from orchestrator.config import _read_yaml
from orchestrator.drivers.registry import get_method, method_names
from orchestrator.drivers.report import group_rows, group_table
from orchestrator.drivers.sweep import Dimension, SweepJobConfig, check_space
from orchestrator.errors import ConfigError


def test_every_shipped_sweep_config_validates():
    """Every configs/*_sweep/*.yaml names a known method, a base that validates, and a space
    whose every value gives a valid config."""
    from pathlib import Path

    from orchestrator.config import REPO_ROOT, apply_overrides, load_config

    files = sorted(Path(REPO_ROOT, "configs").glob("*_sweep/*.yaml"))
    assert {f.parent.name for f in files} >= {"sifter_sweep", "tsdae_sweep", "sentiment_sweep"}
    for f in files:
        job = load_config(SweepJobConfig, f)
        assert job.method in method_names()
        method = get_method(job.method)
        base = apply_overrides(_read_yaml(REPO_ROOT / job.base), [f"{k}={v}" for k, v in job.base_overrides.items()])
        check_space(method, base, job.sweep.space, str(f))


def test_bad_space_value_names_the_key():
    method = get_method("tsdae")
    with pytest.raises(ConfigError, match=r"sweep\.space\.deletion_ratio=1\.5: deletion_ratio: Input should be less"):
        check_space(method, {}, {"deletion_ratio": Dimension(grid=[0.3, 1.5])}, "x.yaml")


def test_groups_average_over_seeds():
    def row(sc, seed, dev, test):
        return {"params": {"short_circuit": sc, "train.seed": seed}, "best_dev": dev, "test": {"test_accuracy": test}}

    rows = [row(True, 1, 0.80, 0.79), row(True, 2, 0.82, 0.81), row(False, 1, 0.78, 0.77), row(False, 2, 0.76, 0.75),
            {"params": {"short_circuit": False, "train.seed": 3}, "best_dev": float("nan"), "test": {}}]
    groups = group_rows(rows, ["train.seed"], "test_accuracy")
    assert [g["setting"] for g in groups] == ["short_circuit=True", "short_circuit=False"]
    assert groups[0]["n"] == 2 and groups[0]["dev_mean"] == pytest.approx(0.81)
    assert groups[0]["test_std"] == pytest.approx(0.01414, abs=1e-4)  # sample std of 0.79, 0.81
    table = group_table(groups, "SST-2 dev accuracy", "test_accuracy")
    assert "| short_circuit=True | 2 | 81.00 ± 1.41 | 80.00 ± 1.41 |" in table
