"""The method registry: name → config type, per-worker train function, export, dev metric.

Adding a sixth method means one new file in ``trainers/`` and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.errors import ConfigError


@dataclass(frozen=True)
class Method:
    name: str
    config_cls: type
    train_func: Callable[[dict], None]
    export: Callable  # (cfg, checkpoint_dir, out_dir) -> out_dir
    evaluate: Callable  # (cfg, model_dir, tasks=None) -> orchestrator.evaluation.suite.TestReport
    metric: str = "stsb_dev_spearman"  # what the train function reports; max is best
    metric_label: str = "STS-B dev Spearman"
    columns: tuple[str, ...] | None = ("text",)  # None: every column of the shards
    # (cfg, progress) -> the directory of parquet shards + manifest.json to train on;
    # None: the SIFTER corpus pipeline over ``cfg.data`` (orchestrator.drivers.train.prepare_shards)
    prepare_data: Callable | None = None
    # (model_dir, name) -> mlflow ModelInfo; None: a sentence-transformers model
    log_model: Callable | None = None


def _contrastive(name: str) -> Method:
    from orchestrator.evaluation.suite import evaluate_sts
    from trainers import sifter_simcse as m

    return Method(name, m.ContrastiveConfig, m.train_func, m.export_model, evaluate_sts,
                  columns=("text", "backbone_view", "deletion_view"))


def _tsdae() -> Method:
    from trainers import tsdae as m

    return Method("tsdae", m.TSDAEConfig, m.train_func, m.export_model, m.evaluate, metric="dev_score",
                  metric_label="dev score (eval.dev; PIT-2015 dev AP by default)", columns=("text",))


def _sifter_lstm() -> Method:
    from trainers import sifter_lstm as m

    return Method("sifter_lstm", m.SifterLSTMConfig, m.train_func, m.export_model, m.evaluate,
                  metric="dev_accuracy", metric_label="SST-2 dev accuracy", columns=("text", "label"),
                  prepare_data=m.prepare_data, log_model=m.log_model)


def _siamese() -> Method:
    from trainers import siamese as m

    return Method("siamese", m.SiameseConfig, m.train_func, m.export_model, m.evaluate, metric="dev_delta",
                  metric_label="dev Δ cosine distance", columns=None, prepare_data=m.prepare_data)


def _parabart() -> Method:
    from trainers import parabart as m

    return Method("parabart", m.ParaBARTConfig, m.train_func, m.export_model, m.evaluate,
                  columns=("src", "tgt", "tgt_parse", "src_bag"), prepare_data=m.prepare_data)


_FACTORIES: dict[str, Callable[[], Method]] = {
    "simcse": lambda: _contrastive("simcse"),
    "sifter_simcse": lambda: _contrastive("sifter_simcse"),
    "tsdae": _tsdae,
    "sifter_lstm": _sifter_lstm,
    "siamese": _siamese,
    "parabart": _parabart,
}


def get_method(name: str) -> Method:
    if name not in _FACTORIES:
        raise ConfigError(f"unknown method {name!r}: expected one of {', '.join(sorted(_FACTORIES))}")
    return _FACTORIES[name]()


def method_names() -> list[str]:
    return sorted(_FACTORIES)
