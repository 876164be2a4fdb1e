"""Typed configs: YAML files validated by pydantic models, with ``key=value`` overrides.

Every job loads its config the same way::

    cfg = load_config(SifterConfig, "configs/sifter_simcse/smoke.yaml", ["train.lr=3e-5"])

Unknown keys, wrong types and missing files raise :class:`ConfigError` with one line that
names the file and the dotted key, e.g.
``configs/x.yaml: train.lr: Input should be a valid number, unable to parse string as a number (got 'fast')``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"


class StrictModel(BaseModel):
    """Base for every config block: unknown keys are errors, not silently ignored."""

    # NaN and infinity are refused in every number: `train.lr=.inf` would train on nothing but NaN
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False
    )


Pooling = Literal["cls", "cls_before_pooler", "mean"]


class ModelConfig(StrictModel):
    """Which encoder to start from: ``default`` (packaged MiniLM), a local folder, or ``s3://``.

    ``pooling`` is honoured everywhere - the embedding fed to the loss, dev scoring, the test report
    and the exported folder's pooling module: ``mean`` (attention-masked mean of the token states),
    ``cls`` (SimCSE's MLP head over ``[CLS]`` in training, the raw ``[CLS]`` state at test - the
    papers' setting), ``cls_before_pooler`` (the raw ``[CLS]`` state throughout). Left empty, the
    model folder's own saved pooling is used (a sentence-transformers folder records it), else the
    method's default."""

    name_or_path: str = "default"
    max_length: int = Field(32, gt=0, le=8192)
    pooling: Pooling | None = None


class TrackingConfig(StrictModel):
    """MLflow: an empty ``tracking_uri`` means env ``MLFLOW_TRACKING_URI``, else the embedded store."""

    tracking_uri: str | None = None
    experiment: str = "sieve"
    registry_model_name: str | None = None


class EvalConfig(StrictModel):
    """An encoder's final test: the STS tasks, and the domain tasks before them when named (their first
    figure the headline: TwitterPara's AP for ``twitterpara``). Every encoder recipe is tested this way, so
    arms of different methods can be compared on one test (``jobs/compare.py``)."""

    tasks: list[str] = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]
    domain: list[str] = Field(
        [], description="domain evaluators (twitterpara, or one given a path in domain_paths)"
    )
    domain_paths: dict[str, str] = {}
    batch_size: int = Field(64, gt=0)
    max_length: int = Field(128, gt=0)


T = TypeVar("T", bound=BaseModel)


# a config is a page of keys: these bound what a hostile or broken file costs before a line of it is built (a YAML
# alias bomb expands to gigabytes; a 1,000-deep document exhausts the parser's recursion)
YAML_MAX_BYTES, YAML_MAX_ALIASES, YAML_MAX_DEPTH = 1 << 20, 64, 32


def safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text`` within the limits above, checked on the parser's events first (nothing is
    composed): a larger text, more aliases or deeper nesting is refused in one line naming ``where``."""
    if len(text) > YAML_MAX_BYTES:
        raise ConfigError(f"{where}: {len(text):,} bytes of YAML; a config is at most {YAML_MAX_BYTES:,}")
    depth = aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > YAML_MAX_DEPTH:
                line = event.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: YAML nested deeper than {YAML_MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > YAML_MAX_ALIASES:
                line = event.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: more than {YAML_MAX_ALIASES} YAML aliases (*name)")
    return yaml.safe_load(text)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = safe_yaml(path.read_text(encoding="utf-8"), str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (["a", "b", "c"], value parsed as YAML: numbers, bools, lists)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value")
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key")
    try:
        value = safe_yaml(raw, f"override {key}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def set_path(data: dict[str, Any], parts: list[str], value: Any, what: str) -> None:
    """``data[a][b][c] = value`` for ``parts`` [a, b, c], creating mappings on the way (in place)."""
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{what}: {part} is not a mapping")
        node = nxt
    node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Command-line ``key.sub=value`` strings (values parsed as YAML) applied to a copy of ``data``."""
    out = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides or []:
        parts, value = parse_override(item)
        set_path(out, parts, value, f"override {item!r}")
    return out


