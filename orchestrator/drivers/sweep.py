"""Ray Tune sweeps over any method, shared by every ``jobs/*_sweep.py``.

One trial = one ``TorchTrainer`` (Ray Train V2) built by :mod:`orchestrator.drivers.train` inside a Tune
function trainable; ``TuneReportCallback`` forwards every evaluation (and its checkpoint path)
to Tune, so ASHA can stop weak trials early on the method's dev metric.

The search space comes from YAML::

    sweep:
      num_samples: 1
      space:
        train.lr: {loguniform: [1.0e-5, 5.0e-5]}
        dropout: {uniform: [0.1, 0.2]}
        temperature: {choice: [0.05, 0.1]}
        lambdas:                           # a bundle: several keys set together
          grid:
            - {lambda_xx: 0, lambda_xy: 1, lambda_xz: 1, lambda_yz: 1}
            - {lambda_xx: 1, lambda_xy: 0, lambda_xz: 0, lambda_yz: 0}

Every key is checked against the method's config before anything starts, and every grid point's config is
validated there once: a trial gets its point's typed config (a value a sampler drew is applied to the typed base
config by path, :func:`orchestrator.config.with_params`, and validated when its trial starts); the configs and
the other constants reach the trials through ``tune.with_parameters``, and the Ray Train workers receive the
config object itself.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import ray
import ray.tune
from mlflow import MlflowClient
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

from orchestrator import storage
from orchestrator.config import MethodConfig
from orchestrator.drivers.cluster import concurrent_trials
from orchestrator.drivers.publish import flat_params
from orchestrator.drivers.recording import RecordingTuneReportCallback, uri_on
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.report import params_label
from orchestrator.drivers.sweep_space import SweepJobConfig, config_of, total_trials
from orchestrator.drivers.train import build_trainer, fit, materializes
from orchestrator.errors import ConfigError
from orchestrator.live_runs import create_child_run


# ---------------------------------------------------------------- the trainable
def reports_uri(sweep_dir: str, trial: str) -> str:
    """Where a trial's every report (metrics + checkpoint path) is kept (:class:`RecordingTuneReportCallback`)."""
    return storage.join(sweep_dir, "reports", f"{trial}.json")


def trial_fn(
    tune_config: dict,
    *,
    method: str,
    base: MethodConfig,
    shards: str,
    sweep_dir: str,
    tracking: dict | None = None,
    configs: dict[str, MethodConfig] | None = None,
) -> None:
    """One Tune trial: the point's config (validated in the driver for a grid point, here for a sampled one)
    trained with Ray Train, reported through Tune.

    A trial that already finished is never trained again. Tune snapshots its experiment state
    only every few seconds, so a driver killed just after a trial ended restores that trial as
    unfinished and calls this again (seen in the kill/resume test); the ``done`` marker written
    after training makes that call replay the recorded reports to Tune instead.
    """
    params = tune_config["params"]
    train_trial(
        get_method(method),
        config_of(base, configs or {}, params, "sweep trial"),
        params,
        shards=shards,
        sweep_dir=sweep_dir,
        tracking=tracking,
    )


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
    storage.write_bytes(log, json.dumps({"trial": trial, "params": params}).encode())
    run_id = _child_run(tracking, trial, params, cfg) if tracking else None
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


def refuse_existing(storage_root: str, name: str) -> None:
    """A new sweep may not reuse a name (its state would be mixed with the old one's)."""
    if storage.exists(path := sweep_dir(storage_root, name)):
        raise ConfigError(f"sweep {name!r} already exists at {path}: pass --resume, or another --name")


