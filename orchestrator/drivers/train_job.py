"""``jobs/train.py``: one training run of any method, beside its base model.

config (validated once) → preflight → data → base model measured → one trial of the engine (one arm × one seed:
a Ray Train run inside a Tune trial, as every job's) → export → test → one MLflow run (kept as a pending record
when the tracking server is gone)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from orchestrator import live_runs, outbox, storage, tracking
from orchestrator.claims import claim
from orchestrator.config import apply_overrides, config_hash, read_yaml, resolve_config_path, validate
from orchestrator.drivers.cli import job_parser, location_overrides, print_config
from orchestrator.drivers.cluster import init_ray, shutdown_ray
from orchestrator.drivers.engine import run_one, sweep_dir
from orchestrator.drivers.registry import get_method, log_model, method_names
from orchestrator.drivers.train import (
    Beside,
    Outcome,
    checkpoint_at,
    export_and_test,
    export_dir,
    idle_cores,
    measure_bases,
    preflight,
    settled,
)
from orchestrator.errors import ConfigError
from orchestrator.evaluation.suite import compare_table
from orchestrator.export import write_model_card
from orchestrator.results import publish as pub


def parse_args(doc: str) -> argparse.Namespace:
    ap = job_parser(doc, None)
    ap.add_argument("--method", required=True, help=f"one of: {', '.join(method_names())}")
    ap.add_argument("--no-base", action="store_true", help="skip measuring the untouched base model")
    return ap.parse_args()


def main(doc: str) -> int:
    args = parse_args(doc)
    recipe = get_method(args.method)
    path = Path(args.config or resolve_config_path(args.preset, args.method))
    overrides = [*args.overrides, *location_overrides(args)]
    data = {
        **apply_overrides(read_yaml(path), overrides),
        "method": args.method,
    }  # one file serves simcse / sifter
    cfg = validate(recipe.config_cls, data, f"{path}{' (+ overrides)' if overrides else ''}")
    if args.print_config:
        return print_config(cfg)
    name = storage.safe_name(
        args.name or cfg.run.name or f"{args.method}-{time.strftime('%Y%m%d-%H%M%S')}", "--name"
    )
    exp_id = preflight(cfg)  # tracking server, storage, model source: fail before any Ray work
    claim(cfg.run.storage, name, job="jobs/train.py", take_over=args.take_over)  # one run per name at a time
    taken = next(  # Ray Train would resume it: the engine's experiment, or a run made before the engine
        (
            p
            for p in (sweep_dir(cfg.run.storage, name), storage.join(cfg.run.storage, "train", name))
            if storage.exists(p)
        ),
        None,
    )
    if taken:
        raise ConfigError(
            f"--name {name!r}: a run of that name exists at {taken}; its checkpoints would be "
            f"resumed under this config - pass another --name"
        )
    cfg = settled(cfg)
    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    params = {**cfg.model_dump(mode="json"), "config_hash": config_hash(cfg)}
    # the run exists from the start: rank 0 logs loss, learning rate, throughput and every dev evaluation
    # into it while training; what an outage keeps from it is logged from the record at the end
    run_id = live_runs.create_run(exp_id, name, {"sieve.method": args.method}, params, uri)

    try:  # from here on a stop ends the run FAILED with its reason (nothing stays RUNNING)
        return _train(args, recipe, cfg, path, overrides, name, params, run_id, uri)
    except BaseException as exc:
        live_runs.close_failed(run_id, uri, exc)
        raise


def _train(
    args, recipe, cfg, path: Path, overrides: list[str], name: str, params: dict, run_id: str, uri: str
) -> int:
    """Data, the base model beside training, one arm × one seed through the engine, export and test, the run's
    record logged (or kept for `jobs/sync_tracking.py` through an outage), the results printed."""
    init_ray(quiet=not args.verbose, needs=[cfg])
    t0 = time.time()
    shards = recipe.prepare_data(cfg, progress=not args.no_progress)
    # the untouched model (the config's pooling and the folder's own): on the cores training leaves idle while
    # it trains, else before it
    spare = 0 if args.no_base else idle_cores(cfg)
    beside = Beside(lambda: measure_bases(recipe, cfg), threads=spare) if spare else None
    if beside is not None:
        print(
            f"base model: measured while the model trains, on the {spare} core{'s' * (spare > 1)} training leaves "
            "idle",
            flush=True,
        )
    bases = [] if args.no_base or beside is not None else measure_bases(recipe, cfg)
    # one arm × one seed through the engine every job runs on (a comparison is arms × seeds, a sweep explores)
    best, history = run_one(recipe, cfg, shards, name=name, mlflow_run=(run_id, uri), verbose=args.verbose)
    outcome = Outcome(checkpoint_at(best["checkpoint_path"]), best, history)
    if beside is not None:
        bases = beside.result()
    base = max(bases, key=lambda b: b.dev) if bases else None
    model_dir, test = export_and_test(recipe, cfg, outcome, export_dir(cfg, name))  # in the run's storage
    best_dev = outcome.best_metrics.get(recipe.metric, float("nan"))
    scored = base is not None and math.isfinite(
        best_dev
    )  # a method without a dev set (TSDAE's protocol): no dev line
    choice = pub.Choice(
        {"trial": name}, best_dev, base.dev if scored else None, base.label if base else "", 0.0
    )
    card = pub.model_card(
        recipe=recipe,
        cfg=cfg,
        origin=f"train run `{name}` ({path.name})",
        test=test,
        base=base,
        params={"config": str(path), "overrides": overrides},
        choice=choice,
        registered_name=name,
        steps=(steps := pub.trained_steps(outcome.history)),
    )
    write_model_card(model_dir, card)  # Sieve's card, not sentence-transformers' empty one
    model_ref = str(model_dir)
    if storage.is_s3(cfg.run.storage):
        model_ref = storage.join(cfg.run.storage, "models", name)
        storage.put_dir(model_dir, model_ref)
    wall_s = time.time() - t0

    # the end of the run is logged from one record; if the tracking server went away meanwhile, the record
    # waits in <run storage>/tracking-pending/ for `jobs/sync_tracking.py` (nothing is lost)
    base_metrics = (
        {"base_dev": base.dev, **{f"base_test_{k}": v for k, v in base.test.metrics.items()}} if base else {}
    )
    texts = {"test.md": f"# {test.title}\n\n{test.table}\n", "model_card.md": card}
    if base is not None:
        texts["against_base.md"] = f"# Against {base.label}\n\n{compare_table(base.test, test)}\n"
    record = outbox.run_record(
        experiment=cfg.tracking.experiment,
        run_name=name,
        method=args.method,
        run_id=run_id,
        params={**params, "shards": shards},
        history=outcome.history,
        metrics={
            **{f"test_{k}": v for k, v in test.metrics.items()},
            "wall_s": wall_s,
            **({"steps_trained": steps} if steps is not None else {}),
            f"best_{recipe.metric}": best_dev,
            **base_metrics,
        },
        texts=texts,
        model_dir=model_ref,
        model_format=recipe.model_format,
    )
    run_id = outbox.log_or_defer(
        record, cfg.tracking.tracking_uri, outbox.pending_dir(cfg.run.storage), log_model
    )
    shutdown_ray()
    print(test.table)
    if base is not None:
        print(
            f"\nthis run − base ({base.label}), ×100:\n"
            + compare_table(base.test, test, candidate_name="trained")
        )
    print(json.dumps(summary(run_id, model_dir, wall_s, best_dev, base, test), indent=2))
    if cfg.train.max_steps and steps is not None and steps < cfg.train.max_steps:
        print(
            f"training: {pub.training_length(cfg, steps)} - raise train.epochs to repeat the data", flush=True
        )
    # the last line: what a train run leaves, and where registration happens
    print(
        f"registered: nothing - a train run exports ({model_dir}) and logs; a model is registered by "
        "jobs/compare.py or a sweep, when it beats its base",
        flush=True,
    )
    return 0


def summary(run_id, model_dir, wall_s: float, best_dev: float, base, test) -> dict:
    """The JSON a run ends with: the dev score beside the base's (null, with the reason, for a method that trains
    without a dev set - TSDAE's protocol - instead of NaN, which is not JSON), and the test headline beside
    the base's test headline: every method's comparison with its base in the last lines."""

    def finite(x):
        return x if x is not None and math.isfinite(x) else None

    out = {
        "run_id": run_id or "pending (tracking server unreachable)",
        "model_dir": str(model_dir),
        "wall_s": round(wall_s, 1),
        "best_dev": finite(best_dev),
        "base_dev": finite(base.dev) if base else None,
    }
    if out["best_dev"] is None:
        out["dev"] = (
            "none: this config trains without a dev set (eval.dev empty: fixed steps, the last checkpoint)"
        )
    out[f"test_{test.headline}"] = test.headline_value
    if base is not None and test.headline in base.test.metrics:
        out[f"base_test_{test.headline}"] = base.test.metrics[test.headline]
    return out
