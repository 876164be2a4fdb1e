"""What every method is, and the one worker loop they share: :class:`Recipe`.

A recipe is a class (torchtune's shape). Its *class attributes* say what the method is - its name, its
config class, the evaluation protocol it is read by (:mod:`trainers.protocol`: the dev metric settings are
ranked by, the test, the base), the shard columns its workers read. Its *hooks* say how it trains; the
abstract ones (``build``, ``loss``, ``prepare_data``, ``export``) every recipe writes - a class missing one
cannot be instantiated - ``dev`` and ``evaluate`` come from its protocol or are written by a recipe that
names none, and the rest have defaults. A recipe never subclasses another method's recipe: what methods
share is composed (the protocol, :mod:`trainers.encoder`, :mod:`trainers.checkpoint`).

=====================  ========================================================================
worker hooks           ``setup()`` (read once per worker, before the model), ``build()`` (the module
                       to train; called again for ZeRO-3's plain copy), ``optimizer_extras(module)``
                       (param groups, modules trained beside it), ``loss(model, batch, state)``,
                       ``dev(module)``
driver hooks           ``prepare_data``, ``export``, ``evaluate``, ``evaluate_base``, ``log_model``
                       (static: a recipe names its module's functions), ``selection_metric``,
                       ``has_dev``, and what a report or a comparison states about a run:
                       ``base_model``, ``pooling``, ``training_data``, ``comparable``
=====================  ========================================================================

:meth:`Recipe.train_func` is what Ray Train runs on every worker: the config validated once, the worker
set up (shard read-ahead, threads, rank-offset seeds), the model built, the optimiser step (DDP or
DeepSpeed ZeRO) and :func:`trainers.loop.train_loop` - resume, evaluation, reports, checkpoints.
Drivers reach recipes only through ``orchestrator.drivers.registry`` and ask them; they never probe a
config or a model. A new method is one file here (its config, model, loss and a ``Recipe`` subclass),
its configs, one line in the registry and its test (``docs/METHODS.md``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from inspect import getattr_static
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from orchestrator.config import MethodConfig
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import pooling_for
from orchestrator.spec import BaseResult
from trainers import common, loop
from trainers.protocol import Protocol

# what arms of a comparison share: equal steps at one global batch, or (a compare file's ``budget:
# sentences``, to compare batch sizes) equal training sentences, steps × global batch
STEP_BUDGET = "the step budget (train.max_steps)"
GLOBAL_BATCH = "the global batch (train.batch_size × scaling.num_workers)"
SENTENCES = "the training sentences (train.max_steps × train.batch_size × scaling.num_workers)"


class Recipe(ABC):
    # ------------------------------------------------------------ what the method is
    name: ClassVar[str]
    # docs/METHODS.md's table is written from these: the method in a phrase, how it runs (default: the train
    # job), how its runs are read - the dev metric → the test (default: the protocol's)
    title: ClassVar[str] = ""
    runs_with: ClassVar[str] = ""
    reads: ClassVar[str] = ""
    config_cls: ClassVar[type[MethodConfig]]
    # how its runs are read (dev score, test, base); None: the recipe writes ``dev`` and ``evaluate`` itself
    protocol: ClassVar[Protocol | None] = None
    metric: ClassVar[str]  # the dev metric every evaluation reports; higher is better: settings are ranked
    # by it and the base model is measured on it (the registration gate); the protocol's unless set
    metric_label: ClassVar[str]
    columns: ClassVar[tuple[str, ...] | None] = None  # shard columns the workers read (None: all)
    # False: the method's baseline is a point of its own sweep grid (``baseline_params``), not the
    # untouched starting model, which ``evaluate_base`` measures otherwise
    has_base: ClassVar[bool] = True
    baseline_params: ClassVar[dict] = {}
    # how a trained model is logged to MLflow: a sentence-transformers folder (checked as one), or the
    # method's own format, logged by its ``log_model``
    model_format: ClassVar[str] = "sentence-transformers"

    def __init_subclass__(cls, **kwargs):
        """A named recipe is checked and completed where it is defined: the protocol's metric unless it sets
        one, the docs' defaults; one with no protocol must write ``dev`` and ``evaluate``."""
        super().__init_subclass__(**kwargs)
        if cls.protocol is not None and "metric" not in vars(cls):
            cls.metric, cls.metric_label = cls.protocol.metric, cls.protocol.metric_label
        if "name" not in vars(cls):
            return
        if cls.protocol is None:
            unwritten = [
                h for h in ("dev", "evaluate") if getattr_static(cls, h) is getattr_static(Recipe, h)
            ]
            if unwritten:
                raise TypeError(
                    f"recipe {cls.name!r} names no protocol and writes no {' / '.join(unwritten)}"
                )
        cls.title = vars(cls).get("title") or cls.name
        cls.runs_with = vars(cls).get("runs_with") or f"`jobs/train.py --method {cls.name}`"
        cls.reads = vars(cls).get("reads") or (cls.protocol.summary if cls.protocol else cls.metric_label)

    # ------------------------------------------------------------ on every Ray Train worker
    def __init__(self, cfg: MethodConfig, job: dict):
        self.cfg = cfg
        self.job = job  # the driver's train_loop_config: shards, rows_per_worker, ...
        self.device = common.device_for(cfg)
        self.stepper: common.Stepper | None = None  # set by ``train_func`` once the optimiser exists

    def setup(self) -> None:
        """What a worker reads once, before the model is built (vocabularies, dev rows); nothing by default."""
        return None

    @abstractmethod
    def build(self) -> nn.Module:
        """The module to train, on the CPU (``train_func`` moves it)."""

    def optimizer_extras(self, module: nn.Module) -> dict:
        """Keyword arguments of :func:`trainers.common.make_stepper`: ``groups`` (AdamW param groups;
        default: decay all but biases and norms) and ``extra_modules`` / ``extra_optimizers``."""
        return {}

    @abstractmethod
    def loss(self, model: nn.Module, batch: dict, state: dict) -> tuple[torch.Tensor, dict]:
        """(loss, logged floats) of one batch; ``model`` is the wrapped one (DDP or the ZeRO engine),
        ``state`` holds ``step`` and ``epoch``."""

    def dev(self, module: nn.Module) -> float | dict:
        """The dev score ``metric`` of the plain module (rank 0 only), or a dict that holds it and more;
        an empty dict when the run has no dev set. The protocol's: ``module.encoder`` read with
        ``self.tokenizer`` (what ``build`` keeps)."""
        return self.protocol.dev(module.encoder, self.tokenizer, self.cfg)

    @classmethod
    def train_func(cls, config: dict) -> list[dict]:
        """Ray Train's per-worker loop, shared by every recipe. Returns every evaluation's metrics."""
        cfg = config["method_config"]  # the driver's typed config, validated once where it was made
        if not isinstance(cfg, cls.config_cls):
            raise TypeError(
                f"{cls.name}: method_config is a {type(cfg).__name__}, not a {cls.config_cls.__name__}"
            )
        batches = common.setup_worker(cfg)  # first: seeds every RNG before anything random is built
        recipe = cls(cfg, config)
        recipe.setup()
        module = recipe.build().to(recipe.device)
        rows = int(config["rows_per_worker"])
        recipe.stepper = stepper = common.make_stepper(module, cfg, rows, **recipe.optimizer_extras(module))
        return loop.train_loop(
            cfg,
            stepper,
            rows_per_worker=rows,
            batches=batches,
            metric=cls.metric,
            loss_fn=lambda batch, state: recipe.loss(stepper.model, batch, state),
            dev_fn=recipe.dev,
            build_plain=lambda: recipe.build().to(recipe.device),
        )

    # ------------------------------------------------------------ on the driver
    @staticmethod
    @abstractmethod
    def prepare_data(cfg: MethodConfig, progress: bool = True) -> str:
        """The method's training data as parquet shards + manifest.json (content-addressed): their folder."""

    @staticmethod
    @abstractmethod
    def export(cfg: MethodConfig, checkpoint_dir: Path, out_dir: Path) -> Path:
        """A reported checkpoint → the model folder users load."""

    @classmethod
    def evaluate(cls, cfg: MethodConfig, model_dir, tasks: list[str] | None = None) -> TestReport:
        """The exported folder's test report (the protocol's test)."""
        return cls.protocol.test(cfg, model_dir, tasks)

    @classmethod
    def evaluate_base(cls, cfg: MethodConfig) -> BaseResult:
        """The untouched starting model on the dev metric and the test report: the protocol's, or written by a
        recipe with ``has_base`` and no protocol; one without a base (its baseline is a point of its own grid)
        has nothing to measure, and drivers never ask."""
        if cls.protocol is not None and cls.has_base:
            return cls.protocol.evaluate_base(cfg)
        raise TypeError(
            "this recipe has no untouched base model of its own (has_base is False): its baseline is "
            "a point of its sweep grid (baseline_params)"
        )

    @staticmethod
    def log_model(model_dir: str, name: str = "model") -> Any:
        """Log an exported folder to the active MLflow run; returns mlflow's ModelInfo."""
        from orchestrator import tracking  # on the driver: a worker never imports MLflow for it

        return tracking.log_sentence_encoder(model_dir, name=name)

    @classmethod
    def selection_metric(cls, cfg: MethodConfig) -> str | None:
        """Which reported metric picks a run's checkpoint, or None for the last one (a paper's
        fixed-steps protocol)."""
        return cls.protocol.selection_metric(cfg) if cls.protocol else cls.metric

    @classmethod
    def has_dev(cls, cfg: MethodConfig) -> bool:
        """Whether a config has a dev score at all (sweeps rank settings by it)."""
        return cls.protocol.has_dev(cfg) if cls.protocol else True

    @classmethod
    def dev_tasks(cls, cfg: MethodConfig) -> list[str]:
        """The evaluation tasks (as ``eval.tasks`` / ``eval.domain`` name them) the dev score reads: a sweep's
        confirm stage refuses to test on one, since the explore stage selected on it."""
        return cls.protocol.dev_tasks(cfg) if cls.protocol else []

    @classmethod
    def test_tasks(cls, cfg: MethodConfig) -> list[str]:
        """The tasks the final test reads: the STS tasks and the domain tasks."""
        return [*cfg.eval.tasks, *cfg.eval.domain]

    # ------------------------------------------------------------ what reports and comparisons state
    @classmethod
    def base_model(cls, cfg: MethodConfig) -> str:
        return cfg.model.name_or_path

    @classmethod
    def pooling(cls, cfg: MethodConfig) -> str | None:
        """The sentence vector's pooling (None: the method has no pooled encoder)."""
        return pooling_for(cfg)

    @classmethod
    def training_data(cls, cfg: MethodConfig) -> dict | None:
        return cfg.data.model_dump(mode="json")

    @classmethod
    def paper_preset(cls) -> str:
        """The preset that is the paper's setting (``docs/FIDELITY.md`` holds it to the paper)."""
        return f"configs/{cls.name}/paper.yaml"

    @classmethod
    def comparable(cls, cfg: MethodConfig) -> dict[str, object]:
        """What arms of one comparison must share (``jobs/compare.py`` refuses a difference, naming it)."""
        test = cls.protocol.test if cls.protocol else cls.evaluate
        return {
            "the base model (model.name_or_path)": cls.base_model(cfg),
            STEP_BUDGET: cfg.train.max_steps,
            GLOBAL_BATCH: cfg.train.batch_size * cfg.scaling.num_workers,
            "the test tasks (eval.tasks)": cfg.eval.tasks,
            "the domain tasks (eval.domain)": (cfg.eval.domain, cfg.eval.domain_paths),
            "the test's max_length (eval.max_length)": cfg.eval.max_length,
            "the test (the method's evaluation)": f"{test.__module__}.{test.__qualname__}",
            "the run storage (run.storage)": cfg.run.storage,
        }
