"""``jobs/compare.py``: K seeds × N arms on one base model, paired by seed, with confidence intervals.

An *arm* is any method's config (a preset file + overrides) on the same base model, trained for the same
number of steps and tested on the same tasks. Every arm runs once per seed; two runs with one seed see the
same data order (arms of one method read the same shards) and start their new parts (an MLP head, a
decoder) from the same draw, so the seed's noise cancels in their difference. The untouched base model is
measured once per test-time pooling the arms are read with, in the same run. Then
:mod:`orchestrator.results.leaderboard` gives each arm's mean ± std, its paired difference against the
base and against the reference arm with a 95% interval, and its training-loss level (a saturated arm
tests nothing).

An arm may first train a *start stage* - another method from the same base model, with the arm's seed - and
train from the model it exports (:mod:`orchestrator.drivers.compare_start`): a pipeline set against its last
stage alone (in-domain TSDAE, then SBERT, against SBERT).

    plan = resolve(args)       # the compare file, every arm's config validated, the arms checked comparable
    result = run(plan, parent) # data, the base per pooling, Tune over arm × seed (each trial trains and tests)
    summary = publish(...)     # (compare_publish.py) child runs, the leaderboard on the parent run,
                               # the winner registered only when its interval against the base is above 0

Resumable: a killed driver continues with ``--name NAME --resume``; a trial that finished training is not
trained again (its reports are replayed), one whose test finished is not tested again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ray
import ray.tune
from ray import tune

from orchestrator import storage, tracking
from orchestrator.config import (
    EncoderMethodConfig,
    MethodConfig,
    with_params,
)
from orchestrator.drivers.cli import job_parser, print_config
from orchestrator.drivers.cluster import concurrent_trials, init_ray, shutdown_ray
from orchestrator.drivers.compare_plan import ComparePlan, resolve, seeded, test_pooling
from orchestrator.drivers.compare_publish import CompareResult, publish
from orchestrator.drivers.compare_start import start_from
from orchestrator.drivers.engine import (
    launch,
    live_tracking,
    name_of,
    parent_run,
    reports_uri,
    require_finished,
    selected_row,
    sweep_dir,
    test_trial,
    tests_uri,
    train_trial,
    trial_row,
)
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import materializes
from orchestrator.errors import ConfigError
from orchestrator.models import resolve_model_source, saved_pooling
from orchestrator.results import leaderboard as lb
from orchestrator.results import publish as pub


def parse_args(doc: str) -> argparse.Namespace:
    ap = job_parser(doc, "compare", resumes="comparison")
    ap.add_argument(
        "--out", help="also write the leaderboard here (FILE.md, with FILE.json and FILE.png beside it)"
    )
    ap.add_argument(
        "--status",
        action="store_true",
        help="the interim leaderboard of the comparison NAME's finished "
        "trials, read from its storage while it runs (no Ray, nothing trained)",
    )
    return ap.parse_args()


# ---------------------------------------------------------------- 2. run
def compare_trial(
    tune_config: dict,
    *,
    arms: dict[str, tuple[str, MethodConfig]],
    shards: dict[str, str],
    sweep_dir: str,
    tracking: dict | None = None,
    starts: dict[str, tuple[str, MethodConfig]] | None = None,
    start_shards: dict[str, str] | None = None,
) -> None:
    """One Tune trial: arm ``params.arm`` trained with ``params.seed`` (or its reports replayed) - after its
    start stage, when it has one (:mod:`~orchestrator.drivers.compare_start`) - then tested (the engine's one
    test stage, kept in the storage)."""
    params = tune_config["params"]
    method, base = arms[params["arm"]]
    recipe = get_method(method)
    cfg = seeded(base, params["seed"])
    if params["arm"] in (starts or {}):
        trial = ray.tune.get_context().get_trial_name()
        cfg = start_from(
            starts[params["arm"]], cfg, trial=trial, shards=start_shards[params["arm"]], where=sweep_dir
        )
    train_trial(recipe, cfg, params, shards=shards[params["arm"]], sweep_dir=sweep_dir, tracking=tracking)
    test_trial(recipe, cfg, params, sweep_dir=sweep_dir)


def measure_bases(plan: ComparePlan, where: str) -> dict[str, dict]:
    """The untouched model once per test-time pooling the arms are read with, and with the folder's own (a
    comparison in another pooling never hides a stronger base); kept, so a resume does not measure it again."""
    out = {}
    variants = [*plan.arms.values()]
    spec0, cfg0 = variants[0]
    if isinstance(cfg0, EncoderMethodConfig) and (
        saved := saved_pooling(resolve_model_source(cfg0.model.name_or_path))
    ):
        variants.append((spec0, with_params(cfg0, {"model.pooling": saved}, "the base's own pooling")))
    for recipe, cfg in variants:
        pooling = test_pooling(cfg)
        if pooling in out or not recipe.has_base:
            continue
        uri = storage.join(where, "base", f"{pooling}.json")
        if not storage.exists(uri):
            b = recipe.evaluate_base(cfg)
            storage.write_bytes(
                uri, json.dumps({"label": b.label, "dev": b.dev, "test": b.test.metrics}).encode()
            )
        out[pooling] = json.loads(storage.read_bytes(uri))
    return out


def run(plan: ComparePlan, parent_id: str | None = None) -> CompareResult:
    init_ray(
        quiet=not plan.verbose,
        needs=[cfg for _, cfg in (*plan.arms.values(), *plan.starts.values())],
    )
    t0 = time.time()
    where = sweep_dir(plan.first.run.storage, plan.name)
    shards = {
        name: recipe.prepare_data(cfg, progress=plan.progress) for name, (recipe, cfg) in plan.arms.items()
    }
    start_shards = {
        name: recipe.prepare_data(cfg, progress=plan.progress) for name, (recipe, cfg) in plan.starts.items()
    }
    bases = measure_bases(plan, where)
    if parent_id:
        tracking.log_metrics(
            {f"base_{p}_test_{k}": v for p, b in bases.items() for k, v in b["test"].items()}
        )
    live = live_tracking(plan.first.tracking.tracking_uri, plan.exp_id, parent_id, plan.name)
    trainable = tune.with_parameters(
        compare_trial,
        arms={n: (recipe.name, cfg) for n, (recipe, cfg) in plan.arms.items()},
        shards=shards,
        sweep_dir=where,
        tracking=live,
        starts={n: (recipe.name, cfg) for n, (recipe, cfg) in plan.starts.items()},
        start_shards=start_shards,
    )
    concurrent = min(
        concurrent_trials(cfg, plan.job.max_concurrent_trials, streams=not materializes(cfg, data[n]))
        for group, data in ((plan.arms, shards), (plan.starts, start_shards))
        for n, (_, cfg) in group.items()
    )
    first_recipe = next(iter(plan.arms.values()))[0]
    # new (resolve() refused a name in use), or killed before any trial started (the base is kept): a new
    # experiment; else the killed one restored
    grid = launch(
        trainable,
        {"arm": tune.grid_search(list(plan.arms)), "seed": tune.grid_search(plan.job.seeds)},
        name=plan.name,
        storage_root=plan.first.run.storage,
        resume=plan.resume,
        concurrent=concurrent,
        progress=(first_recipe.metric, first_recipe.metric_label),
        verbose=plan.verbose,
    )
    rows = collect(plan, grid, where)
    board = leaderboard(plan, rows, bases)
    if lost := [r for r in rows if not r["test"]]:  # never a leaderboard published short of a trial
        if len(lost) < len(rows):
            print(
                f"\ncomparison {plan.name!r}, partial: {len(rows) - len(lost)} of {len(rows)} trials tested\n"
            )
            print(lb.markdown(board), flush=True)
        require_finished(lost, len(rows), f"comparison {plan.name!r}", plan.rerun)
    return CompareResult(rows, board, time.time() - t0)


def collect(plan: ComparePlan, grid, where: str) -> list[dict]:
    """Every trial's row: its arm and seed, its reports, its test (None when it failed)."""
    rows = []
    for r in grid:
        params = r.config.get("params", {})
        trial_id = (r.metrics or {}).get("trial_id")
        name = name_of(trial_id, params) if trial_id else (Path(r.path).name if r.path else "?")
        row = trial_record(plan, name, params, where)
        row["error"] = str(r.error).splitlines()[0][:300] if r.error else None
        rows.append(row)
    return rows


