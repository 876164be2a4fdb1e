"""The experiment engine every job runs on: a plan's trials as one Ray Tune experiment, each trial one Ray Train
run (:func:`train_trial`) recorded in the experiment's storage.

A comparison is arms × seeds (a grid of trials, :mod:`~orchestrator.drivers.compare`); a sweep's explore stage
draws its trials from a search space (:mod:`~orchestrator.drivers.sweep`), and its confirm stage is a comparison
(:mod:`~orchestrator.drivers.confirm`). All of them go through :func:`launch`, with one resume rule (a killed
driver's experiment is restored from its storage; a trial that finished training is never trained again, its
recorded reports are replayed), one naming of trials (their setting, readable in logs, reports and MLflow),
one progress line per evaluation, one test stage (:func:`test_trial`: inside the trial, after training, kept in
the storage and never measured twice) and one way of reading a trial back (:func:`trial_row`).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import mlflow
import ray
import ray.tune
import torch
from mlflow import MlflowClient
from ray import tune
from ray.tune.search import BasicVariantGenerator

from orchestrator import storage, tracking
from orchestrator.claims import claim
from orchestrator.config import MethodConfig, validate
from orchestrator.drivers.recording import RecordingTuneReportCallback, uri_on
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import (
    Outcome,
    build_trainer,
    checkpoint_at,
    export_and_test,
    fit,
    worker_cores,
)
from orchestrator.errors import ConfigError, TrialsFailed, sieve_cause
from orchestrator.evaluation.suite import TestReport
from orchestrator.live_runs import close_failed, create_child_run
from orchestrator.results.publish import flat_params, params_label


def launch(
    trainable,
    space: dict,
    *,
    name: str,
    storage_root: str,
    resume: bool,
    concurrent: int,
    progress: tuple[str, str],
    verbose: bool = False,
    search_alg=None,
    scheduler=None,
    metric: str | None = None,
    num_samples: int = 1,
    callbacks: tuple = (),
):
    """Run (or, ``resume``, run again - the finished trials replayed) the Tune experiment ``name``: ``trainable(tune_config)`` once per
    point of ``space`` (``{"params": space}`` reaches the trial), at most ``concurrent`` at once, each holding
    1 CPU for its driver (its workers ask for their own). Returns the ``ResultGrid``. ``progress``: the
    (metric, label) of the one line printed per evaluation (``verbose``: Tune's own status table instead)."""
    root, path = sweeps_root(storage_root), sweep_dir(storage_root, name)
    trainable = tune.with_resources(trainable, {"CPU": 1})
    # A resume never reads Tune's saved state: ``tuner.pkl``, the experiment snapshots and the searcher's state
    # are pickles (Tune's restore runs whatever they hold), and the storage is writable by whoever can write the
    # run's prefix. The plan runs again as a new experiment instead, its trials drawn again in the same order
    # (a grid, or the seeded sampler) and so named as before: a finished one replays its kept records
    # (train_trial, test_trial: JSON, never trained or tested twice), one cut short trains from its last
    # checkpoint (Ray Train's storage: tensors loaded weights-only), one never started starts.
    # the one line every job prints as its trials start: train, compare, a sweep's explore and confirm stages
    how = "resumed (finished trials replay their records)" if resume else "started"
    print(f"engine: experiment {name!r} {how} at {path}", flush=True)
    tuner = tune.Tuner(
        trainable,
        param_space={"params": space},
        tune_config=tune.TuneConfig(
            metric=metric,
            mode="max" if metric else None,
            scheduler=scheduler,
            num_samples=num_samples,
            search_alg=search_alg or BasicVariantGenerator(max_concurrent=concurrent),
            trial_name_creator=trial_name,  # the setting, readable in logs, reports and MLflow
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=root,
            verbose=1 if verbose else 0,
            callbacks=[*callbacks, *([] if verbose else [ProgressLines(*progress)])],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    return tuner.fit()


def run_one(
    recipe,
    cfg: MethodConfig,
    shards: str,
    *,
    name: str,
    mlflow_run: tuple[str, str] | None = None,
    verbose: bool = False,
) -> tuple[dict, list[dict]]:
    """A train run: one arm × one seed, through :func:`launch` like every other plan; its selected report (the
    best by the recipe's selection metric, or the last) and every report, read back from the storage."""
    where = sweep_dir(cfg.run.storage, name)
    params = {"arm": name, "seed": cfg.train.seed}
    trainable = tune.with_parameters(
        one_trial,
        method=recipe.name,
        cfg=cfg,
        shards=shards,
        sweep_dir=where,
        tracking={"run_id": mlflow_run[0], "uri": mlflow_run[1]} if mlflow_run else None,
    )
    (result,) = launch(
        trainable,
        params,
        name=name,
        storage_root=cfg.run.storage,
        resume=False,
        concurrent=1,
        progress=(recipe.metric, recipe.metric_label),
        verbose=verbose,
    )
    if result.error is not None:  # a worker's own one-line error (a diverged loss), else Ray's
        raise sieve_cause(result.error) or result.error
    row = selected_row(recipe, cfg, name_of(result.metrics["trial_id"], params), params, where)
    if row["best"] is None:
        raise ConfigError(f"train run {name!r}: training reported no checkpoint")
    return {**row["best"], "checkpoint_path": row["checkpoint_path"]}, row["history"]


def one_trial(
    tune_config: dict, *, method: str, cfg: MethodConfig, shards: str, sweep_dir: str, tracking=None
):
    """The trainable of :func:`run_one`: ``cfg`` as it is (its seed, its config)."""
    train_trial(
        get_method(method), cfg, tune_config["params"], shards=shards, sweep_dir=sweep_dir, tracking=tracking
    )


# ---------------------------------------------------------------- a trial
def reports_uri(sweep_dir: str, trial: str) -> str:
    """Where a trial's every report (metrics + checkpoint path) is kept (:class:`RecordingTuneReportCallback`)."""
    return storage.join(sweep_dir, "reports", f"{trial}.json")


def train_trial(
    recipe, cfg: MethodConfig, params: dict, *, shards: str, sweep_dir: str, tracking: dict | None = None
) -> None:
    """Inside a Tune trial: train ``cfg`` once (or replay a finished trial's reports), every evaluation
    recorded in the sweep's storage; shared by the sweeps and ``jobs/compare.py``."""
    trial = ray.tune.get_context().get_trial_name()
    reports, done = reports_uri(sweep_dir, trial), storage.join(sweep_dir, "done", trial)
    if storage.exists(done):
        storage.write_bytes(storage.join(sweep_dir, "replays", f"{trial}-{time.time_ns()}"), b"")  # audit
        for record in json.loads(storage.read_bytes(reports)):
            ray.tune.report(record)
        return
    # an audit line per training start: proves on resume that finished trials were not re-run
    log = storage.join(sweep_dir, "invocations", f"{trial}-{time.time_ns()}.json")
    # its process named too: which one trained it, and which one a test can stop
    record = {"trial": trial, "params": params, "host": socket.gethostname(), "pid": os.getpid()}
    storage.write_bytes(log, json.dumps(record).encode())
    # a train job's own run (made before Ray), else the trial's run nested under its job's
    run_id = (tracking.get("run_id") or _child_run(tracking, trial, params, cfg)) if tracking else None
    trainer = build_trainer(
        recipe,
        cfg,
        shards,
        name=trial,
        callbacks=[RecordingTuneReportCallback(reports)],
        storage_path=storage.join(sweep_dir, "train"),
        mlflow_run=(run_id, tracking["uri"]) if run_id else None,
    )
    fit(trainer, recipe, cfg)
    storage.write_bytes(done, b"")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(error) -> str:
    """A trial's error in one readable line: the exception the worker raised (the traceback's last
    ``Name: message`` line), not Ray's wrapper (``ray::ImplicitFunc.train() (pid=...)``), without colour codes."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(error)).splitlines() if ln.strip()]
    raised = [
        ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failed)\b.*?:", ln)
    ]
    return (raised[-1] if raised else lines[0] if lines else type(error).__name__)[:300]


def require_finished(lost: list[dict], total: int, what: str, rerun: str) -> None:
    """A job whose trials did not all end with a result stops here, non-zero, in one line naming them and the
    command that trains only those (a finished trial is replayed, never trained again)."""
    if not lost:
        return
    named = "; ".join(f"{r['trial']}: {(r.get('error') or 'ended without a result')[:160]}" for r in lost[:3])
    more = f"; and {len(lost) - 3} more" if len(lost) > 3 else ""
    raise TrialsFailed(
        f"{what}: {len(lost)} of {total} trial(s) did not finish ({named}{more}); the others are kept - "
        f"rerun with: {rerun}   (it trains the missing trial(s) only)"
    )


def tests_uri(sweep_dir: str, trial: str) -> str:
    """Where a trial's test is kept (:func:`test_trial`)."""
    return storage.join(sweep_dir, "tests", f"{trial}.json")


def selected_row(recipe, cfg: MethodConfig, trial: str, params: dict, sweep_dir: str) -> dict:
    """The trial's row from its recorded reports, its checkpoint selected by the recipe's selection metric; a
    config without a dev score keeps its last checkpoint (a paper's fixed-steps protocol)."""
    records = json.loads(storage.read_bytes(reports_uri(sweep_dir, trial)))
    has_dev = recipe.has_dev(cfg)
    return trial_row(
        trial,
        params,
        records,
        recipe.metric if has_dev else "step",
        recipe.selection_metric(cfg) if has_dev else None,
    )


def test_trial(
    recipe, cfg: MethodConfig, params: dict, *, sweep_dir: str, keep: Path | None = None
) -> TestReport | None:
    """Inside a Tune trial, after :func:`train_trial`: the selected checkpoint exported (to ``keep``, else a
    temporary folder) and tested on the cores the trial's workers held, the report kept in the storage - a
    resumed trial whose test is kept is not tested again (None)."""
    trial = ray.tune.get_context().get_trial_name()
    if storage.exists(uri := tests_uri(sweep_dir, trial)):
        return None
    row = selected_row(recipe, cfg, trial, params, sweep_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        max(threads, min(os.cpu_count() or 1, worker_cores(cfg) + 1))
    )  # the workers are gone
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outcome = Outcome(checkpoint_at(row["checkpoint_path"]), row["best"], row["history"])
            _, report = export_and_test(recipe, cfg, outcome, keep or Path(tmp) / "model")
    finally:
        torch.set_num_threads(threads)
    storage.write_bytes(
        uri, json.dumps({"checkpoint_path": row["checkpoint_path"], **asdict(report)}).encode()
    )
    return report


def kept_test(sweep_dir: str, trial: str) -> tuple[str, TestReport] | None:
    """(checkpoint path, report) of a trial's kept test, None when it has none."""
    if not storage.exists(uri := tests_uri(sweep_dir, trial)):
        return None
    kept = json.loads(storage.read_bytes(uri))
    return kept.pop("checkpoint_path"), TestReport(**kept)


@contextmanager
def parent_run(experiment_id: str, name: str, role: str, resume: bool, tags: dict, params: dict):
    """The job's MLflow parent run (its trials' runs nest under it): found again by name and role when the
    job resumes, else started with its tags and params."""
    found = tracking.find_run(experiment_id, {"sieve.sweep": name, "sieve.role": role}) if resume else None
    with mlflow.start_run(
        run_id=found.info.run_id if found else None,
        experiment_id=experiment_id,
        run_name=None if found else name,
    ) as run:
        if found is None:
            mlflow.set_tags({"sieve.sweep": name, "sieve.role": role, **tags})
            tracking.log_params(params)
        try:
            yield run
        except BaseException as exc:  # ends FAILED (KILLED on Ctrl-C) with its reason: nothing stays RUNNING
            close_failed(run.info.run_id, mlflow.get_tracking_uri(), exc)
            raise


def live_tracking(
    tracking_uri: str | None, experiment_id: str, parent_id: str | None, name: str
) -> dict | None:
    """Where a plan's trials log while they train: each its own MLflow run, nested under the job's parent run
    (None without one: the trials are logged at the end)."""
    if not parent_id:
        return None
    return {
        "uri": tracking.resolve_tracking_uri(tracking_uri),
        "experiment_id": experiment_id,
        "parent_run_id": parent_id,
        "sweep": name,
    }


def _child_run(tracking: dict, trial: str, params: dict, cfg: MethodConfig) -> str | None:
    """The trial's MLflow run, nested under the sweep's, made when the trial starts (the same run again
    when a resumed trial starts over); None when the server cannot be reached - the driver logs the
    trial at the end instead."""
    tags = {"sieve.sweep": tracking["sweep"], "sieve.trial": trial, "sieve.role": "trial"}
    try:
        client = MlflowClient(tracking_uri=tracking["uri"])
        flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        found = client.search_runs([tracking["experiment_id"]], filter_string=flt, max_results=1)
        if found:
            return found[0].info.run_id
        return create_child_run(
            tracking["experiment_id"],
            tracking["parent_run_id"],
            trial,
            tags,
            {"sweep": flat_params(params), "config": cfg.model_dump(mode="json")},
            tracking["uri"],
        )
    except Exception as exc:  # noqa: BLE001 - tracking must not stop training
        print(f"warning: trial {trial}: no live MLflow run ({str(exc).splitlines()[0][:160]})", flush=True)
        return None


def sweeps_root(storage_root: str) -> str:
    """The folder of every sweep: Tune's ``storage_path``."""
    return storage.join(storage.absolute(storage_root), "sweeps")


def sweep_dir(storage_root: str, name: str) -> str:
    """Where sweep ``name`` keeps its Tune state, trials and reports."""
    return storage.join(sweeps_root(storage_root), name)


def take_name(args, storage_root: str, job: str, what: str, *, reads: bool = False) -> str:
    """The run's name (``--name``, else ``<job>-<time>``), claimed - one run per name at a time; a ``reads``
    command (``--status``) claims nothing - and checked against the storage before any work: a new run may not
    reuse a name, ``--resume`` / ``--status`` of a name never run is refused, not answered with a new run."""
    name = storage.safe_name(args.name or f"{job}-{time.strftime('%Y%m%d-%H%M%S')}", "--name")
    if not reads:
        claim(storage_root, name, job=f"jobs/{job}.py", take_over=args.take_over)
    if args.resume or reads:
        require_existing(storage_root, name, what)
    else:
        refuse_existing(storage_root, name)
    return name


def require_existing(storage_root: str, name: str, what: str) -> None:
    """``--resume`` / ``--status`` name a run that exists: a name never run is refused before any work."""
    if not storage.exists(path := sweep_dir(storage_root, name)):
        raise ConfigError(
            f"no {what} {name!r} at {path}: nothing to continue or read (check --name and --storage)"
        )


def refuse_existing(storage_root: str, name: str) -> None:
    """A new sweep may not reuse a name (its state would be mixed with the old one's)."""
    if storage.exists(path := sweep_dir(storage_root, name)):
        raise ConfigError(f"sweep {name!r} already exists at {path}: pass --resume, or another --name")


def plan_uri(where: str) -> str:
    """Where a run keeps the plan it started with (its job file, every config inline and settled): what its
    ``--resume`` and ``--status`` read."""
    return storage.join(where, "plan.json")


def kept_plan(uri: str, model: type, what: str, given: bool):
    """The plan ``what`` kept when it started, validated as ``model``; None for a run made before runs kept their
    plan - read then from the file the user names (``given``; without one, refused: the preset's plan may not be
    the run's)."""
    if not storage.exists(uri):
        if given:
            return None
        raise ConfigError(
            f"{what} kept no plan ({uri} is missing: another job's name, or a run made before plans were kept): "
            "pass the --config it was started with"
        )
    try:
        data = json.loads(storage.read_bytes(uri))
    except ValueError as exc:
        raise ConfigError(f"{uri}: not JSON ({exc})") from None
    return validate(model, data, uri)


def keep_plan(uri: str, plan) -> None:
    """What ``--resume`` and ``--status`` read: the plan (a typed job file, every config inline and settled)."""
    storage.write_bytes(uri, json.dumps(plan.model_dump(mode="json")).encode())


def refuse_another_plan(kept, now, what: str, uri: str) -> None:
    """A ``--resume`` handed a plan other than the one ``what`` kept is refused, naming the first difference."""
    if diff := first_difference(kept.model_dump(mode="json"), now.model_dump(mode="json")):
        raise ConfigError(
            f"--resume: {what} was started with another plan ({diff}; kept at {uri}): resume it without "
            "--config/--preset/overrides, or start a new --name"
        )


def first_difference(a, b, path: str = "") -> str | None:
    """The first key where ``a`` and ``b`` differ, as ``key: a vs b`` (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            if (d := first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))) is not None:
                return d
        return None
    return None if a == b else f"{path or 'the plan'}: {a!r} vs {b!r}"


# ---------------------------------------------------------------- naming and progress
def trial_name(trial) -> str:
    """``t3-lambdaxy1-lambdaxz1-train.lr3e-05``: the trial's index and its setting, the config keys without their
    ``_`` (ASCII, short; Tune marks a folder's copy with ``_xxxx``, so a name has none)."""
    return name_of(trial.trial_id, trial.config.get("params", {}))


def name_of(trial_id: str, params: dict) -> str:
    """:func:`trial_name` from a trial's id and sampled point (what a finished trial's result still has).
    A trial's *folder* can be named otherwise: Tune adds ``_xxxx`` to a folder that already exists, as
    when a sweep resumes from a snapshot taken before the trial's folder was made."""
    label = params_label(params).replace("=", "").replace(", ", "-")
    index = trial_id.rsplit("_", 1)[-1].lstrip("0") or "0"
    return f"t{index}-{re.sub(r'[^A-Za-z0-9.+-]', '', label)[:60]}"


class ProgressLines(tune.Callback):
    """One line per evaluation and per finished trial (instead of Tune's periodic status table)."""

    def __init__(self, metric: str, label: str):
        self.metric, self.label, self.best, self.done = metric, label, {}, 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get(
            "collapse_guard"
        ):  # the trial stopped itself (train.collapse_guard): said once, in its words
            print(f"[{trial}] {result['collapse_guard']}", flush=True)
        value = result.get(self.metric)
        if value is None:
            return
        self.best[trial.trial_id] = max(self.best.get(trial.trial_id, -math.inf), value)
        print(
            f"[{trial}] step {result.get('step')}: {self.label} {value * 100:.2f} "
            f"(best {self.best[trial.trial_id] * 100:.2f}), loss {result.get('loss', float('nan')):.4g}",
            flush=True,
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done += 1
        print(f"[{trial}] finished ({self.done} trial(s) done)", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"[{trial}] failed: {str(trial.error_file or '')}", flush=True)


# ---------------------------------------------------------------- summarising trials
def trial_rows(result_grid, metric: str, select: str | None = "") -> list[dict]:
    """One row per trial (:func:`trial_row`), best dev first."""
    rows = []
    for r in result_grid:
        df = r.metrics_dataframe
        history = json.loads(df.to_json(orient="records")) if df is not None and len(df) else []
        params, trial_id = r.config.get("params", {}), (r.metrics or {}).get("trial_id")
        # named as the trial function named it (its reports, MLflow run, early test), not by its folder
        name = name_of(trial_id, params) if trial_id else (Path(r.path).name if r.path else "?")
        rows.append(
            trial_row(
                name,
                params,
                history,
                metric,
                select,
                filesystem=r.filesystem,
                error=error_line(r.error) if r.error else None,
            )
        )
    most = max((len(x["history"]) for x in rows), default=0)
    for x in rows:
        x["stopped_early"] = 0 < len(x["history"]) < most
    rows.sort(key=lambda x: -x["best_dev"] if x["best_dev"] == x["best_dev"] else math.inf)
    return rows


def trial_row(
    trial: str,
    params: dict,
    history: list[dict],
    metric: str,
    select: str | None = "",
    *,
    filesystem=None,
    error: str | None = None,
) -> dict:
    """A trial's row: params, every evaluation, the selected one (by ``select``, default ``metric``; None:
    the last) with its checkpoint path, and its ``metric`` as ``best_dev``. ``history``: the trial's reports
    (Tune's, or the ones :class:`RecordingTuneReportCallback` kept)."""
    select = metric if select == "" else select
    evals = [h for h in history if h.get(metric) is not None and h[metric] == h[metric]]  # drop NaN
    # a trial restored after a driver crash may report a step again (Ray Train resuming from its
    # checkpoint, or trial_fn replaying a finished trial): the latest report of a step stands
    evals = sorted(
        {h.get("step", i): h for i, h in enumerate(evals)}.values(), key=lambda h: h.get("step", 0)
    )
    best = (max(evals, key=lambda h: h.get(select, -math.inf)) if select else evals[-1]) if evals else None
    return {
        "trial": trial,
        "params": params,
        "history": evals,
        "best": best,
        "best_dev": best[metric] if best else float("nan"),
        # Tune records the path on the sweep's storage (the run's storage is below it): as a URI
        "checkpoint_path": uri_on(filesystem, best["checkpoint_path"])
        if best and best.get("checkpoint_path")
        else None,
        "error": error,
    }
