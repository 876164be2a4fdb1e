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

import math
from pathlib import Path

import ray.tune
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

from orchestrator.config import MethodConfig
from orchestrator.drivers.cluster import concurrent_trials
from orchestrator.drivers.engine import (
    launch,
    sweep_dir,
    test_trial,
    train_trial,
)
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import materializes
from orchestrator.errors import ConfigError
from orchestrator.job_files import Dimension, SweepJobConfig, config_of


def trial_fn(
    tune_config: dict,
    *,
    method: str,
    base: MethodConfig,
    shards: str,
    sweep_dir: str,
    tracking: dict | None = None,
    configs: dict[str, MethodConfig] | None = None,
    test: bool = False,
    keep: str | None = None,
) -> None:
    """One Tune trial: the point's config (validated in the driver for a grid point, here for a sampled one)
    trained with Ray Train, reported through Tune; with ``test`` (a sweep that tests every trial) then
    exported (to ``keep/<trial>`` when given) and tested, in the trial - the engine's one test stage.

    A trial that already finished is never trained again. Tune snapshots its experiment state
    only every few seconds, so a driver killed just after a trial ended restores that trial as
    unfinished and calls this again (seen in the kill/resume test); the ``done`` marker written
    after training makes that call replay the recorded reports to Tune instead.
    """
    params, recipe = tune_config["params"], get_method(method)
    cfg = config_of(base, configs or {}, params, "sweep trial")
    train_trial(recipe, cfg, params, shards=shards, sweep_dir=sweep_dir, tracking=tracking)
    if test:
        trial = ray.tune.get_context().get_trial_name()
        test_trial(recipe, cfg, params, sweep_dir=sweep_dir, keep=Path(keep) / trial if keep else None)


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
    configs: dict[str, MethodConfig] | None = None,
    test: bool = False,
    keep: str | None = None,
):
    """Run (or resume) the Tune experiment; returns the ``ResultGrid``. Quiet by default: one line per
    evaluation; ``verbose`` gives Tune's own status table. ``test``: every trial tested in its trial, its
    export kept below ``keep`` (:func:`trial_fn`)."""
    recipe = get_method(job.method)
    path = sweep_dir(storage_root, name)
    trainable = tune.with_parameters(
        trial_fn,
        method=job.method,
        base=base,
        shards=shards,
        sweep_dir=path,
        tracking=tracking,
        configs=configs or {},
        test=test,
        keep=keep,
    )
    concurrent = concurrent_trials(
        base, job.sweep.max_concurrent_trials, streams=not materializes(base, shards)
    )
    sc = job.sweep.scheduler
    max_evals = max(1, math.ceil((base.train.max_steps or 10**6) / base.train.eval_steps))
    search, space = make_search(job, recipe.metric, concurrent)
    return launch(
        trainable,
        space,
        name=name,
        storage_root=storage_root,
        resume=resume,
        concurrent=concurrent,
        progress=(recipe.metric, recipe.metric_label),
        verbose=verbose,
        search_alg=search,
        scheduler=ASHAScheduler(
            time_attr="training_iteration",
            max_t=max_evals,
            grace_period=sc.grace_period,
            reduction_factor=sc.reduction_factor,
        )
        if sc.type == "asha"
        else FIFOScheduler(),
        metric=recipe.metric,
        num_samples=job.sweep.num_samples,
    )


def to_tune(dim: Dimension):
    """A sweep file's dimension as Tune's space entry."""
    if dim.grid is not None:
        return tune.grid_search(dim.grid)
    if dim.choice is not None:
        return tune.choice(dim.choice)
    return tune.uniform(*dim.uniform) if dim.uniform is not None else tune.loguniform(*dim.loguniform)


def make_search(job: SweepJobConfig, metric: str, max_concurrent: int):
    """(search algorithm, Tune space): every grid point × random draws, or Optuna's TPE with a seed. The
    concurrency limit lives in the searcher: TuneConfig.max_concurrent_trials is ignored when one is
    passed, and 4 trial drivers on 4 CPUs would starve their workers."""
    if job.sweep.search == "variants":
        space = {k: to_tune(d) for k, d in job.sweep.space.items()}
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
        space[key] = tune.choice(values) if values is not None else to_tune(dim)
    return ConcurrencyLimiter(
        OptunaSearch(metric=metric, mode="max", seed=job.sweep.seed), max_concurrent=max_concurrent
    ), space
