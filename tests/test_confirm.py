"""A sweep's confirm stage without Ray: the explore ranking it takes its settings from, the seeds it trains
with, the comparison it builds, and its gate - a setting that wins the explore stage on dev is registered only
when its confirmed test interval against the base lies above 0. The stage end to end (Ray, MLflow, the
README's ``ray job submit``): tests/e2e/test_sweep.py."""

from __future__ import annotations

from argparse import Namespace

import pytest

from orchestrator.drivers import confirm
from orchestrator.errors import ConfigError
from orchestrator.evaluation.suite import TestReport
from orchestrator.job_files import ConfirmBlock, confirm_seeds
from orchestrator.results import leaderboard as lb
from orchestrator.results.publish import choose
from orchestrator.spec import BaseResult

H = "sts_avg_spearman_all"


def row(trial, params, dev):
    return {
        "trial": trial,
        "params": params,
        "best_dev": dev,
        "checkpoint_path": f"/ckpt/{trial}",
        "stopped_early": False,
        "history": [],
        "best": {},
        "error": None,
    }


STAND_IN = {"lambdas": {"lambda_xx": 0, "lambda_xy": 1}}  # the setting whose dev is high by construction
OTHER = {"lambdas": {"lambda_xx": 1, "lambda_xy": 0}}
THIRD = {"lambdas": {"lambda_xx": 0, "lambda_xy": 0.5}}


def explore_rows():
    return [
        row("t0", {**OTHER, "train.seed": 1}, 0.871),
        row("t1", {**STAND_IN, "train.seed": 1}, 0.990),
        row("t2", {**STAND_IN, "train.seed": 2}, 0.930),
        row("t3", {**THIRD, "train.seed": 1}, 0.860),
    ]


def test_top_settings_are_the_explore_ranking_on_mean_dev_over_seeds():
    got = confirm.top_settings(explore_rows(), ["train.seed"], {}, 2)
    assert [s["arm"] for s in got] == ["rank1", "rank2"]
    assert got[0]["params"]["lambdas"] == STAND_IN["lambdas"] and got[0]["params"]["train.seed"] == 1
    assert got[0]["dev_mean"] == pytest.approx((0.990 + 0.930) / 2) and got[0]["trials"] == ["t1", "t2"]
    assert got[1]["params"]["lambdas"] == OTHER["lambdas"] and got[1]["label"] == "lambda_xx=1, lambda_xy=0"
    assert len(confirm.top_settings(explore_rows(), ["train.seed"], {}, 9)) == 3


def test_a_stand_in_that_wins_on_dev_but_not_on_the_tests_is_explored_first_and_not_registered():
    base = BaseResult(0.80, TestReport("b", {H: 0.75}, H, ""), "base (m, mean)")
    rows = explore_rows()
    # the single-seed dev gate (confirm.seeds: 0, today's rule before the confirm stage) lets it through
    assert choose(rows, group_out=["train.seed"], base=base, baseline_params={}).beats_base
    settings = confirm.top_settings(rows, ["train.seed"], {}, 2)
    assert settings[0]["params"]["lambdas"] == STAND_IN["lambdas"]  # explored first
    # confirmed with fresh seeds on the tests: the stand-in is no better than the base there, the other is
    tests = {"rank1": [0.748, 0.752, 0.750], "rank2": [0.761, 0.764, 0.762]}
    board = lb.build(
        [
            lb.ArmRuns(
                a, "sifter_simcse", "mean", {s: {"test": {H: v}} for s, v in zip((3, 4, 5), vs, strict=True)}
            )
            for a, vs in tests.items()
        ],
        {"mean": {"label": base.label, "dev": base.dev, "test": base.test.metrics}},
        reference="rank1",
        headline=H,
    )
    stand_in = next(r for r in board["rows"] if r["arm"] == "rank1")
    assert not stand_in["gate"] and stand_in["vs_base"]["adjusted"]["m"] == 2
    winner = lb.winner(board, "best")
    assert winner["arm"] == "rank2" and winner["gate"]  # what registers: the setting confirmed on the tests
    # and with only the stand-in confirmed, nothing is
    alone = lb.build(
        [lb.ArmRuns("rank1", "m", "mean", {3: {"test": {H: 0.748}}, 4: {"test": {H: 0.752}}})],
        {"mean": {"label": "b", "dev": 0.8, "test": {H: 0.75}}},
        reference=None,
        headline=H,
    )
    assert not lb.winner(alone, "best")["gate"]


def test_confirm_seeds_are_fresh_and_a_list_sharing_one_with_the_explore_stage_is_refused():
    assert confirm_seeds(ConfirmBlock(seeds=3), {42}, "f") == [1, 2, 3]
    assert confirm_seeds(ConfirmBlock(seeds=2), {1, 2, 3}, "f") == [4, 5]
    assert confirm_seeds(ConfirmBlock(seeds=[7, 8]), {42}, "f") == [7, 8]
    with pytest.raises(ConfigError, match=r"f: confirm.seeds \[42\] trained in the explore stage too"):
        confirm_seeds(ConfirmBlock(seeds=[42, 7]), {42}, "f")
    assert not ConfirmBlock(seeds=0).on and ConfirmBlock().on and ConfirmBlock().top_k == 2
    for bad in (1, [5], -1, [3, 3]):
        with pytest.raises(ValueError):
            ConfirmBlock(seeds=bad)


