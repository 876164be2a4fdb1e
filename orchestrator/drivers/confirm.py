"""A sweep's second stage: its best settings confirmed over paired seeds, on tests the exploration never read.

The explore stage ranks settings on the dev task with one seed each, so the winner's dev margin is biased
upwards (the winner's curse: the setting that drew the luckiest seed ranks first). The confirm stage is the
comparison engine of :mod:`orchestrator.drivers.compare` run on the sweep's own terms: each of the
``confirm.top_k`` best settings is an arm, trained again with ``confirm.seeds`` fresh seeds (none the
explore stage trained with), every arm at the same steps, tested on the test tasks beside the untouched base
the explore stage measured in the same run; the leaderboard's Holm-adjusted interval against the base (over
the settings) is the registration gate, and the winner is registered as ``candidate`` only when it lies above 0.

    settings = top_settings(rows, ...)       # the explore stage's ranking on dev, best k
    plan = comparison(sweep_plan, settings)  # a ComparePlan: arms rank1..rankk, the confirm seeds
    result = compare.run(plan)               # the base's figures handed over first (stage() does both)

``plan`` below is the sweep's :class:`~orchestrator.drivers.sweep_job.SweepPlan` and ``result`` its
``SweepResult`` (not imported: sweep_job imports this module).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow

from orchestrator import storage, tracking
from orchestrator.config import MethodConfig
from orchestrator.drivers import compare, compare_publish
from orchestrator.drivers.cli import resume_command
from orchestrator.drivers.compare_plan import ComparePlan
from orchestrator.drivers.compare_publish import CompareResult
from orchestrator.drivers.engine import sweep_dir
from orchestrator.drivers.train import base_poolings
from orchestrator.errors import ConfigError
from orchestrator.evaluation.encode import test_time_pooling
from orchestrator.job_files import (
    ArmConfig,
    CompareJobConfig,
    RegisterBlock,
    SweepJobConfig,
    config_of,
    confirm_seeds,
)
from orchestrator.results import leaderboard as lb
from orchestrator.results import publish as pub
from orchestrator.results.publish import explore_table, top_settings
from orchestrator.results.verdict import saturation_line
from orchestrator.spec import BaseResult
from trainers.recipe import Recipe


def check(
    job: SweepJobConfig, recipe: type[Recipe], base: MethodConfig, configs: dict[str, MethodConfig], path: str
) -> list[int]:
    """The confirm stage's seeds, or [] without one; refused before Ray where it could not confirm: a method
    without an untouched base, or a test task the explore stage selects on."""
    if not job.confirm.on:
        return []
    if not recipe.has_base:
        raise ConfigError(
            f"{path}: confirm: {job.method}'s baseline is a point of its own grid, not an untouched base a "
            "confirmed setting can be set against; set confirm.seeds: 0"
        )
    for cfg in [base, *configs.values()]:
        if shared := [t for t in recipe.test_tasks(cfg) if t in recipe.dev_tasks(cfg)]:
            raise ConfigError(
                f"{path}: eval: the test task {shared[0]!r} is the explore stage's dev task; the confirm stage "
                "tests on tasks the selection never read"
            )
    explored = {cfg.train.seed for cfg in [base, *configs.values()]}
    return confirm_seeds(job.confirm, explored, path)


def comparison(plan, settings: list[dict], registered_name: str) -> ComparePlan:
    """The confirm stage as a comparison: every setting an arm of the same method, its config the explore
    stage's typed one; the first (the explore winner) is the reference; registration of the best arm, gated."""
    arms = {
        s["arm"]: (plan.recipe, config_of(plan.base, plan.configs, s["params"], f"confirm {s['arm']}"))
        for s in settings
    }
    job = CompareJobConfig(
        seeds=plan.confirm_seeds,
        arms={
            name: ArmConfig(method=plan.recipe.name, config=cfg.model_dump(mode="json"))
            for name, (_, cfg) in arms.items()
        },
        reference=settings[0]["arm"],
        confidence=plan.job.confirm.confidence,
        max_concurrent_trials=plan.job.sweep.max_concurrent_trials,
        registration=RegisterBlock(arm="best", name=registered_name, alias="candidate"),
    )
    return ComparePlan(
        confirm_name(plan.name),
        job,
        arms,
        plan.exp_id,
        plan.resume,
        plan.progress,
        plan.verbose,
        rerun=resume_command(plan.name),  # the sweep's own command: its confirm stage resumes with it
    )


def confirm_name(sweep: str) -> str:
    return f"{sweep}-confirm"


def hand_over_bases(plan, cplan: ComparePlan, bases: list[BaseResult]) -> None:
    """The base the explore stage measured (same run, same tasks, every pooling) kept where the comparison
    engine looks for it, so it is not measured a second time."""
    dim = plan.job.sweep.space.get("model.pooling")
    poolings = base_poolings(plan.recipe, plan.base, tried=dim.candidates() if dim is not None else ())
    where = sweep_dir(cplan.first.run.storage, cplan.name)
    for pooling, b in zip(poolings, bases, strict=True):
        uri = storage.join(where, "base", f"{test_time_pooling(pooling)}.json")
        if not storage.exists(uri):
            storage.write_bytes(
                uri, json.dumps({"label": b.label, "dev": b.dev, "test": b.test.metrics}).encode()
            )


