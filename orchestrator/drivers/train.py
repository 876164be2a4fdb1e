"""Ray Train glue shared by every method: the checks before any Ray work, the TorchTrainer, the best
checkpoint, export and the method's final test report.

    preflight(cfg); cfg = settled(cfg)                 # tracking server, storage, model sources; pooling
    shards = recipe.prepare_data(cfg)                    # the method's data, content-addressed
    trainer = build_trainer(recipe, cfg, shards)         # TorchTrainer (DDP or DeepSpeed on CPU/GPU)
    outcome = fit(trainer, recipe, cfg)                  # best checkpoint by the method's selection metric
    model_dir, report = export_and_test(recipe, cfg, outcome, out_dir)
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
import ray.data
import torch
from ray.exceptions import NodeDiedError, RayActorError
from ray.train import (
    Checkpoint,
    CheckpointConfig,
    ControllerError,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.torch import TorchConfig, TorchTrainer

from orchestrator import storage, tracking
from orchestrator.config import EncoderMethodConfig, MethodConfig, repo_path
from orchestrator.drivers import train_entry
from orchestrator.drivers.cluster import check_resources, fault_hooks, joins_cluster, worker_bundle
from orchestrator.errors import ConfigError, DataError, SieveError
from orchestrator.evaluation.domain import check_domain_tasks
from orchestrator.evaluation.encode import test_time_pooling
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import pooling_for, resolve_model_source, saved_pooling
from orchestrator.spec import BaseResult
from orchestrator.uris import without_credentials
from trainers.recipe import Recipe


# ---------------------------------------------------------------- before any Ray work
def preflight(cfg: MethodConfig) -> str:
    """Fail fast, naming the URI or path: data, tracking server, storage, every model source. Changes
    nothing (:func:`settled` then fixes what the checks found). Returns the MLflow experiment id."""
    for key, path in cfg.data_sources():  # first: nothing is created for a run whose data is not there
        if not storage.exists(repo_path(path)):
            raise DataError(f"{key}: {path}: no such file or folder")
    cfg.check_data()
    if isinstance(cfg, EncoderMethodConfig) and cfg.eval.domain:  # a BEIR folder read through, line by line
        check_domain_tasks(cfg.eval.domain, cfg.eval.domain_paths)
    if not ray.is_initialized() and not joins_cluster():  # the private local Ray's resources are known now
        check_resources([cfg])
    exp_id = tracking.setup(cfg.tracking.tracking_uri, cfg.tracking.experiment)
    storage.check_access(cfg.run.storage)
    for source in cfg.model_sources():
        resolve_model_source(source)
    return exp_id


def settled(cfg: MethodConfig) -> MethodConfig:
    """A copy of ``cfg`` with an encoder's pooling resolved (the config's, else the model folder's own, else the
    method's), so every worker, report and MLflow param sees the one value; and its tracking URI without a
    ``user:password@`` (:func:`preflight` moved it to MLflow's environment), so no worker is handed it. After
    :func:`preflight`: it reads the model folder."""
    uri = cfg.tracking.tracking_uri
    if uri and (clean := without_credentials(uri)[0]) != uri:
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"tracking_uri": clean})})
    if not isinstance(cfg, EncoderMethodConfig) or cfg.model.pooling is not None:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"pooling": pooling_for(cfg)})})


# ---------------------------------------------------------------- the trainer
def materializes(cfg: MethodConfig, shards: str) -> bool:
    """True when :func:`build_trainer` reads the corpus into the object store before the workers start
    (its shard files total at most ``perf.ingest_materialize_mb``): then nothing reads during training."""
    return _fits(
        cfg,
        shard_files(
            *storage.pyarrow_filesystem(storage.join(storage.resolve_build(shards) or shards, "shards"))
        ),
    )


def shard_files(fs, path: str) -> list[pafs.FileInfo]:
    """The files under a shard folder: one listing (an S3 LIST) for the size check and the read."""
    return [
        i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File
    ]


def _fits(cfg: MethodConfig, files: list[pafs.FileInfo]) -> bool:
    return sum(i.size or 0 for i in files) <= cfg.perf.ingest_materialize_mb * 2**20


def read_in_process(
    fs, path: str, columns: list[str] | None, files: list[pafs.FileInfo] | None = None
) -> ray.data.Dataset:
    """The shard files under ``path`` read by this process, in file-name order, and put into Ray's object
    store as one block per file (``ray.data.from_arrow``), instead of ``read_parquet(...).materialize()``,
    whose read tasks cost seconds of every training run on a small machine, more in a fresh process such as a
    sweep's trial (``bench/results/train_startup.md``). A corpus of one shard file (every smoke preset's)
    gives the same block, rows and split between workers as that read did; of several files, file-name
    order (Ray's read planner had chosen its own). The blocks belong to this process and live on its node.
    ``files``: the folder's :func:`shard_files`, when listed already."""
    files = sorted(
        i.path for i in (shard_files(fs, path) if files is None else files) if i.path.endswith(".parquet")
    )
    if not files:
        raise ConfigError(f"{path}: no parquet shard files")
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, filesystem=fs, columns=columns))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{f}: not a readable shard file ({str(exc).splitlines()[0][:200]})") from None
    return ray.data.from_arrow(tables)


