"""``--print-config`` on every job prints one YAML mapping which, fed back with ``--config``,
resolves to the same job (the same printout again). In-process: nothing here starts Ray or trains."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.drivers import compare, sweep_job, train_job
from orchestrator.drivers.registry import method_names

ROOT = Path(__file__).resolve().parents[1]


JOBS = {
    **{
        f"sweep:{d}": (lambda d=d: sweep_job.main("doc", d), [])
        for d in sorted(p.stem for p in (ROOT / "jobs").glob("*_sweep.py"))
    },
    **{f"train:{m}": (lambda: train_job.main("doc"), ["--method", m]) for m in method_names()},
    "compare": (lambda: compare.main("doc"), []),
}


def printed(monkeypatch, capsys, run, argv) -> str:
    monkeypatch.setattr(sys, "argv", ["job", *argv, "--print-config"])
    assert run() == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("job", sorted(JOBS))
def test_print_config_round_trips(job, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SIEVE_STORAGE", raising=False)
    run, extra = JOBS[job]
    first = printed(monkeypatch, capsys, run, [*extra, "--preset", "smoke"])
    data = yaml.safe_load(first)
    assert isinstance(data, dict) and data, first[:500]
    (tmp_path / "job.yaml").write_text(first)
    assert printed(monkeypatch, capsys, run, [*extra, "--config", str(tmp_path / "job.yaml")]) == first
    # an override on top of the printed file still applies (the file is a config, not a frozen dump)
    key = "train.seed=7"
    again = yaml.safe_load(
        printed(monkeypatch, capsys, run, [*extra, "--config", str(tmp_path / "job.yaml"), key])
    )
    if job == "compare":  # every arm's config
        seed = {a["config"]["train"]["seed"] for a in again["arms"].values()}.pop()
    else:
        seed = again["base"]["train"]["seed"] if job.startswith("sweep") else again["train"]["seed"]
    assert seed == 7
