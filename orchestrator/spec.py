"""What a recipe declares about itself, once: :class:`MethodSpec`.

Each file in ``trainers/`` ends with ``SPEC = MethodSpec(...)`` (the contrastive recipe declares two:
SimCSE and SIFTER-SimCSE). The drivers find recipes only through ``orchestrator.drivers.registry``,
which lists the recipe modules; nothing else in the drivers names a method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import EncoderMethodConfig, MethodConfig
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import load_encoder, pooling_for, resolve_model_source


@dataclass(frozen=True)
class BaseResult:
    """The untouched starting model, measured like a trained one: dev score + test report."""

    dev: float
    test: TestReport
    label: str  # e.g. "base (default, mean)"


def measure_base(cfg: EncoderMethodConfig, dev_score: Callable, evaluate: Callable, label: str = "base") -> BaseResult:
    """The untouched starting encoder of ``cfg``, with its pooling: ``dev_score(encoder, tokenizer, cfg)``
    and the method's test report ``evaluate(cfg, folder)`` - exactly what a trained model gets."""
    encoder, tokenizer = load_encoder(cfg.model.name_or_path, add_pooling_layer=False)
    return BaseResult(dev_score(encoder, tokenizer, cfg), evaluate(cfg, resolve_model_source(cfg.model.name_or_path)),
                      f"{label} ({cfg.model.name_or_path}, {pooling_for(cfg)})")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_cls: type[MethodConfig]
    # per-worker loop under Ray Train: (train_loop_config) -> every evaluation's metrics
    train_func: Callable[[dict], list[dict]]
    export: Callable[[MethodConfig, Path, Path], Path]  # (cfg, checkpoint_dir, out_dir) -> model folder
    evaluate: Callable[..., TestReport]  # (cfg, model_dir, tasks=None) -> the final test report
    prepare_data: Callable[..., str]  # (cfg, progress=True) -> folder of parquet shards + manifest.json
    metric: str  # the dev metric every evaluation reports; higher is better. Settings are ranked by it and
    # the base model is measured on it (the registration gate)
    metric_label: str
    columns: tuple[str, ...] | None  # shard columns the workers read (None: all)
    # the untouched starting model on the dev metric and the test report (None: the method's baseline
    # is a point of its own sweep grid, see ``baseline_params``)
    evaluate_base: Callable[[MethodConfig], BaseResult] | None = None
    baseline_params: dict = field(default_factory=dict)  # sweep params that make a trial the baseline
    log_model: Callable | None = None  # (model_dir, name) -> mlflow ModelInfo; None: sentence-transformers
    # which reported metric picks a run's checkpoint: (cfg) -> a metric key, or None for the last
    # checkpoint (a paper's fixed-steps protocol); None here: ``metric``
    selection: Callable[[MethodConfig], str | None] | None = None
    # whether a config has a dev score at all (sweeps rank settings by it); None: always
    has_dev: Callable[[MethodConfig], bool] | None = None

    def selection_metric(self, cfg: MethodConfig) -> str | None:
        return self.selection(cfg) if self.selection else self.metric
