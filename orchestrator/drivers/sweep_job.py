"""The driver every ``jobs/*_sweep.py`` shares, in three steps:

    plan = resolve(args)      # sweep file + base config (validated once), preflight: fail before Ray
    result = run(plan)        # corpus → the base model measured → Tune sweep → best trial exported + tested
    summary = publish(plan, result)   # MLflow child runs, registration gated on beating the base, report

The untouched base model is measured in the same run, with the same pooling and tasks, and is the
first row of every comparison. A sweep explores, then confirms (:mod:`orchestrator.drivers.confirm`): the explore
stage ranks settings on the dev task, one seed each; the confirm stage trains its ``confirm.top_k`` best again
with fresh paired seeds through the comparison engine and tests them on the test tasks, which the exploration
never read; ``candidate`` moves only when the best confirmed setting's interval against the base lies above 0.
``confirm.seeds: 0`` keeps the single-seed dev gate, and the card and the last line say "unconfirmed".
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow

from orchestrator import outbox, storage, tracking
from orchestrator.config import (
    REPO_ROOT,
    MethodConfig,
    apply_overrides,
    config_hash,
    read_yaml,
    resolve_config_path,
    set_path,
    validate,
)
from orchestrator.drivers import confirm
from orchestrator.drivers.cli import job_parser, location_overrides, print_config, resume_command
from orchestrator.drivers.cluster import init_ray, shutdown_ray
from orchestrator.drivers.engine import (
    keep_plan,
    kept_plan,
    kept_test,
    live_tracking,
    parent_run,
    plan_uri,
    refuse_another_plan,
    require_finished,
    sweep_dir,
    take_name,
    trial_rows,
)
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.sweep import run_sweep
from orchestrator.drivers.train import (
    Outcome,
    checkpoint_at,
    export_and_test,
    export_dir,
    measure_bases,
    preflight,
    settled,
)
from orchestrator.errors import ConfigError, TrackingError
from orchestrator.evaluation.suite import TestReport, compare_table, headline_metrics
from orchestrator.export import write_model_card
from orchestrator.job_files import SweepJobConfig, check_space, config_of
from orchestrator.results import publish as pub
from orchestrator.results.report import write_sweep_report
from orchestrator.results.verdict import seed_devs, verdict
from orchestrator.spec import BaseResult
from trainers.recipe import Recipe

# ---------------------------------------------------------------- 1. resolve
JOB_KEYS = ("sweep.", "confirm.")  # command-line keys of the sweep file itself; the rest set the base config


@dataclass
class SweepPlan:
    name: str
    job: SweepJobConfig
    recipe: type[Recipe]
    base: MethodConfig  # the base config, validated once; a sampled point's params are applied to it by path
    exp_id: str
    resume: bool = False
    progress: bool = True
    verbose: bool = False
    default_dir: str = ""  # the job's preset folder = its script's name (jobs/<default_dir>.py)
    configs: dict[str, MethodConfig] = field(default_factory=dict)  # each grid point's, typed (check_space)
    confirm_seeds: list[int] = field(default_factory=list)  # the confirm stage's; empty: no confirm stage

    @property
    def registered_name(
        self,
    ) -> str:  # the confirm stage's; without one the best trial's config may name another
        return self.base.tracking.registry_model_name or self.job.method.replace("_", "-")


def resolve(args: argparse.Namespace, default_dir: str) -> SweepPlan:
    """Sweep file → typed base config (YAML, then the sweep's base_overrides by path, then the command
    line) → every point of the space checked → preflight. Nothing here starts Ray. A ``--resume`` reads the
    plan the sweep kept when it started (never the preset's), and one given another plan is refused."""
    if args.resume and not args.name:
        raise ConfigError("--resume needs --name (the sweep to continue)")
    path = str(args.config or resolve_config_path(args.preset, default_dir))
    job = validate(
        SweepJobConfig,
        apply_overrides(read_yaml(Path(path)), [o for o in args.overrides if o.startswith(JOB_KEYS)]),
        path,
    )
    cli = [o for o in args.overrides if not o.startswith(JOB_KEYS)] + location_overrides(args)
    recipe, base, configs, seeds = typed(job, path, cli)
    if args.print_config:
        return SweepPlan("", inlined(job, base), recipe, base, "")
    if (
        not args.resume
    ):  # a new sweep: checked, then its name claimed, then its plan kept - before any Ray work
        exp_id = preflight(base)  # tracking server, storage, model source
        base = settled(base)
        name = take_name(args, base.run.storage, default_dir, "sweep")
        kept_at = plan_uri(sweep_dir(base.run.storage, name))
        keep_plan(kept_at, inlined(job, base))
    else:
        name = take_name(args, base.run.storage, default_dir, "sweep")
        kept_at = plan_uri(sweep_dir(base.run.storage, name))
        given = bool(args.config or args.preset or args.overrides)
        if (kept := kept_plan(kept_at, SweepJobConfig, f"sweep {name!r}", given)) is not None:
            now = inlined(job, settled(base))
            job = kept
            recipe, base, configs, seeds = typed(kept, kept_at, location_overrides(args))
            if given:  # both read by today's config models: a key added since is no difference
                refuse_another_plan(inlined(kept, settled(base)), now, f"sweep {name!r}", kept_at)
        exp_id = preflight(base)
        base = settled(base)
    configs = {k: settled(c) for k, c in configs.items()}  # a typed copy each: nothing validated again
    return SweepPlan(
        name,
        job,
        recipe,
        base,
        exp_id,
        args.resume,
        not args.no_progress,
        args.verbose,
        default_dir,
        configs,
        seeds,
    )


def typed(job: SweepJobConfig, path: str, cli: list[str]):
    """The sweep file's recipe, its typed base config, every point of its space typed, and the confirm
    stage's seeds - each refused in one line naming the file and key."""
    recipe = get_method(job.method)
    if isinstance(job.base, dict):  # the whole base config inline (what --print-config writes)
        data, source = dict(job.base), f"{path}: base"
    else:
        base_path = Path(job.base) if Path(job.base).is_absolute() else REPO_ROOT / job.base
        data, source = read_yaml(base_path), str(base_path)
    for key, value in job.base_overrides.items():
        set_path(data, key.split("."), value, f"{path}: base_overrides.{key}")
    base = validate(recipe.config_cls, apply_overrides(data, cli), f"{source} (+ overrides)")
    if not recipe.has_dev(base):
        raise ConfigError(
            f"{path}: a sweep ranks settings on a dev score, and this {job.method} config has none "
            "(eval.dev is empty - the paper's protocol); set eval.dev to tune on a labelled dev set"
        )
    configs = check_space(base, job.sweep.space, path)
    return recipe, base, configs, confirm.check(job, recipe, base, configs, path)


def inlined(job: SweepJobConfig, base: MethodConfig) -> SweepJobConfig:
    """The sweep file with its base config inline: what ``--print-config`` prints and a sweep keeps."""
    return job.model_copy(update={"base": base.model_dump(mode="json"), "base_overrides": {}})


# ---------------------------------------------------------------- 2. run
@dataclass
class SweepResult:
    shards: str
    rows: list[dict]  # every trial, best dev first
    choice: pub.Choice
    test: TestReport | None  # the chosen trial's test report (None: a confirm stage tested instead)
    model_dir: Path | None
    base: BaseResult | None  # the yardstick: the strongest of ``bases`` on the dev metric
    wall_s: float
    extra: dict = field(default_factory=dict)
    bases: list[BaseResult] = field(default_factory=list)  # every pooling the base was measured with
    confirmed: tuple | None = None  # (settings, its ComparePlan, its CompareResult) when a confirm stage ran


def run(plan: SweepPlan, parent_id: str | None = None) -> SweepResult:
    """The data, the base model measured, the sweep (each trial logging into its own nested MLflow run
    while it trains), and the chosen trial exported and tested."""
    init_ray(quiet=not plan.verbose, needs=[plan.base, *plan.configs.values()])
    t0 = time.time()
    recipe, job = plan.recipe, plan.job
    shards = recipe.prepare_data(plan.base, progress=plan.progress)
    dim = job.sweep.space.get("model.pooling")
    bases = measure_bases(recipe, plan.base, tried=dim.candidates() if dim is not None else ())
    base = max(bases, key=lambda b: b.dev) if bases else None
    if base is not None and parent_id:  # on the parent run at once: the yardstick of every trial curve
        tracking.log_metrics({"base_dev": base.dev})
    live = live_tracking(plan.base.tracking.tracking_uri, plan.exp_id, parent_id, plan.name)
    trials_dir = export_dir(plan.base, f"{plan.name}-trials")  # each trial's export, on a local storage
    keep = None if storage.is_s3(plan.base.run.storage) else str(trials_dir)
    grid = run_sweep(
        job,
        plan.base,
        shards,
        name=plan.name,
        storage_root=plan.base.run.storage,
        resume=plan.resume,
        verbose=plan.verbose,
        tracking=live,
        configs=plan.configs,
        test=job.test_every_trial,
        keep=keep,
    )
    rows = trial_rows(grid, recipe.metric, recipe.selection_metric(plan.base))
    # a trial that failed (killed, out of memory) is a setting never measured: the sweep stops, resumable
    require_finished(
        [r for r in rows if r["error"]], len(rows), f"sweep {plan.name!r}", resume_command(plan.name)
    )
    if not any(r["checkpoint_path"] for r in rows):
        raise ConfigError(
            f"sweep {plan.name}: no trial reported a checkpoint (errors: {[r['error'] for r in rows]})"
        )
    tested = [r for r in rows if r["checkpoint_path"]] if job.test_every_trial else []
    reports = {}
    where = sweep_dir(plan.base.run.storage, plan.name)
    for r in tested:  # e.g. mean ± std over seeds (and SIFTER-LSTM's baseline) needs every trial's test score
        path, report = kept_test(where, r["trial"]) or (None, None)
        if path != r["checkpoint_path"]:  # not tested in its trial (stopped early), or another checkpoint
            print(f"[{r['trial']}] tested after the sweep", flush=True)
            _, report = _export(plan, r, trials_dir / r["trial"])
        reports[r["trial"]] = report
        r["test"] = report.metrics
    choice = pub.choose(
        rows,
        group_out=job.group_out,
        base=base,
        baseline_params=recipe.baseline_params,
        margin=job.candidate_margin,
    )
    if plan.confirm_seeds:  # the confirm stage trains, tests and registers: no single trial is exported
        staged = confirm.stage(plan, rows, bases, parent_id)
        return SweepResult(
            shards, rows, choice, None, None, base, time.time() - t0, bases=bases, confirmed=staged
        )
    # the chosen trial, exported where the registry reads it; tested once: a trial tested above is not
    # measured again (the same checkpoint, the same deterministic evaluation: a 7-task STS test is minutes)
    known = reports.get(choice.best["trial"])
    model_dir, test = _export(plan, choice.best, export_dir(plan.base, plan.name), tested=known)
    if known is not None:
        print(
            f"chosen trial {choice.best['trial']}: its test, measured with every trial, is not run again",
            flush=True,
        )
    choice.best["test"] = test.metrics
    return SweepResult(shards, rows, choice, test, model_dir, base, time.time() - t0, bases=bases)


def _export(plan: SweepPlan, row: dict, out: Path, tested: TestReport | None = None):
    cfg = config_of(plan.base, plan.configs, row["params"], f"trial {row['trial']}")
    outcome = Outcome(checkpoint_at(row["checkpoint_path"]), row["best"], row["history"])
    return export_and_test(plan.recipe, cfg, outcome, out, tested=tested)


# ---------------------------------------------------------------- 3. publish
UNCONFIRMED = " - unconfirmed: one seed, selected and gated on the same dev score (confirm.seeds: 0)"


def publish(plan: SweepPlan, result: SweepResult, parent_id: str) -> dict:
    """Child runs, parent metrics (best and base), the model registered (``candidate`` only when it
    beats the base), and the report."""
    if result.confirmed is not None:
        return confirm.publish(plan, result, parent_id)
    recipe, choice, best = plan.recipe, result.choice, result.choice.best
    pub.log_trials(plan.exp_id, parent_id, plan.name, result.rows, recipe.metric)
    base_metrics = (
        {"base_dev": result.base.dev, **{f"base_test_{k}": v for k, v in result.base.test.metrics.items()}}
        if result.base
        else {}
    )
    tracking.log_metrics(
        {
            **{f"best_test_{k}": v for k, v in result.test.metrics.items()},
            f"best_{recipe.metric}": best["best_dev"],
            **base_metrics,
        }
    )
    best_cfg = config_of(plan.base, plan.configs, best["params"], "best trial")
    reg_name = best_cfg.tracking.registry_model_name or plan.registered_name
    chash, test = config_hash(best_cfg), result.test
    champion = tracking.alias_tags(reg_name, "champion")  # before this version: the one a person promoted
    card = pub.model_card(
        recipe=recipe,
        cfg=best_cfg,
        origin=f"sweep `{plan.name}`, trial `{best['trial']}`; unconfirmed: one seed, selected and gated on the same dev score",
        params=best["params"],
        test=test,
        base=result.base,
        choice=choice,
        registered_name=reg_name,
        champion=champion,
        steps=pub.trained_steps(best.get("history", [])),
    )
    write_model_card(result.model_dir, card)
    mlflow.log_text(card, "model_card.md")
    # each publish step is idempotent, so a resumed sweep finishes what a crash cut and repeats nothing
    model_uri = mlflow.get_run(parent_id).data.tags.get("sieve.best_model_uri")
    if model_uri is None:
        model_uri = recipe.log_model(result.model_dir, name="best_model").model_uri
        mlflow.set_tag("sieve.best_model_uri", model_uri)
    registered = pub.register(
        model_uri,
        reg_name,
        choice,
        key=f"sweep:{plan.name}",
        description=f"sweep {plan.name}; config {chash}; best trial {best['trial']}\n\n{pub.mlflow_description(card)}",
        tags={
            "sweep": plan.name,
            "config_hash": chash,
            "trial": best["trial"],
            "run_id": parent_id,
            recipe.metric: f"{best['best_dev']:.6f}",
            "test_metric": test.headline,
            "test_score": f"{test.headline_value:.6f}",  # what promote compares
            **{f"test_{k}": f"{v:.6f}" for k, v in headline_metrics(test).items()},
        },
    )
    registered["run_id"] = parent_id
    line = pub.gate_line(choice, recipe.metric_label, registered) + UNCONFIRMED
    if not registered["new"]:
        line += f" (this sweep was published before: v{registered['version']} stands, nothing new registered)"
    report_dir = Path("outputs") / "reports" / plan.name
    write_sweep_report(
        report_dir,
        name=plan.name,
        method=plan.job.method,
        recipe=recipe,
        rows=result.rows,
        group_out=plan.job.group_out,
        choice=choice,
        base=result.base,
        test=test,
        other_bases=[b for b in result.bases if b is not result.base],
        best_config=best_cfg.model_dump(mode="json"),
        registered=registered,
        gate=line,
        wall_s=result.wall_s,
        champion=champion,
    )
    mlflow.log_artifacts(str(report_dir), "report")
    mlflow.log_metric("wall_s", result.wall_s)
    mlflow.set_tags({"beats_base": str(choice.beats_base).lower()})
    uri = tracking.resolve_tracking_uri(plan.base.tracking.tracking_uri)
    closing = verdict(
        method=plan.job.method,
        choice=choice,
        metric_label=recipe.metric_label,
        test=test,
        base=result.base,
        champion=champion,
        registered=registered,
        devs=seed_devs(result.rows, best, plan.job.group_out),
        report=report_dir / "summary.md",
        summary_json=report_dir / "summary.json",
        job=plan.default_dir,
        gate=line,
        rows=result.rows,
    )
    mlflow.set_tag("mlflow.note.content", "\n\n".join(closing))  # the parent run's description in the UI
    return {
        "verdict": closing,
        "sweep": plan.name,
        "trials": len(result.rows),
        "best_trial": best["trial"],
        "best_params": best["params"],
        "best_dev": best["best_dev"],
        "base_dev": choice.base_dev,
        "beats_base": choice.beats_base,
        f"test_{test.headline}": test.headline_value,
        "registered": registered,
        "wall_s": round(result.wall_s, 1),
        "report": str(report_dir / "summary.md"),
        "mlflow_ui": (
            f".venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
            if uri.startswith("sqlite")
            else uri
        ),
        "gate": line,
    }


def publish_outage(exc: BaseException, plan: SweepPlan) -> TrackingError | None:
    """The outage line (``outbox.outage``) for a sweep: its trials are kept in the sweep's storage."""
    return outbox.outage(
        exc,
        plan.base.tracking.tracking_uri,
        f"sweep {plan.name!r}",
        plan.base.run.storage,
        f"python jobs/{plan.default_dir}.py --name {plan.name} --resume",
    )


def main(doc: str, default_dir: str) -> int:
    t0 = time.time()
    args = job_parser(doc, default_dir, resumes="sweep").parse_args()
    plan = resolve(args, default_dir)
    if args.print_config:
        return print_config(plan.job)
    if plan.resume and pub.answer_published(
        sweep_dir(plan.base.run.storage, plan.name), f"sweep {plan.name!r}", t0
    ):
        return 0
    try:
        with parent_run(
            plan.exp_id,
            plan.name,
            "sweep",
            plan.resume,
            {"sieve.method": plan.job.method},
            {
                "base": plan.base.model_dump(mode="json"),
                "space": plan.job.sweep.model_dump(mode="json"),
                "config_hash": config_hash(plan.base),
            },
        ) as parent:
            result = run(plan, parent.info.run_id)
            summary = publish(plan, result, parent.info.run_id)
    except Exception as exc:
        raise publish_outage(exc, plan) or exc  # noqa: B904 - the outage line replaces MLflow's retries' traceback
    shutdown_ray()
    console = summary.pop("console") if result.confirmed is not None else unconfirmed_console(result)
    data = {k: v for k, v in summary.items() if k not in ("gate", "verdict")}
    Path(summary["report"]).with_name("summary.json").write_text(json.dumps(data, indent=2) + "\n")
    console += "\n\n" + "\n".join(summary["verdict"])  # the closing verdict; its last line the registration
    pub.write_published(sweep_dir(plan.base.run.storage, plan.name), summary, console)
    print(console)
    return 0


def unconfirmed_console(result: SweepResult) -> str:
    console = result.test.table
    if result.base is not None:
        console += f"\n\ncandidate − base ({result.base.label}), ×100:\n" + compare_table(
            result.base.test, result.test
        )
    return console