def with_params(cfg: T, params: dict[str, Any], source: str) -> T:
    """A typed config with ``params`` (dotted path → value, e.g. ``{"train.lr": 3e-5}``) applied,
    validated once. Values are set by path on the config's own dump: no string round trip."""
    data = cfg.model_dump(mode="json")
    for path, value in params.items():
        set_path(data, path.split("."), value, f"{source}: {path}")
    return validate(type(cfg), data, source)


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, prefixed with the source: the first problem is the message."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "value_error":  # a validator's own sentence: it names its keys
            msg = msg.removeprefix("Value error, ")
        elif "input" in err and not isinstance(err["input"], dict | list):
            msg = f"{msg} (got {err['input']!r})"
            if err["type"] == "list_type":  # the spelling of a list on the command line
                msg += f"; a list is written in brackets: '{key}=[a, b]' (quoted for the shell)"
        lines.append(f"{source}: {msg}" if key == "<root>" else f"{source}: {key}: {msg}")
    if len(lines) == 1:
        return lines[0]
    return (
        f"{lines[0]} (and {len(lines) - 1} more: " + "; ".join(ln.split(": ", 1)[1] for ln in lines[1:]) + ")"
    )


STORAGE_ENV = "SIEVE_STORAGE"
STORAGE_REF = "${" + STORAGE_ENV + "}"


def storage_root() -> str | None:
    """The project's storage root (``s3://BUCKET`` on a cluster infra/ made), when set."""
    root = os.environ.get(STORAGE_ENV, "").strip().rstrip("/")
    return root or None