def stage(
    plan, rows: list[dict], bases: list[BaseResult], parent_id: str | None
) -> tuple[list[dict], ComparePlan, CompareResult]:
    """The confirm stage through the comparison engine - the same trial, test, resume rule and leaderboard as
    ``jobs/compare.py`` - on the explore stage's ``rows``: (its settings, its plan, its result)."""
    job = plan.job
    settings = top_settings(rows, job.group_out, plan.recipe.baseline_params, job.confirm.top_k)
    cplan = comparison(plan, settings, plan.registered_name)
    hand_over_bases(plan, cplan, bases)
    return settings, cplan, compare.run(cplan, parent_id)


def publish(plan, result, parent_id: str) -> dict:
    """Both stages published on the sweep's parent run: the explore trials as child runs, the confirm stage
    through the comparison's publish path (its trials, the leaderboard, the gated registration and card), the
    report with the explore ranking and the confirm table, and the closing verdict."""
    settings, cplan, cresult = result.confirmed
    recipe, board = plan.recipe, cresult.board
    pub.log_trials(plan.exp_id, parent_id, plan.name, result.rows, recipe.metric)
    summary = compare_publish.publish(cplan, cresult, parent_id)
    top = lb.winner(board, "best")
    chosen = next(s for s in settings if s["arm"] == top["arm"])
    registered = summary["registered"]
    h, d = board["headline"], top["vs_base"]
    confirmed = f"{top['arm']} − base on {h} over seeds {top['seeds']}: {lb.ci_text(d)}"
    if registered:
        registered["run_id"] = parent_id
        last = f"candidate: {registered['name']} v{registered['version']} (confirmed: {confirmed})"
    else:
        last = f"no candidate: the best confirmed setting does not beat the base on the test tasks ({confirmed}); nothing registered"
    report_dir = Path("outputs") / "reports" / plan.name
    report_dir.mkdir(parents=True, exist_ok=True)
    table = lb.markdown(board)
    base_dev = f" (the base: {result.base.dev * 100:.2f})" if result.base is not None else ""
    (report_dir / "summary.md").write_text(
        f"# Sweep `{plan.name}`: explore, then confirm\n\n"
        f"## 1. Explore: {len(result.rows)} trials ranked on {recipe.metric_label}, one seed each{base_dev}\n\n"
        f"{explore_table(settings, result.rows, plan.job.group_out, recipe.metric_label)}\n\n"
        f"## 2. Confirm: the best {len(settings)} setting(s) again, seeds {plan.confirm_seeds}, on the test "
        "tasks (never read by the explore stage)\n\n"
        + "\n".join(f"- {s['arm']}: {s['label']}" for s in settings)
        + f"\n\n{table}\n\n{summary['gate'] or ''}\n\n{last}\n"
    )
    (report_dir / "leaderboard.json").write_text(lb.dumps(board))  # the confirm table's per-seed scores
    (report_dir / "trials.json").write_text(
        json.dumps(result.rows, indent=2, default=str)
    )  # the explore stage's
    if result.base is not None:
        b = result.base
        (report_dir / "base.json").write_text(
            json.dumps({"label": b.label, "dev": b.dev, "test": b.test.metrics})
        )
    mlflow.log_artifacts(str(report_dir), "report")
    mlflow.set_tags({"beats_base": str(bool(top["gate"])).lower(), "sieve.confirmed": "true"})
    verdict = [
        f"verdict: {plan.job.method} {chosen['label']} ({top['arm']}: explore rank {chosen['arm'][4:]} of "
        f"{len(pub.ranked_settings(result.rows, plan.job.group_out, recipe.baseline_params))} settings on dev)",
        f"explore: {recipe.metric_label} {chosen['dev_mean'] * 100:.2f}{base_dev} - the figure it was selected on",
        f"confirm: {confirmed}; test {h} {top['mean'][h] * 100:.2f} ± {top['std'][h] * 100:.2f} vs base "
        f"{board['bases'][top['pooling']]['test'][h] * 100:.2f}",
        f"report: {(report_dir / 'summary.md').resolve()} (summary JSON: {(report_dir / 'summary.json').resolve()}); "
        f"MLflow run {parent_id}",
        f"next: python jobs/promote.py --model {registered['name']} --version {registered['version']}   # to make it "
        "@champion"
        if registered
        else f"next: python jobs/{plan.default_dir}.py --print-config   # the keys to sweep wider or train longer",
        *filter(None, [saturation_line(result.rows)]),
        last,
    ]
    mlflow.set_tag("mlflow.note.content", "\n\n".join(["\n".join(verdict), table]))
    uri = tracking.resolve_tracking_uri(plan.base.tracking.tracking_uri)
    return {
        "verdict": verdict,
        "sweep": plan.name,
        "trials": len(result.rows),
        "explore": {"best_trial": result.choice.best["trial"], "best_dev": result.choice.best_dev},
        "confirm": {
            "comparison": cplan.name,
            "seeds": plan.confirm_seeds,
            "settings": [{k: s[k] for k in ("arm", "label", "params", "dev_mean")} for s in settings],
            "ranked": [r["arm"] for r in board["rows"]],
            "best": top["arm"],
            "vs_base": d,
            "failed": summary["failed"],
        },
        "beats_base": bool(top["gate"]),
        "registered": registered,
        "wall_s": round(result.wall_s, 1),
        "report": str(report_dir / "summary.md"),
        "mlflow_ui": uri,
        "gate": last,
        "console": table,
    }