def build_trainer(
    recipe: type[Recipe],
    cfg: MethodConfig,
    shards: str,
    *,
    name: str | None = None,
    callbacks=None,
    storage_path: str | None = None,
    mlflow_run: tuple[str, str] | None = None,
) -> TorchTrainer:
    """``mlflow_run``: (run id, tracking URI) that rank 0 logs into while it trains."""
    shards = storage.resolve_build(shards) or shards  # the committed build (a pointer switched last)
    fs, path = storage.pyarrow_filesystem(storage.join(shards, "shards"))
    columns = list(recipe.columns) if recipe.columns else None
    files = shard_files(fs, path)
    if _fits(cfg, files):  # materializes(), on the build already resolved and listed here
        # read once, here, into Ray's object store: the workers' first batch then waits for no read task
        # to start (a large share of a short run: bench/results/train_throughput.md), and epochs
        # after the first read nothing again; a larger corpus streams
        ds = read_in_process(fs, path, columns, files)
    else:
        ds = ray.data.read_parquet(path, filesystem=fs)
        if columns:
            ds = ds.select_columns(columns)
    rows = ds.count()
    workers = cfg.scaling.num_workers
    rows_per_worker = rows // workers
    if rows_per_worker < cfg.train.batch_size:
        raise ConfigError(
            f"train.batch_size {cfg.train.batch_size}: each of {workers} workers gets only "
            f"{rows_per_worker} rows from {shards}"
        )
    if cfg.train.max_steps and (steps := cfg.train.planned_steps(rows_per_worker)) < cfg.train.max_steps:
        print(
            f"train.max_steps {cfg.train.max_steps}: {cfg.train.epochs} epoch(s) of {rows} rows give {steps} steps "
            f"(global batch {cfg.train.batch_size * workers}); training runs {steps}, its schedule sized for "
            f"{steps} - raise train.epochs to repeat the data",
            flush=True,
        )
    scaling = ScalingConfig(
        num_workers=workers,
        use_gpu=cfg.scaling.use_gpu,
        resources_per_worker=worker_bundle(cfg.scaling),
        placement_strategy=cfg.scaling.placement_strategy,
    )
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    }  # the ingest's bars would drown Tune's table
    if not cfg.scaling.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    env.update(fault_hooks())
    if mlflow_run is not None:
        env.update(SIEVE_MLFLOW_RUN_ID=mlflow_run[0], SIEVE_MLFLOW_TRACKING_URI=mlflow_run[1])
    select = recipe.selection_metric(cfg)  # None: the last checkpoint (kept: the most recent ones)
    run = RunConfig(
        name=name or cfg.run.name or cfg.method,
        storage_path=storage_path or storage.absolute(storage.join(cfg.run.storage, "train")),
        checkpoint_config=CheckpointConfig(
            num_to_keep=cfg.run.num_to_keep, checkpoint_score_attribute=select, checkpoint_score_order="max"
        ),
        failure_config=FailureConfig(max_failures=cfg.run.max_failures),
        callbacks=callbacks,
        worker_runtime_env={"env_vars": env},
    )
    func, config = train_function(recipe, cfg, rows_per_worker=rows_per_worker, shards=shards)
    return TorchTrainer(
        func,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=run,
        datasets={"train": ds},
        # one worker reads the whole dataset itself: no split coordinator to start
        dataset_config=DataConfig(datasets_to_split=[] if workers == 1 else "all"),
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
    )