def expand_storage(data: Any, source: str, key: str = "") -> Any:
    """``${SIEVE_STORAGE}`` in any string value → the storage root; a clear error when it is unset."""
    if isinstance(data, dict):
        return {k: expand_storage(v, source, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_storage(v, source, f"{key}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, str) and STORAGE_REF in data:
        root = storage_root()
        if root is None:
            raise ConfigError(
                f"{source}: {key} = {data!r} uses {STORAGE_REF}, which is not set: export "
                f"{STORAGE_ENV}=s3://BUCKET (the bucket infra/ made; the cluster's pods set it) "
                f"or override {key}"
            )
        return data.replace(STORAGE_REF, root)
    return data


def validate(model_cls: type[T], data: dict[str, Any], source: str) -> T:
    data = expand_storage(data, source)
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


DEFAULT_PRESET = "smoke"


def resolve_config_path(path_or_preset: str | Path | None, method: str | None = None) -> Path:
    """A path as given, or ``configs/<method>/<preset>.yaml`` for a bare preset name (None: the smoke preset)."""
    p = Path(path_or_preset or DEFAULT_PRESET)
    if p.suffix in {".yaml", ".yml"} or p.exists() or method is None:
        return p
    return CONFIG_DIR / method / f"{p}.yaml"


def load_config(model_cls: type[T], path: str | Path | None, overrides: list[str] | None = None) -> T:
    """Load YAML (or start from the model's defaults when ``path`` is None), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        data = read_yaml(Path(path))
        source = str(path)
    data = apply_overrides(data, overrides)
    if overrides:
        source = f"{source} (+ overrides)"
    return validate(model_cls, data, source)


def repo_path(path: str) -> str:
    """A relative local path as given when it exists from the working directory, else relative
    to the repository (configs name ``data/...`` files that ship with the project)."""
    if path.startswith("s3://") or Path(path).is_absolute() or Path(path).exists():
        return path
    candidate = REPO_ROOT / path
    return str(candidate) if candidate.exists() else path


def config_hash(cfg: BaseModel, *, exclude: set[str] | None = None) -> str:
    """A short stable hash of a config (sorted JSON), for content addressing and model descriptions."""
    blob = json.dumps(cfg.model_dump(mode="json", exclude=exclude), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (for MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------- blocks shared by every method
class GradCacheBlock(StrictModel):
    """Cached gradients (``trainers/grad_cache.py``): the worker's batch is encoded ``mini_batch`` sequences
    at a time, so a contrastive batch's negatives grow without its activations."""

    mini_batch: int = Field(gt=0, description="sequences per forward pass; divides train.batch_size")


class CollapseGuard(StrictModel):
    """Watched at every evaluation: a run whose dev score falls more than ``dev_margin`` below the untouched
    model's (measured before the first step), or whose embeddings' mean pairwise cosine passes ``max_cosine``,
    stops there - that evaluation writes no checkpoint, so the best kept one is from before the fall. Both unset
    (the default): off."""

    dev_margin: float | None = Field(
        None, gt=0, description="dev points (a fraction: 0.05 = 5) below the base"
    )
    dev_metric: str | None = Field(
        None, description="the dev metric watched (default: the run's selection metric)"
    )
    max_cosine: float | None = Field(None, gt=-1, le=1, description="bound on the logged cosine metric")
    cosine_metric: str = Field(
        "u_cosine_mean", description="the dev metric that logs the mean pairwise cosine"
    )


class TrainLoopConfig(StrictModel):
    """The optimisation loop. ``batch_size`` is per worker; the global batch is ``batch_size × workers``."""

    lr: float = Field(3e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(64, gt=0)
    epochs: int = Field(1, gt=0)
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimiser steps")
    eval_steps: int = Field(125, gt=0)
    log_steps: int = Field(
        10, gt=0, description="loss, learning rate and throughput to MLflow every this many steps"
    )
    lr_schedule: Literal["linear", "constant"] = "linear"
    warmup_steps: int = Field(
        0, ge=0, description="linear warm-up of the learning rate (transformers' schedules)"
    )
    grad_clip: float | None = Field(None, gt=0)
    seed: int = Field(42, ge=0, lt=2**32, description="every generator's seed (numpy's take 0 .. 2**32-1)")
    grad_cache: GradCacheBlock | None = Field(
        None, description="contrastive recipes: cached gradients (a large batch on a small batch's memory)"
    )
    collapse_guard: CollapseGuard = Field(
        CollapseGuard(),
        description="stop a run whose dev falls or whose embeddings collapse (off by default)",
    )

    @model_validator(mode="after")
    def _mini_batch_divides_batch(self):
        if self.grad_cache and self.batch_size % self.grad_cache.mini_batch:
            raise ValueError(
                f"grad_cache.mini_batch ({self.grad_cache.mini_batch}) must divide the per-worker "
                f"train.batch_size ({self.batch_size})"
            )
        return self

    def planned_steps(self, rows_per_worker: int) -> int:
        """The steps a run makes: ``max_steps``, unless ``epochs`` passes over the data end first (the schedule
        is sized for these)."""
        full = max(1, rows_per_worker // self.batch_size) * self.epochs
        return min(self.max_steps, full) if self.max_steps else full


class ScalingBlock(StrictModel):
    num_workers: int = Field(2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0)
    resources_per_worker: dict[str, float] = {}
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="how the workers' bundles are placed on nodes (STRICT_SPREAD: one worker per node)",
    )
    wait_for_nodes_s: float = Field(
        600,
        ge=0,
        description="on a cluster that can add nodes (one the job joined through RAY_ADDRESS), how long to wait "
        "for a node a worker fits on before the job stops; a private local Ray cannot grow: no wait",
    )


class DeepSpeedBlock(StrictModel):
    """ZeRO for large variants; ``stage: 0`` means plain DDP."""

    stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    bf16: Literal["auto", "on", "off"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    bucket_size: int | None = Field(
        None,
        gt=0,
        description="elements per communication bucket: ZeRO's reduce and all-gather buckets, ZeRO-3's prefetch "
        "(null: DeepSpeed's defaults, 5e8 and 5e7 - larger than a BERT-base, so a bucket can hold every gradient)",
    )
    max_live_parameters: int | None = Field(
        None,
        gt=0,
        description="ZeRO-3: parameters a worker keeps gathered before releasing them, and the reuse distance under "
        "which it keeps one (null: DeepSpeed's 1e9 - more than a BERT-large: every parameter may stay whole)",
    )


class PerformanceBlock(StrictModel):
    """Speed switches, each tested on CPU to give the fp32 loss within a stated tolerance. ``auto``: on
    where it pays - a GPU, and for fused AdamW the CPU too (``bench/results/cpu_step.md``)."""

    bf16: Literal["auto", "on", "off"] = Field(
        "auto", description="bf16 autocast of the forward on the DDP path (ZeRO has deepspeed.bf16)"
    )
    attention: Literal["auto", "sdpa", "eager"] = Field(
        "auto",
        description="transformers' attention kernel (auto: transformers' default, SDPA where supported)",
    )
    fused_adamw: Literal["auto", "on", "off"] = Field(
        "auto",
        description="AdamW's update in one kernel per "
        "parameter group (auto: on, GPU and CPU alike; the CPU "
        "optimiser step 4x faster, the same update rule)",
    )
    compile: bool = Field(False, description="torch.compile the model (plain / DDP path)")
    compile_backend: str = "inductor"
    pin_memory: Literal["auto", "on", "off"] = Field(
        "auto", description="pinned host memory for batches sent to a GPU"
    )
    ingest_prefetch: int = Field(
        4,
        ge=0,
        description="batches of the worker's shard read ahead on a thread, "
        "from the start of the train function (0: read when the loop asks)",
    )
    ingest_materialize_mb: int = Field(
        256,
        ge=0,
        description="a training corpus whose shard files total at "
        "most this many MiB is read into Ray's object store once, before the "
        "workers start; a larger one streams (0: always stream)",
    )

    AUTO_ON_CPU: ClassVar[frozenset[str]] = frozenset({"fused_adamw"})  # measured to pay on CPU as well

    def on(self, switch: str, gpu: bool) -> bool:
        value = getattr(self, switch)
        return value == "on" or (value == "auto" and (gpu or switch in self.AUTO_ON_CPU))


class RunBlock(StrictModel):
    """Where a run's checkpoints live and how it survives failures."""

    name: str | None = None
    storage: str = "outputs/runs"
    max_failures: int = Field(
        1,
        ge=0,
        description="restarts from the last checkpoint after a worker or node "
        "failure (Ray Train's), and after a node lost while the workers start",
    )
    num_to_keep: int = Field(2, ge=1)


# ---------------------------------------------------------------- what every method's config has
class MethodConfig(StrictModel):
    """The blocks every method shares: the loop, scaling, DeepSpeed, run storage and tracking.

    A recipe's config subclasses this (or :class:`EncoderMethodConfig`) and adds its own keys."""

    method: str
    # whether the recipe's loss can run under ``train.grad_cache`` (an in-batch contrastive loss)
    supports_grad_cache: ClassVar[bool] = False
    train: TrainLoopConfig = TrainLoopConfig()
    scaling: ScalingBlock = ScalingBlock()
    deepspeed: DeepSpeedBlock = DeepSpeedBlock()
    perf: PerformanceBlock = PerformanceBlock()
    run: RunBlock = RunBlock()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="before")
    @classmethod
    def _location_keys_keep_the_methods_defaults(cls, data):
        """``tracking`` and ``run`` given in part (a file's ``tracking: {uri: ...}``, a job's ``--tracking-uri`` or
        ``--storage``) keep the method's own defaults for the keys left out - TSDAE's registry name, say - not the
        block's. (Other blocks given in part start from the block's defaults: a data block names its own file.)"""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name in ("tracking", "run"):
            given, default = out.get(name), cls.model_fields[name].default
            if isinstance(given, dict) and isinstance(default, BaseModel):
                out[name] = {**default.model_dump(mode="json", exclude_unset=True), **given}
        return out

    @model_validator(mode="after")
    def _grad_cache_supported(self):
        if self.train.grad_cache is not None and not self.supports_grad_cache:
            raise ValueError(
                f"train.grad_cache: {self.method} cannot cache gradients (only a recipe whose loss is "
                "in-batch contrastive can)"
            )
        return self

    def model_sources(self) -> list[str]:
        """Every model folder / URI the run reads (checked before any Ray work)."""
        return []

    def data_sources(self) -> list[tuple[str, str]]:
        """(config key, path or URI) of every data file or folder the run reads (checked before any Ray work)."""
        return []

    def check_data(self) -> None:
        """Read what a preflight can afford to read whole (small labelled files: their columns, their filters),
        so a wrong column fails before any Ray work with its file named; nothing by default."""
        return None


class ExportBlock(StrictModel):
    """What an exported encoder folder holds besides the sentence-transformers model."""

    onnx: list[Literal["fp32", "int8"]] = Field(
        [],
        description="ONNX copies in the folder's onnx/ (fp32: graph-optimised; int8: dynamic quantisation) for a "
        "service that runs ONNX Runtime (orchestrator/onnx_export.py)",
    )


class EncoderMethodConfig(MethodConfig):
    """A method that trains a Transformer sentence encoder (``model``) and evaluates it (``eval``)."""

    model: ModelConfig = ModelConfig()
    eval: EvalConfig = EvalConfig()
    export: ExportBlock = ExportBlock()
    default_pooling: ClassVar[str] = "mean"  # when neither the config nor the model folder names one

    def model_sources(self) -> list[str]:
        return [self.model.name_or_path]

    def eval_sources(self) -> list[tuple[str, str]]:
        """The domain tasks' files given by path (``eval.domain_paths``)."""
        return [(f"eval.domain_paths.{k}", v) for k, v in self.eval.domain_paths.items()]
