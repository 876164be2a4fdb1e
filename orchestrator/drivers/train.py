"""Ray Train glue shared by every method: training data, the TorchTrainer, the best checkpoint,
export and the method's final test report.

    shards = prepare_shards(cfg)                       # augmented corpus, content-addressed
    trainer = build_trainer(method, cfg, shards)       # TorchTrainer (DDP or DeepSpeed on CPU/GPU)
    outcome = fit(trainer, method)                     # best checkpoint by the method's dev metric
    model_dir, report = export_and_test(method, cfg, outcome, out_dir)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator import storage
from orchestrator.errors import ConfigError, SieveError


# ---------------------------------------------------------------- before any Ray work
def preflight(cfg) -> str:
    """Fail fast, naming the URI or path: tracking server, storage, model source. Returns the
    MLflow experiment id."""
    from orchestrator import tracking
    from orchestrator.models import resolve_model_source

    exp_id = tracking.setup(cfg.tracking.tracking_uri, cfg.tracking.experiment)
    storage.check_access(cfg.run.storage)
    sources = cfg.model_sources() if hasattr(cfg, "model_sources") else [cfg.model.name_or_path]
    for source in sources:
        resolve_model_source(source)
    return exp_id


# ---------------------------------------------------------------- training data
def corpus_key(input_uri: str, corpus_cfg_json: str) -> str:
    """Content address of an augmented corpus: the input files' bytes (local) or listing (s3) + config."""
    from orchestrator.data.corpus import input_files

    h = hashlib.sha256(corpus_cfg_json.encode())
    for f in input_files(input_uri):
        if storage.is_s3(f):  # a bucket key is stable; local paths are not (working-dir copies)
            h.update(f.encode())
            h.update(str(len(storage.read_bytes(f))).encode())
        else:
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def prepare_shards(data_cfg, storage_root: str, *, seed: int = 42, progress: bool = True) -> str:
    """The augmented shards to train on: the configured ones, or the corpus augmented once and
    cached under ``<storage>/corpora/<content hash>`` (reused when the manifest exists)."""
    from orchestrator.data.corpus import CorpusConfig, run_pipeline

    if data_cfg.shards:
        if not storage.exists(storage.join(data_cfg.shards, "manifest.json")):
            raise SieveError(f"{data_cfg.shards}: no manifest.json (not an augmented corpus from augment_corpus)")
        return data_cfg.shards
    from orchestrator.config import repo_path

    corpus_cfg = CorpusConfig(input=repo_path(data_cfg.corpus), limit=data_cfg.limit, seed=seed,
                              min_words=data_cfg.min_words, drop_capitalised_splits=data_cfg.drop_capitalised_splits,
                              parser={"workers": data_cfg.parser_workers, "cpus_per_worker": 0.5})
    key = corpus_key(corpus_cfg.input, corpus_cfg.model_dump_json(exclude={"input"}))
    out = storage.join(_abs(storage_root), "corpora", key)
    if storage.exists(storage.join(out, "manifest.json")):
        print(f"augmented corpus: reusing {out}")
        return out
    print(f"augmented corpus: building {out}")
    run_pipeline(corpus_cfg, out, progress=progress)
    return out


def prepare_data(method, cfg, *, progress: bool = True) -> str:
    """The shards a method trains on (its own preparation, or the corpus pipeline)."""
    if method.prepare_data is not None:
        return method.prepare_data(cfg, progress=progress)
    return prepare_shards(cfg.data, cfg.run.storage, seed=cfg.train.seed, progress=progress)


def _abs(uri: str) -> str:
    return uri if storage.is_s3(uri) else str(Path(uri).resolve())


# ---------------------------------------------------------------- the trainer
def build_trainer(method, cfg, shards: str, *, name: str | None = None, callbacks=None, storage_path: str | None = None):
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    fs, path = storage.pyarrow_filesystem(storage.join(shards, "shards"))
    ds = ray.data.read_parquet(path, filesystem=fs)
    if method.columns:
        ds = ds.select_columns(list(method.columns))
    rows = ds.count()
    workers = cfg.scaling.num_workers
    rows_per_worker = rows // workers
    if rows_per_worker < cfg.train.batch_size:
        raise ConfigError(f"train.batch_size {cfg.train.batch_size}: each of {workers} workers gets only "
                          f"{rows_per_worker} rows from {shards}")
    resources = {"CPU": cfg.scaling.cpus_per_worker, **cfg.scaling.resources_per_worker}
    if cfg.scaling.use_gpu:
        resources.setdefault("GPU", 1)
    scaling = ScalingConfig(num_workers=workers, use_gpu=cfg.scaling.use_gpu, resources_per_worker=resources)
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}  # the ingest's bars would drown Tune's table
    if not cfg.scaling.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    env.update({k: v for k, v in os.environ.items() if k.startswith("SIEVE_FAIL_")})  # fault-injection tests
    run = RunConfig(
        name=name or cfg.run.name or f"{cfg.method}",
        storage_path=storage_path or _abs(storage.join(cfg.run.storage, "train")),
        checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.num_to_keep, checkpoint_score_attribute=method.metric,
                                           checkpoint_score_order="max"),
        failure_config=FailureConfig(max_failures=cfg.run.max_failures),
        callbacks=callbacks,
        worker_runtime_env={"env_vars": env},
    )
    return TorchTrainer(
        method.train_func,
        train_loop_config={"method_config": cfg.model_dump(mode="json"), "rows_per_worker": rows_per_worker,
                           "shards": shards},
        scaling_config=scaling, run_config=run, datasets={"train": ds},
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
    )


@dataclass
class Outcome:
    best_checkpoint: object  # ray.train.Checkpoint
    best_metrics: dict
    history: list[dict]  # every report (rank 0), in order


def fit(trainer, method) -> Outcome:
    result = trainer.fit()
    best = result.get_best_checkpoint(metric=method.metric, mode="max")
    if best is None:
        raise SieveError("training reported no checkpoint")
    best_metrics = next((m for c, m in result.best_checkpoints if c.path == best.path), {})
    # Every evaluation, in order: the train function returns them (metrics_dataframe only keeps
    # the reports whose checkpoints were kept).
    history = list(result.return_value or [])
    return Outcome(best, best_metrics, history)


def export_and_test(method, cfg, outcome: Outcome, out_dir: str | Path, tasks: list[str] | None = None):
    """Export the best checkpoint to ``out_dir`` and run the method's final evaluation on it
    (``tasks`` narrows the STS tasks, for tests). Returns (model folder, TestReport)."""
    with outcome.best_checkpoint.as_directory() as d:
        method.export(cfg, Path(d), Path(out_dir))
    report = method.evaluate(cfg, Path(out_dir), tasks=tasks)
    report.write(Path(out_dir) / "test.json")
    return Path(out_dir), report


os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