def test_the_main_job_confirms_and_its_plan_is_a_comparison_of_its_best_settings(embedded_tracking):
    from orchestrator.drivers.sweep_job import resolve

    args = Namespace(
        resume=False,
        name="c",
        config=None,
        preset="smoke",
        overrides=["confirm.top_k=2", "confirm.seeds=3"],
        storage=None,
        tracking_uri=None,
        no_progress=True,
        print_config=False,
        verbose=False,
        take_over=False,
    )
    plan = resolve(args, "sifter_sweep")
    assert plan.confirm_seeds == [1, 2, 3]  # the explore stage trained with 42
    grid = plan.job.sweep.space["lambdas"].grid  # SIFTER's three pairs, then SimCSE: SimCSE wins explore here
    rows = [row("t0", {"lambdas": grid[1]}, 0.9), row("t1", {"lambdas": grid[0]}, 0.8)]
    settings = confirm.top_settings(
        rows, plan.job.group_out, plan.recipe.baseline_params, plan.job.confirm.top_k
    )
    cplan = confirm.comparison(plan, settings, plan.registered_name)
    assert (
        cplan.name == "c-confirm" and cplan.job.seeds == [1, 2, 3] and list(cplan.arms) == ["rank1", "rank2"]
    )
    assert cplan.job.registration.alias == "candidate" and cplan.job.registration.name == "sifter-simcse"
    simcse = cplan.arms["rank1"][1]  # the explore winner's typed config, its dropout from the grid point
    assert simcse.lambda_xx == 1 and simcse.dropout == 0.1 and cplan.arms["rank2"][1].lambda_xy == 1
    args.overrides, args.name = ["confirm.seeds=0"], "c0"  # a new sweep: 'c' kept its plan, the name is taken
    assert resolve(args, "sifter_sweep").confirm_seeds == []


def test_the_stand_in_goes_through_the_sweeps_publish_path_and_nothing_is_registered(embedded_tracking):
    """The same stand-in through the job's own publish step (embedded MLflow, no Ray: the explore and confirm
    trials are the rows their stages would record): rank1, first on dev, is not above the base on the tests,
    so nothing is registered, the parent run says beats_base=false and the last line says why."""
    import mlflow

    from orchestrator.drivers.compare_publish import CompareResult
    from orchestrator.drivers.sweep_job import SweepResult, resolve

    args = Namespace(
        resume=False,
        name="standin",
        config=None,
        preset="smoke",
        overrides=["confirm.top_k=2", "confirm.seeds=3"],
        storage=None,
        tracking_uri=None,
        no_progress=True,
        print_config=False,
        verbose=False,
        take_over=False,
    )
    plan = resolve(args, "sifter_sweep")
    grid = plan.job.sweep.space["lambdas"].grid
    explore = [
        row("t0", {"lambdas": grid[0]}, 0.99),
        row("t1", {"lambdas": grid[1]}, 0.80),
    ]  # grid[0] by construction
    settings = confirm.top_settings(explore, plan.job.group_out, {}, 2)
    cplan = confirm.comparison(plan, settings, plan.registered_name)
    base = BaseResult(0.80, TestReport("b", {H: 0.75}, H, ""), "base (default, mean)")
    tests = {"rank1": [0.748, 0.752, 0.750], "rank2": [0.749, 0.751, 0.753]}  # neither above the base
    trials = [
        {**row(f"{a}-s{s}", {"arm": a, "seed": s}, 0.9), "arm": a, "seed": s, "test": {H: v}, "headline": H}
        for a, vs in tests.items()
        for s, v in zip(plan.confirm_seeds, vs, strict=True)
    ]
    board = lb.build(
        [
            lb.ArmRuns(
                a, "sifter_simcse", "mean", {t["seed"]: {"test": t["test"]} for t in trials if t["arm"] == a}
            )
            for a in tests
        ],
        {"mean": {"label": base.label, "dev": base.dev, "test": base.test.metrics}},
        reference="rank1",
        headline=H,
    )
    result = SweepResult(
        "shards",
        explore,
        choose(explore, group_out=[], base=base, baseline_params={}),
        None,
        None,
        base,
        1.0,
        bases=[base],
        confirmed=(settings, cplan, CompareResult(trials, board, 1.0)),
    )
    assert result.choice.beats_base  # the dev gate alone would have let it through
    with mlflow.start_run(experiment_id=plan.exp_id) as parent:
        summary = confirm.publish(plan, result, parent.info.run_id)
    assert summary["registered"] is None and summary["beats_base"] is False
    assert summary["verdict"][-1].startswith(
        "no candidate: the best confirmed setting does not beat the base"
    )
    assert mlflow.MlflowClient().search_model_versions("name = 'sifter-simcse'") == []
    assert mlflow.get_run(parent.info.run_id).data.tags["beats_base"] == "false"
    report = (embedded_tracking / "outputs" / "reports" / "standin" / "summary.md").read_text()
    assert "## 1. Explore" in report and "## 2. Confirm" in report and "| rank1 |" in report
