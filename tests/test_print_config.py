"""``--print-config`` on every job prints one YAML mapping which, fed back with ``--config``,
resolves to the same job (the same printout again). In-process: nothing here starts Ray or trains."""

from __future__ import annotations

import json
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


def test_a_sweeps_resume_reads_the_plan_it_kept_and_refuses_another(tmp_path, monkeypatch, capsys):
    """A new sweep keeps its plan (the ``--print-config`` form, every config settled) before any work; its
    ``--resume`` reads that plan - by the name alone, whatever the preset now says - and one handed another plan
    is refused in one line naming the first difference. A name that kept no plan is refused without a file."""
    from orchestrator.errors import ConfigError

    monkeypatch.delenv("SIEVE_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # the embedded MLflow store of the preflight, here
    store = str(tmp_path / "st")

    def plan(*argv):
        monkeypatch.setattr(sys, "argv", ["jobs/sifter_sweep.py", *argv, "--storage", store])
        return sweep_job.resolve(
            sweep_job.job_parser("doc", "sifter_sweep", resumes="sweep").parse_args(), "sifter_sweep"
        )

    started = plan("--preset", "smoke", "--name", "s", "train.lr=4e-05")
    kept = tmp_path / "st" / "sweeps" / "s" / "plan.json"
    assert json.loads(kept.read_text())["base"]["train"]["lr"] == 4e-05
    resumed = plan("--name", "s", "--resume")  # no preset, no override: the kept plan, not the smoke preset's
    assert (
        resumed.base.train.lr == 4e-05
        and resumed.base == started.base
        and resumed.job
        == started.job.model_copy(update={"base": started.base.model_dump(mode="json"), "base_overrides": {}})
    )
    assert plan("--preset", "smoke", "--name", "s", "--resume", "train.lr=4e-05").base == started.base
    with pytest.raises(
        ConfigError,
        match=r"^--resume: sweep 's' was started with another plan \(base.train.lr: "
        r"4e-05 vs 5e-05; kept at \S+plan.json\): resume it without --config",
    ):
        plan("--preset", "smoke", "--name", "s", "--resume", "train.lr=5e-05")
    # a plan kept before a config key existed: the key, at its default today, is no difference
    data = json.loads(kept.read_text())
    del data["base"]["train"]["collapse_guard"]
    kept.write_text(json.dumps(data))
    assert plan("--preset", "smoke", "--name", "s", "--resume", "train.lr=4e-05").base == started.base
    with pytest.raises(ConfigError, match=r"another plan \(base.train.lr: 4e-05 vs 5e-05"):
        plan("--preset", "smoke", "--name", "s", "--resume", "train.lr=5e-05")
    (tmp_path / "st" / "sweeps" / "old").mkdir()  # a sweep made before plans were kept
    with pytest.raises(
        ConfigError,
        match=r"^sweep 'old' kept no plan \(\S+ is missing: .*pass the --config it was started with$",
    ):
        plan("--name", "old", "--resume")
    assert (
        plan("--preset", "smoke", "--name", "old", "--resume").base.train.lr != 4e-05
    )  # read from the file named


def test_a_comparisons_resume_reads_a_plan_kept_before_a_config_key_existed(tmp_path, monkeypatch):
    """A comparison's kept plan lacks a config key added since (here: train.collapse_guard): resumed with its
    file it is read with that key at its default - no difference - while a changed key is still refused."""
    from orchestrator.drivers import compare_plan
    from orchestrator.errors import ConfigError

    monkeypatch.delenv("SIEVE_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)

    def plan(*argv):
        monkeypatch.setattr(sys, "argv", ["jobs/compare.py", *argv, "--storage", str(tmp_path / "st")])
        from orchestrator.drivers import compare

        return compare_plan.resolve(compare.parse_args("doc"))

    started = plan("--preset", "smoke", "--name", "c")
    kept = tmp_path / "st" / "sweeps" / "c" / "plan.json"
    data = json.loads(kept.read_text())
    for arm in data["arms"].values():
        del arm["config"]["train"]["collapse_guard"]
    kept.write_text(json.dumps(data))
    assert plan("--preset", "smoke", "--name", "c", "--resume").arms == started.arms
    with pytest.raises(ConfigError, match=r"another plan \(arms\.\w+\.config\.train\.lr: "):
        plan("--preset", "smoke", "--name", "c", "--resume", "train.lr=0.5")