def trial_record(plan: ComparePlan, trial: str, params: dict, where: str) -> dict:
    """A trial's row from the storage: its reports (none yet: empty), its arm and seed, its test ({} until kept)."""
    recipe, base = plan.arms[params["arm"]]
    cfg = seeded(base, params["seed"])
    row = (
        selected_row(recipe, cfg, trial, params, where)
        if storage.exists(reports_uri(where, trial))
        else trial_row(trial, params, [], recipe.metric)
    )
    test_file = tests_uri(where, trial)
    test = json.loads(storage.read_bytes(test_file)) if storage.exists(test_file) else None
    row.update(
        arm=params["arm"],
        seed=params["seed"],
        method=plan.method_label(params["arm"]),
        error=None,
        stopped_early=False,
        test=test["metrics"] if test else {},
        headline=test["headline"] if test else None,
    )
    return row


def interim(plan: ComparePlan, where: str) -> str:
    """``--status``: the leaderboard of the trials tested so far (their records in the storage), said to be one."""
    seen: dict[str, dict] = {}
    for f in storage.list_files(storage.join(where, "invocations")):
        rec = json.loads(storage.read_bytes(storage.join(where, "invocations", f)))
        seen[rec["trial"]] = rec["params"]
    if stray := sorted({p["arm"] for p in seen.values()} - set(plan.arms)):
        raise ConfigError(
            f"comparison {plan.name!r}: its trials ran arm(s) {', '.join(stray)} that this plan has not "
            f"({', '.join(plan.arms)}): the name is not this plan's comparison"
        )
    rows = [
        trial_record(plan, trial, params, where)
        for trial, params in seen.items()
        if storage.exists(tests_uri(where, trial))
    ]
    bases = {
        f.removesuffix(".json"): json.loads(storage.read_bytes(storage.join(where, "base", f)))
        for f in storage.list_files(storage.join(where, "base"))
    }
    total = len(plan.arms) * len(plan.job.seeds)
    head = f"comparison {plan.name!r}, interim: {len(rows)} of {total} trials tested (its figures move as the rest end)"
    return head + "\n\n" + (lb.markdown(leaderboard(plan, rows, bases)) if rows else "no trial tested yet")