def train_function(recipe: type[Recipe], cfg: MethodConfig, **job) -> tuple:
    """What the TorchTrainer runs on every worker, and its config: a function of the standard library (Ray Train's
    controller unpickles both, and imports no recipe, transformers or MLflow for it), the recipe and the typed
    config inside as one payload - validated once, where it was made. ``job``: what else the workers read."""
    return train_entry.train_func, {train_entry.PAYLOAD: train_entry.payload(recipe, cfg), **job}


@dataclass
class Outcome:
    best_checkpoint: Checkpoint
    best_metrics: dict
    history: list[dict]  # every report (rank 0), in order


def fit(trainer: TorchTrainer, recipe: type[Recipe], cfg: MethodConfig) -> Outcome:
    """Train; the run's checkpoint is the best by the method's selection metric for ``cfg`` (the one
    ``build_trainer`` kept checkpoints by), or the last one.

    Ray Train restarts the workers after a worker or node failure (``run.max_failures`` times), but a node
    lost while it starts the workers fails its controller instead, and that it does not retry: a sweep's
    trial ends there when a node is killed as its workers come up. Such a
    run is started again here, from its last checkpoint (the run's storage keeps it), up to
    ``run.max_failures`` times; any other error is raised at once."""
    for attempt in range(cfg.run.max_failures + 1):
        try:
            result = trainer.fit()
            break
        except ControllerError as exc:
            if attempt == cfg.run.max_failures or not lost_actor_or_node(exc):
                raise
            print(
                f"training: Ray Train's controller failed ({str(exc.controller_failure).splitlines()[0][:160]}); "
                f"started again from the run's last checkpoint ({attempt + 1} of {cfg.run.max_failures})",
                flush=True,
            )
    select = recipe.selection_metric(cfg)
    best = result.get_best_checkpoint(metric=select, mode="max") if select else result.checkpoint
    if best is None:
        raise SieveError("training reported no checkpoint")
    best_metrics = next((m for c, m in result.best_checkpoints if c.path == best.path), {})
    # Every evaluation, in order: the train function returns them (metrics_dataframe only keeps
    # the reports whose checkpoints were kept).
    return Outcome(best, best_metrics, list(result.return_value or []))


def lost_actor_or_node(exc: ControllerError) -> bool:
    """The controller failed because an actor it called, or a node, went away (not because of our code)."""
    return isinstance(exc.controller_failure, (RayActorError, NodeDiedError))


def checkpoint_at(path: str) -> Checkpoint:
    """A reported checkpoint by its path (local or s3://)."""
    if storage.is_s3(path):
        fs, p = storage.pyarrow_filesystem(path)
        return Checkpoint(p, filesystem=fs)
    return Checkpoint(path)


