"""The sweep's space checks, the choice of the best setting against the base, the registration gate
(both ways, on a real embedded MLflow registry), and the report's seed groups - without Ray."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from orchestrator.config import REPO_ROOT, load_config, read_yaml, set_path, validate
from orchestrator.drivers.registry import get_method, method_names
from orchestrator.errors import ConfigError
from orchestrator.evaluation.suite import TestReport, compare_table
from orchestrator.job_files import Dimension, SweepJobConfig, check_space, trial_config
from orchestrator.results.publish import Choice, choose, gate_line, register
from orchestrator.results.report import common_step, dev_at, group_rows, group_table
from orchestrator.spec import BaseResult


def base_of(job: SweepJobConfig):
    data = read_yaml(REPO_ROOT / job.base)
    for k, v in job.base_overrides.items():
        set_path(data, k.split("."), v, "test")
    return validate(get_method(job.method).config_cls, data, job.base)


def test_every_shipped_sweep_config_validates(monkeypatch):
    """Every configs/*_sweep/*.yaml names a known method, a base that validates, and a space
    whose every value gives a valid config."""
    monkeypatch.setenv("SIEVE_STORAGE", "s3://acme-sieve")  # the paper presets read the cluster's bucket
    files = sorted(Path(REPO_ROOT, "configs").glob("*_sweep/*.yaml"))
    assert {f.parent.name for f in files} >= {"sifter_sweep", "tsdae_sweep", "sentiment_sweep"}
    for f in files:
        job = load_config(SweepJobConfig, f)
        assert job.method in method_names()
        spec, base = get_method(job.method), base_of(job)
        assert spec.has_dev(base), f  # a sweep must have a dev score to rank settings
        check_space(base, job.sweep.space, str(f))


def test_bad_space_value_names_the_key():
    base = get_method("tsdae").config_cls()
    with pytest.raises(
        ConfigError, match=r"sweep\.space\.deletion_ratio=1\.5: deletion_ratio: Input should be less"
    ):
        check_space(base, {"deletion_ratio": Dimension(grid=[0.3, 1.5])}, "x.yaml")


def test_a_grid_point_whose_lambdas_are_all_zero_is_refused_before_ray():
    """Each value is valid alone; their combination is not: refused in one line naming the point."""
    base = get_method("sifter_simcse").config_cls(lambda_xx=0)
    space = {
        "lambda_xy": Dimension(grid=[0, 1]),
        "lambda_xz": Dimension(grid=[0, 1]),
        "lambda_yz": Dimension(grid=[0, 1]),
        "train.lr": Dimension(loguniform=(1e-5, 5e-5)),
    }
    with pytest.raises(ConfigError) as exc:
        check_space(base, space, "x.yaml")
    assert str(exc.value).startswith("x.yaml: sweep grid point lambda_xy=0, lambda_xz=0, lambda_yz=0: ")
    assert "at least one of lambda_xx" in str(exc.value) and "\n" not in str(exc.value)
    check_space(base, {**space, "lambda_yz": Dimension(grid=[1])}, "x.yaml")  # without the zero point: fine


def test_params_apply_to_the_typed_config_by_path():
    base = get_method("sifter_simcse").config_cls()
    cfg = trial_config(base, {"train.lr": 5e-5, "lambdas": {"lambda_xx": 1, "lambda_xy": 0}}, "t")
    assert cfg.train.lr == 5e-5 and cfg.lambda_xx == 1 and cfg.lambda_xy == 0 and base.train.lr != 5e-5
    with pytest.raises(ConfigError, match=r"t: train\.lrr: unknown key"):
        trial_config(base, {"train.lrr": 1}, "t")


def test_a_grid_point_is_validated_once_before_ray_and_reaches_its_trial_typed(tiny_bert_dir):
    """check_space hands back every grid point's validated config; the trial takes it as it is (the same object,
    no second validation), and a point a sampler drew is validated when its trial starts. (The workers get
    that object too: ``Recipe.train_func`` refuses anything else, in every Ray Train test.)"""
    from orchestrator.job_files import config_of, point_key

    base = get_method("sifter_simcse").config_cls(model={"name_or_path": str(tiny_bert_dir)})
    bundles = [{"lambda_xx": 0, "lambda_xy": 1}, {"lambda_xx": 1, "lambda_xy": 0}]
    space = {"lambdas": Dimension(grid=bundles), "train.seed": Dimension(grid=[1, 2])}
    configs = check_space(base, space, "x.yaml")
    assert len(configs) == 4
    params = {"lambdas": bundles[1], "train.seed": 2}  # as Tune's trial holds the point
    cfg = configs[point_key(params)]
    assert cfg.lambda_xx == 1 and cfg.lambda_xy == 0 and cfg.train.seed == 2
    assert config_of(base, configs, params, "t") is cfg
    assert check_space(base, {**space, "train.lr": Dimension(loguniform=(1e-5, 5e-5))}, "x.yaml") == {}
    drawn = config_of(base, configs, {"train.lr": 2e-5}, "t")  # not a grid point: validated now
    assert drawn.train.lr == 2e-5 and drawn is not base
    with pytest.raises(ConfigError, match=r"t: train\.lrr: unknown key"):
        config_of(base, configs, {"train.lrr": 1}, "t")


def row(trial, params, dev, *, stopped=False, history=None):
    return {
        "trial": trial,
        "params": params,
        "best_dev": dev,
        "checkpoint_path": f"/ckpt/{trial}",
        "stopped_early": stopped,
        "history": history or [],
        "best": {},
        "error": None,
    }


def report(value: float) -> TestReport:
    return TestReport(
        "t", {"sts_stsb_spearman_all": value, "sts_avg_spearman_all": value}, "sts_avg_spearman_all", ""
    )


def test_choice_prefers_full_budget_trials_and_compares_with_the_base():
    rows = [row("a", {"lr": 1}, 0.90, stopped=True), row("b", {"lr": 2}, 0.80), row("c", {"lr": 3}, 0.70)]
    base = BaseResult(0.75, report(0.7), "base (m, mean)")
    c = choose(rows, group_out=[], base=base, baseline_params={})
    assert c.best["trial"] == "b" and c.beats_base  # the ASHA-stopped trial is not set against full ones
    assert not choose(rows, group_out=[], base=base, baseline_params={}, margin=0.06).beats_base
    worse = choose(rows, group_out=[], base=BaseResult(0.85, report(0.7), "base"), baseline_params={})
    assert not worse.beats_base


def test_choice_averages_seeds_and_uses_a_grid_baseline():
    """SIFTER-LSTM: the setting with the best mean over seeds vs the plain-LSTM point's mean; a
    single lucky seed does not win."""
    rows = [
        row("s1", {"short_circuit": True, "train.seed": 1}, 0.90),
        row("s2", {"short_circuit": True, "train.seed": 2}, 0.70),
        row("l1", {"short_circuit": False, "train.seed": 1}, 0.81),
        row("l2", {"short_circuit": False, "train.seed": 2}, 0.81),
    ]
    c = choose(rows, group_out=["train.seed"], base=None, baseline_params={"short_circuit": False})
    assert c.best["trial"] == "s1" and c.best_dev == pytest.approx(0.80) and c.base_dev == pytest.approx(0.81)
    assert not c.beats_base and "nothing better than the base" in gate_line(
        c, "dev", {"name": "m", "version": 3}
    )


def test_registration_gate_both_ways(embedded_tracking, tiny_bert_dir):
    """``candidate`` moves only when the best setting beats the base; otherwise the version is still
    registered, with beats_base=false and both scores in its tags."""
    import mlflow

    from orchestrator import tracking

    tracking.setup(None, "gate")
    with mlflow.start_run():
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    good = Choice(row("a", {}, 0.80), 0.80, 0.75, "base", 0.0)
    reg = register(info.model_uri, "gated", good, description="d", tags={})
    assert reg["alias"] == "candidate" and tracking.alias_version("gated", "candidate") == reg["version"]
    bad = Choice(row("b", {}, 0.70), 0.70, 0.75, "base", 0.0)
    reg2 = register(info.model_uri, "gated", bad, description="d", tags={})
    assert reg2["alias"] is None and reg2["version"] == reg["version"] + 1
    assert tracking.alias_version("gated", "candidate") == reg["version"]  # not moved
    tags = mlflow.MlflowClient().get_model_version("gated", str(reg2["version"])).tags
    assert (
        tags["beats_base"] == "false"
        and float(tags["dev_score"]) == 0.7
        and float(tags["base_dev_score"]) == 0.75
    )


def test_equal_step_columns_and_candidate_minus_base():
    rows = [
        row("a", {}, 0.8, history=[{"step": 2, "m": 0.7}, {"step": 4, "m": 0.8}]),
        row("b", {}, 0.6, stopped=True, history=[{"step": 2, "m": 0.6}]),
    ]
    assert (
        common_step(rows) == 2
        and dev_at(rows[0], 2, "m") == 0.7
        and dev_at(rows[1], 4, "m") != dev_at(rows[1], 4, "m")
    )
    table = compare_table(report(0.70), report(0.72))
    assert "| sts_stsb_spearman_all | 70.00 | 72.00 | +2.00 |" in table


def test_groups_average_over_seeds():
    def trial(sc, seed, dev, test):
        return {
            "params": {"short_circuit": sc, "train.seed": seed},
            "best_dev": dev,
            "test": {"test_accuracy": test},
        }

    rows = [
        trial(True, 1, 0.80, 0.79),
        trial(True, 2, 0.82, 0.81),
        trial(False, 1, 0.78, 0.77),
        trial(False, 2, 0.76, 0.75),
        {"params": {"short_circuit": False, "train.seed": 3}, "best_dev": float("nan"), "test": {}},
    ]
    groups = group_rows(rows, ["train.seed"], "test_accuracy")
    assert [g["setting"] for g in groups] == ["short_circuit=True", "short_circuit=False"]
    assert groups[0]["n"] == 2 and groups[0]["dev_mean"] == pytest.approx(0.81)
    assert groups[0]["test_std"] == pytest.approx(0.01414, abs=1e-4)  # sample std of 0.79, 0.81
    table = group_table(groups, "SST-2 dev accuracy", "test_accuracy")
    assert "| short_circuit=True | 2 | 81.00 ± 1.41 | 80.00 ± 1.41 |" in table


def test_sweep_job_resolves_without_ray(embedded_tracking):
    """``resolve`` validates the base config once and checks the space before anything starts."""
    from orchestrator.drivers.sweep_job import resolve

    args = Namespace(
        resume=False,
        name="x",
        config=None,
        preset="smoke",
        overrides=["train.lr=4e-5"],
        storage=None,
        tracking_uri=None,
        no_progress=True,
        print_config=False,
        verbose=False,
        take_over=False,
    )
    plan = resolve(args, "sifter_sweep")
    assert plan.base.train.lr == 4e-5 and plan.base.model.pooling == "mean"  # resolved from MiniLM's folder
    args.overrides = [
        "sweep.space={lambdas: {grid: [{lambda_xx: 0, lambda_xy: 0, lambda_xz: 0, lambda_yz: 0}]}}"
    ]
    with pytest.raises(ConfigError, match="at least one of lambda_xx"):
        resolve(args, "sifter_sweep")
    # a name already taken is refused here, before the corpus is built (it was refused minutes later, after
    # the parse); --resume of it is not
    args.overrides = []
    # the first one kept its plan
    assert (embedded_tracking / "outputs" / "sweeps" / "x" / "plan.json").is_file()
    with pytest.raises(
        ConfigError, match=r"^sweep 'x' already exists at .*: pass --resume, or another --name"
    ):
        resolve(args, "sifter_sweep")
    args.resume, args.preset = True, None  # by its name alone: the plan it kept
    resumed = resolve(args, "sifter_sweep")
    assert resumed.name == "x" and resumed.base.train.lr == 4e-5


def test_optuna_search_is_seeded_and_refuses_bundles():
    """``search: optuna`` gives Tune's OptunaSearch (TPE) with the sweep's seed: the same seed suggests the
    same first points; bundles (dict values) are refused in one line (Optuna suggests single values)."""
    from orchestrator.drivers.sweep import make_search

    job = SweepJobConfig.model_validate(
        {
            "method": "sifter_simcse",
            "base": "x.yaml",
            "sweep": {
                "search": "optuna",
                "seed": 7,
                "num_samples": 4,
                "space": {"train.lr": {"loguniform": [1e-5, 5e-5]}, "dropout": {"choice": [0.1, 0.15]}},
            },
        }
    )

    def first_points(seed_job):
        search, space = make_search(seed_job, "stsb_dev_spearman", max_concurrent=1)
        search.set_search_properties("stsb_dev_spearman", "max", {"params": space})
        return [search.suggest(f"t{i}") for i in range(1)]

    assert first_points(job) == first_points(job)
    other = job.model_copy(update={"sweep": job.sweep.model_copy(update={"seed": 8})})
    assert first_points(other) != first_points(job)
    bundled = SweepJobConfig.model_validate(
        {
            "method": "sifter_simcse",
            "base": "x.yaml",
            "sweep": {
                "search": "optuna",
                "space": {"lambdas": {"grid": [{"lambda_xx": 1}, {"lambda_xy": 1}]}},
            },
        }
    )
    with pytest.raises(ConfigError, match="sweep.space.lambdas: optuna suggests single values"):
        make_search(bundled, "m", 1)


def test_the_base_is_measured_with_every_pooling_and_the_strongest_is_the_yardstick(
    embedded_tracking, tiny_bert_dir
):
    """A sweep that tries poolings (or whose config reads the model otherwise than the folder saved it)
    measures the untouched model each way; the gate's base is the strongest. (A TSDAE sweep over CLS and
    mean once registered a mean-pooled candidate for beating MiniLM-with-CLS, 83.42 vs 79.73 STS-B dev,
    while MiniLM as the user has it - mean - scores 86.72.)"""
    from orchestrator.drivers.train import measure_bases

    job = SweepJobConfig.model_validate(
        {
            "method": "sifter_simcse",
            "base": "configs/sifter_simcse/smoke.yaml",
            "base_overrides": {
                "model.name_or_path": str(tiny_bert_dir),
                "model.pooling": "cls",
                "eval.tasks": ["stsb"],
                "eval.max_length": 32,
            },
            "sweep": {"space": {"model.pooling": {"grid": ["cls", "cls_before_pooler"]}}},
        }
    )
    bases = measure_bases(
        get_method("sifter_simcse"), base_of(job), tried=job.sweep.space["model.pooling"].candidates()
    )
    # cls and cls_before_pooler are read alike at test time (the raw [CLS]); the folder's own mean is added
    assert [b.label.rsplit(", ", 1)[1].rstrip(")") for b in bases] == ["cls", "mean"]
    assert bases[0].dev != bases[1].dev
    strongest = max(bases, key=lambda b: b.dev)
    rows = [
        {
            "trial": "t",
            "params": {},
            "best_dev": min(b.dev for b in bases) + 1e-4,
            "checkpoint_path": "c",
            "stopped_early": False,
        }
    ]
    assert not choose(rows, group_out=[], base=strongest, baseline_params={}).beats_base
    # a config that reads the model as it was saved measures that one way only
    assert (
        len(
            measure_bases(
                get_method("sifter_simcse"), trial_config(base_of(job), {"model.pooling": "mean"}, "t")
            )
        )
        == 1
    )


def test_a_trial_row_is_named_as_the_trial_function_named_it_not_by_its_folder():
    """A sweep resumed from a snapshot taken before a trial's folder was made gets that folder again from Tune
    with ``_xxxx`` added; the trial function (its reports, MLflow child run, early test) still used the trial's
    name. The row must use that name too: a folder name made the publisher log a second child run for the
    trial (seen in the kill/resume test: ``t1-…`` and ``t1-…_a5af``)."""
    import pandas as pd

    from orchestrator.drivers.engine import name_of, trial_rows

    params = {"lambda_xy": 1.0, "lambda_xz": 0.0}
    name = name_of("a5c3e_00001", params)
    assert name.startswith("t1-") and "_" not in name

    class Result:
        config = {"params": params}
        path = f"/store/sweeps/s/{name}_a5af"
        filesystem = None
        error = None
        metrics = {"trial_id": "a5c3e_00001", "step": 2, "m": 0.7}
        metrics_dataframe = pd.DataFrame([{"step": 2, "m": 0.7, "trial_id": "a5c3e_00001"}])

    class NoReport(Result):  # failed before its first report: only its folder names it
        path = "/store/sweeps/s/t2-x"
        metrics = {}
        metrics_dataframe = None

    rows = trial_rows([Result(), NoReport()], "m")
    assert [r["trial"] for r in rows] == [name, "t2-x"]


def test_the_closing_verdict_says_what_a_user_decides_on(tmp_path):
    """At most 8 lines, the registration line last; the figures beside the base and the champion, the
    largest per-task regression, the margin in seed standard deviations (or that it is not measured), absolute
    paths and the next command."""
    from orchestrator.results.verdict import seed_devs, verdict

    def report(avg, stsb, sickr):
        return TestReport(
            "t",
            {"sts_avg_spearman_all": avg, "sts_stsb_spearman_all": stsb, "sts_sickr_spearman_all": sickr},
            "sts_avg_spearman_all",
            "",
        )

    rows = [
        {"trial": f"t{i}", "params": {"lambda_xy": 1, "train.seed": s}, "best_dev": d, "checkpoint_path": "c"}
        for i, (s, d) in enumerate([(1, 0.875), (2, 0.871), (3, 0.873)])
    ]
    rows.append(
        {"trial": "t9", "params": {"lambda_xy": 0, "train.seed": 1}, "best_dev": 0.86, "checkpoint_path": "c"}
    )
    choice = Choice(rows[0], 0.873, 0.8672, "base (default, mean)", 0.0)
    base = BaseResult(0.8672, report(0.7887, 0.8203, 0.7715), "base (default, mean)")
    devs = seed_devs(rows, rows[0], ["train.seed"])
    assert devs == [0.875, 0.871, 0.873]
    kw = dict(
        method="sifter_simcse",
        choice=choice,
        metric_label="STS-B dev Spearman",
        test=report(0.7958, 0.83, 0.7597),
        base=base,
        registered={"name": "sifter-simcse", "version": 4, "run_id": "r1"},
        devs=devs,
        report=tmp_path / "summary.md",
        summary_json=tmp_path / "summary.json",
        job="sifter_sweep",
        gate="candidate: x",
    )
    lines = verdict(
        champion={"version": "2", "test_score": "0.7910", "test_metric": "sts_avg_spearman_all"}, **kw
    )
    assert len(lines) <= 8 and lines[-1] == "candidate: x"
    assert lines[0] == 'verdict: sifter_simcse {"lambda_xy": 1, "train.seed": 1} (trial t0)'
    assert lines[1] == (
        "dev STS-B dev Spearman 87.30 vs base 86.72 (+0.58); test sts_avg_spearman_all 79.58 vs base "
        "78.87 (+0.71); champion v2 79.10 (+0.48)"
    )
    assert lines[2] == "largest regression against the base: sts_sickr_spearman_all -1.18 (1 of 2 tasks up)"
    assert (
        lines[3]
        == "noise: the setting's dev over 3 seeds has sd 0.20; its margin over the base (+0.58) is 2.9 sd"
    )
    assert lines[4].startswith(f"report: {tmp_path}/summary.md (summary JSON: {tmp_path}/summary.json)")
    assert "models:/sifter-simcse/4" in lines[4]
    assert lines[5].startswith("next: python jobs/promote.py --model sifter-simcse --version 4")
    alone = verdict(champion={}, **{**kw, "devs": devs[:1]})
    assert "no champion yet" in alone[1] and alone[3].startswith("noise: one seed per setting")
    assert not any(line.startswith("saturated") for line in lines)  # no history: nothing to flag
    # a loss that ended below 1e-3 (the comparison's flag) is said before the registration line
    rows[1]["history"], rows[2]["history"] = [{"loss": 0.9}, {"loss": 2e-05}], [{"loss": 0.05}]
    flagged = verdict(champion={}, rows=rows, **kw)
    assert (
        len(flagged) <= 8
        and flagged[-1] == "candidate: x"
        and flagged[-2]
        == (
            "saturated: 1 of 2 explore trial(s) ended with a training loss below 0.001 (lowest: t1, 2e-05) - they "
            "trained on no signal, and their figures test nothing; a harder task (a larger batch, hard negatives) "
            "or fewer steps"
        )
    )


def test_the_card_sets_the_scores_beside_the_base_and_the_champion_and_mlflow_gets_no_front_matter():
    from orchestrator.results.publish import mlflow_description, scores_table

    base = BaseResult(
        0.80,
        TestReport(
            "t", {"sts_avg_spearman_all": 0.70, "sts_stsb_spearman_all": 0.75}, "sts_avg_spearman_all", "", {}
        ),
        "base (m, mean)",
    )
    test = TestReport(
        "t", {"sts_avg_spearman_all": 0.72, "sts_stsb_spearman_all": 0.74}, "sts_avg_spearman_all", "", {}
    )
    plain = scores_table(base, test)  # not registered (the train job): no champion column
    assert "champion" not in plain and "| sts_avg_spearman_all | 70.00 | 72.00 | +2.00 |" in plain
    held = scores_table(base, test, {"version": "3", "test_sts_avg_spearman_all": "0.715"})
    lines = held.splitlines()
    assert lines[0].endswith("| champion v3 |") and lines[1].count("---:") == 4
    assert "| sts_avg_spearman_all | 70.00 | 72.00 | +2.00 | 71.50 |" in held
    assert "| sts_stsb_spearman_all | 75.00 | 74.00 | -1.00 | — |" in held  # the champion has no such tag
    none = scores_table(base, test, {})
    assert none.splitlines()[0].endswith("| champion |") and "No champion yet" in none
    card = "---\nlanguage: en\ntags: [sieve]\n---\n\n# sifter-simcse\n\ntext"
    assert mlflow_description(card) == "# sifter-simcse\n\ntext"
    assert mlflow_description("# plain\n---\nx") == "# plain\n---\nx"


def test_trial_runs_get_each_evaluation_once_whatever_the_outage_kept(embedded_tracking):
    """A trial's live points (logged while it trained) are not logged again at the end; the steps an outage
    kept from the run are added once; a resumed publish adds nothing."""
    import mlflow

    from orchestrator import live_runs, tracking
    from orchestrator.results.publish import log_trials

    exp_id = tracking.setup(None, "sieve")
    with mlflow.start_run(experiment_id=exp_id) as parent:
        child = live_runs.create_child_run(
            exp_id,
            parent.info.run_id,
            "t0",
            {"sieve.sweep": "s", "sieve.trial": "t0", "sieve.role": "trial"},
            {},
            mlflow.get_tracking_uri(),
        )
        for key, value in (
            ("m", 0.5),
            ("loss", 1.0),
        ):  # step 2's evaluation logged live; step 4's lost to an outage
            tracking.MlflowClient().log_metric(child, key, value, step=2)
        row = {
            "trial": "t0",
            "params": {},
            "best_dev": 0.6,
            "stopped_early": False,
            "test": {},
            "error": None,
            "history": [{"step": 2, "m": 0.5, "loss": 1.0}, {"step": 4, "m": 0.6, "loss": 0.8}],
        }
        for _ in range(2):  # the publish, then a resumed one
            log_trials(exp_id, parent.info.run_id, "s", [row], "m")
    history = tracking.MlflowClient().get_metric_history(child, "m")
    assert sorted((h.step, h.value) for h in history) == [(2, 0.5), (4, 0.6)]
    assert sorted(h.step for h in tracking.MlflowClient().get_metric_history(child, "loss")) == [2, 4]


def test_the_card_says_the_steps_the_run_trained_and_lists_its_settings():
    """A run whose data gives fewer steps than ``train.max_steps`` (300 sentences, batch 64) trains what the data
    gives: its card says that number and why, read from its reports' last step."""
    from card import card_for

    from orchestrator.config import validate
    from orchestrator.results.publish import trained_steps
    from trainers.supervised_contrastive import SupervisedContrastiveRecipe

    cfg = validate(SupervisedContrastiveRecipe.config_cls, {"train": {"max_steps": 20}}, "t")
    reports = [{"step": 2, "loss": 1.0}, {"step": 4, "loss": 0.5}, {"loss": 0.4}]
    assert trained_steps(reports) == 4 and trained_steps([]) is None
    assert "Training: 4 steps (train.max_steps 20: the data gave 4), batch " in card_for(cfg, steps=4)
    assert "Training: 20 steps, batch " in card_for(cfg, steps=20) and "Training: 20 steps, " in card_for(cfg)
    # its settings a list a person reads in the MLflow UI, not a block of JSON braces
    card = card_for(
        cfg, params={"config": "configs/x.yaml", "params": {"lambdas": [1, 0], "train.lr": 3e-05}}
    )
    assert "- config: `configs/x.yaml`\n- params.lambdas: `[1, 0]`\n- params.train.lr: `3e-05`\n" in card
    assert "```json" not in card


def test_a_failed_trial_is_named_by_the_exception_its_worker_raised_without_colour_codes():
    """The one line a failed comparison or sweep ends with names what the worker raised, not Ray's wrapper
    (``ray::ImplicitFunc.train() (pid=...)``) with its terminal colour codes."""
    from orchestrator.drivers.engine import error_line

    wrapped = (
        "ray.exceptions.RayTaskError(WorkerGroupError): \x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=1, ip=x)\n"
        '  File "trainers/loop.py", line 194, in on_batch\n    guard = cfg.train.collapse_guard\n'
        "AttributeError: 'TrainLoopConfig' object has no attribute 'collapse_guard'\n"
    )
    assert error_line(wrapped) == "AttributeError: 'TrainLoopConfig' object has no attribute 'collapse_guard'"
    assert error_line(RuntimeError("the worker died")) == "the worker died"
    assert (
        "\x1b" not in error_line("\x1b[31mred\x1b[0m only")
        and error_line("\x1b[31mred\x1b[0m only") == "red only"
    )