def leaderboard(plan: ComparePlan, rows: list[dict], bases: dict[str, dict]) -> dict:
    arms = {
        n: lb.ArmRuns(n, plan.method_label(n), test_pooling(cfg), budget=plan.budget_label(n))
        for n, (_, cfg) in plan.arms.items()
    }
    for r in rows:
        if not r["test"]:
            continue
        losses = [h["loss"] for h in r["history"] if isinstance(h.get("loss"), int | float)]
        recipe, cfg = plan.arms[
            r["arm"]
        ]  # without a dev score best_dev is the last step (selected_row): no dev shown
        arms[r["arm"]].runs[r["seed"]] = {
            "test": r["test"],
            "dev": r["best_dev"] if recipe.has_dev(cfg) else None,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
        }
    headline = plan.job.headline or next(
        (r["headline"] for r in rows if r.get("headline")), "sts_avg_spearman_all"
    )
    return lb.build(
        list(arms.values()),
        bases,
        reference=plan.job.reference,
        headline=headline,
        confidence=plan.job.confidence,
        interval=plan.job.interval,
    )


def main(doc: str) -> int:
    t0 = time.time()
    args = parse_args(doc)
    plan = resolve(args)
    if args.print_config:
        return print_config(plan.job)
    if args.status:
        print(interim(plan, sweep_dir(plan.first.run.storage, plan.name)))
        return 0
    where = sweep_dir(plan.first.run.storage, plan.name)
    if plan.resume and pub.answer_published(where, f"comparison {plan.name!r}", t0):
        return 0
    with parent_run(
        plan.exp_id,
        plan.name,
        "compare",
        plan.resume,
        {"sieve.arms": ", ".join(plan.arms)},
        {
            "seeds": plan.job.seeds,
            "reference": plan.job.reference,
            **{f"arm.{n}": cfg.model_dump(mode="json") for n, (_, cfg) in plan.arms.items()},
            **{f"arm.{n}.start": cfg.model_dump(mode="json") for n, (_, cfg) in plan.starts.items()},
        },
    ) as parent:
        result = run(plan, parent.info.run_id)
        summary = publish(plan, result, parent.info.run_id, out=args.out)
    shutdown_ray()
    console = "\n".join(
        [
            json.dumps({k: v for k, v in summary.items() if k not in ("gate", "leaderboard")}, indent=2),
            summary["leaderboard"],
            *([summary["gate"]] if summary["gate"] else []),
        ]
    )
    pub.write_published(where, summary, console)
    print(console)
    return 0