def export_dir(cfg: MethodConfig, name: str) -> Path:
    """Where a job's exported model folder goes, as an absolute path: ``<run storage>/models/<name>``, beside the
    run's checkpoints; on an ``s3://`` storage a local staging copy under ``outputs/models`` (uploaded by the train
    job; the sweeps and comparisons log it to MLflow)."""
    root = Path("outputs") if storage.is_s3(cfg.run.storage) else Path(cfg.run.storage)
    return (root / "models" / name).resolve()


def export_and_test(
    recipe: type[Recipe],
    cfg: MethodConfig,
    outcome: Outcome,
    out_dir: str | Path,
    tasks: list[str] | None = None,
    tested: TestReport | None = None,
):
    """Export the best checkpoint to ``out_dir`` and run the method's final evaluation on it
    (``tasks`` narrows the STS tasks, for tests). ``tested``: this checkpoint's report, measured
    already (a sweep that tests every trial) - written beside the export, not measured again.
    Returns (model folder, TestReport)."""
    with outcome.best_checkpoint.as_directory() as d:
        recipe.export(cfg, Path(d), Path(out_dir))
    report = tested if tested is not None else recipe.evaluate(cfg, Path(out_dir), tasks=tasks)
    report.write(Path(out_dir) / "test.json")
    return Path(out_dir), report


def base_poolings(recipe: type[Recipe], cfg: MethodConfig, tried=()) -> list[str]:
    """The poolings :func:`measure_bases` reads the base with, in its order (none without a base of its own)."""
    if not recipe.has_base:
        return []
    saved = saved_pooling(resolve_model_source(recipe.base_model(cfg)))
    poolings, seen = [], set()
    for p in [recipe.pooling(cfg), *tried, *([saved] if saved else [])]:
        if test_time_pooling(p) not in seen:  # `cls` trains an MLP head and is read as the raw [CLS] at test
            seen.add(test_time_pooling(p))
            poolings.append(p)
    return poolings


def measure_bases(recipe: type[Recipe], cfg: MethodConfig, tried=()) -> list[BaseResult]:
    """The untouched model, measured with every pooling results are read with: the config's, each one in
    ``tried`` (a sweep's ``model.pooling`` values), and the folder's own saved pooling (how the user uses it
    today). A job sets its model against the strongest - never against a weaker way of reading the same
    model (e.g. MiniLM with CLS where it was trained for mean)."""
    out = []
    for p in base_poolings(recipe, cfg, tried):
        variant = cfg.model_copy(deep=True)
        variant.model.pooling = p
        out.append(recipe.evaluate_base(variant))
    return out


# ---------------------------------------------------------------- the base model beside training
def idle_cores(cfg: MethodConfig) -> int:
    """The driver's cores a training run of ``cfg`` leaves idle, were its workers all placed on this machine:
    one 1-CPU worker on a 2-core machine leaves the other core with nothing to do for the whole run. 0 for a
    GPU run, or when the workers take every core: then nothing moves."""
    if cfg.scaling.use_gpu:
        return 0
    return max(0, torch.get_num_threads() - worker_cores(cfg))


def worker_cores(cfg: MethodConfig) -> int:
    """The cores one training run of ``cfg`` takes: its workers' CPUs, rounded up."""
    return math.ceil(cfg.scaling.num_workers * cfg.scaling.cpus_per_worker)


class Beside:
    """``fn()`` on a thread of the driver, at ``threads`` torch threads, while the driver waits on training;
    ``result()`` waits for it, gives its value or raises its error, and gives the driver its threads back.
    The evaluations run this way are deterministic and the workers' numbers do not depend on the driver:
    the figures are those measured one after the other (``test_perf_switches``). A daemon thread: a job
    whose training failed exits without waiting for it."""

    def __init__(self, fn, threads: int):
        self._threads, self._out = torch.get_num_threads(), {}

        def run():
            torch.set_num_threads(threads)
            try:
                self._out["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._out["error"] = exc

        self._thread = threading.Thread(target=run, name="sieve-beside-training", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self):
        self._thread.join()
        torch.set_num_threads(self._threads)
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]