def run_sweep(
    job: SweepJobConfig,
    base: MethodConfig,
    shards: str,
    *,
    name: str,
    storage_root: str,
    resume: bool,
    verbose: bool = False,
    tracking: dict | None = None,
    listener=None,
    configs: dict[str, MethodConfig] | None = None,
):
    """Run (or resume) the Tune experiment; returns the ``ResultGrid``. Quiet by default: one line per
    evaluation; ``verbose`` gives Tune's own status table. ``listener``: told of each trial as it ends
    (:class:`FinishedTrials`), while the others train."""
    recipe = get_method(job.method)
    root, path = sweeps_root(storage_root), sweep_dir(storage_root, name)
    trainable = tune.with_resources(
        tune.with_parameters(
            trial_fn,
            method=job.method,
            base=base,
            shards=shards,
            sweep_dir=path,
            tracking=tracking,
            configs=configs or {},
        ),
        {"CPU": 1},
    )
    concurrent = concurrent_trials(
        base, job.sweep.max_concurrent_trials, streams=not materializes(base, shards)
    )
    if listener is not None:
        listener.configure(total=total_trials(job), concurrent=concurrent, sweep_dir=path)
        _LISTENERS[name] = listener
    try:
        if resume:
            if not tune.Tuner.can_restore(path):
                raise ConfigError(f"--resume: no sweep to resume at {path}")
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
            return tuner.fit()
        refuse_existing(storage_root, name)
        max_evals = max(1, math.ceil((base.train.max_steps or 10**6) / base.train.eval_steps))
        return _new_tuner(job, recipe, trainable, name, root, concurrent, max_evals, verbose).fit()
    finally:
        _LISTENERS.pop(name, None)


def _new_tuner(
    job: SweepJobConfig,
    recipe,
    trainable,
    name: str,
    root: str,
    concurrent: int,
    max_evals: int,
    verbose: bool,
) -> tune.Tuner:
    sc = job.sweep.scheduler
    scheduler = (
        ASHAScheduler(
            time_attr="training_iteration",
            max_t=max_evals,
            grace_period=sc.grace_period,
            reduction_factor=sc.reduction_factor,
        )
        if sc.type == "asha"
        else FIFOScheduler()
    )
    search, space = make_search(job, recipe.metric, concurrent)
    return tune.Tuner(
        trainable,
        param_space={"params": space},
        tune_config=tune.TuneConfig(
            metric=recipe.metric,
            mode="max",
            scheduler=scheduler,
            num_samples=job.sweep.num_samples,
            search_alg=search,
            trial_name_creator=trial_name,  # the setting, readable in logs, reports and MLflow
            trial_dirname_creator=trial_name,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=root,
            verbose=1 if verbose else 0,
            callbacks=[
                FinishedTrials(name),
                *([] if verbose else [ProgressLines(recipe.metric, recipe.metric_label)]),
            ],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


# the listener of each running sweep, by name: Tune pickles its callbacks into the sweep's state (and a
# resumed sweep unpickles them), so the callback names its sweep and finds the driver's listener here
_LISTENERS: dict[str, Any] = {}


class FinishedTrials(tune.Callback):
    """Tells the sweep's listener (:func:`run_sweep`) of each trial that ends - ``finished(trial, params,
    ok)`` - and gives it a turn at every step of Tune's loop (``poll()``)."""

    def __init__(self, sweep: str):
        self.sweep = sweep

    def on_step_begin(self, iteration, trials, **info):
        if (listener := _LISTENERS.get(self.sweep)) is not None:
            listener.poll()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial, ok=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial, ok=False)

    def _ended(self, trial, ok: bool) -> None:
        if (listener := _LISTENERS.get(self.sweep)) is not None:
            listener.finished(trial_name(trial), trial.config.get("params", {}), ok=ok)


def make_search(job: SweepJobConfig, metric: str, max_concurrent: int):
    """(search algorithm, Tune space): every grid point × random draws, or Optuna's TPE with a seed. The
    concurrency limit lives in the searcher: TuneConfig.max_concurrent_trials is ignored when one is
    passed, and 4 trial drivers on 4 CPUs would starve their workers."""
    if job.sweep.search == "variants":
        space = {k: d.to_tune() for k, d in job.sweep.space.items()}
        return BasicVariantGenerator(random_state=job.sweep.seed, max_concurrent=max_concurrent), space
    from ray.tune.search.optuna import OptunaSearch  # lazy: the optional Bayesian search (needs optuna)

    space = {}
    for key, dim in job.sweep.space.items():
        values = dim.grid or dim.choice
        if values is not None and not all(isinstance(v, str | int | float | bool) for v in values):
            raise ConfigError(
                f"sweep.space.{key}: optuna suggests single values, not bundles; use search: variants "
                "or one key per dimension"
            )
        space[key] = tune.choice(values) if values is not None else dim.to_tune()
    return ConcurrencyLimiter(
        OptunaSearch(metric=metric, mode="max", seed=job.sweep.seed), max_concurrent=max_concurrent
    ), space


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
                error=str(r.error).splitlines()[0][:300] if r.error else None,
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
