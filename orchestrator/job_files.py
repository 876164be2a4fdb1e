"""The job files' typed models and the checks they pass before Ray starts - configuration, no Ray.

A **sweep file** (``configs/*_sweep/``): the method, its base preset and overrides, the search space, the scheduler
and the confirm stage; each dimension's values, and every grid point, must give a valid method config (values
valid alone can be invalid together), and the confirm seeds are never the explore stage's.

A **compare file** (``configs/compare/``): the seeds, the arms (each a method's preset + overrides, optionally after
a start stage), the reference arm, the statistics and the optional registration.

The drivers (``orchestrator/drivers/``) turn them into Ray Tune runs: ``sweep.py`` a space, ``compare.py`` arms."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config import MethodConfig, StrictModel, with_params
from orchestrator.errors import ConfigError
from orchestrator.results.publish import flat_params


class Dimension(StrictModel):
    grid: list[Any] | None = None
    choice: list[Any] | None = None
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in ("grid", "choice", "uniform", "loguniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of grid, choice, uniform, loguniform")
        bounds = self.uniform or self.loguniform
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"lower bound {bounds[0]} must be below upper bound {bounds[1]}")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError("loguniform bounds must be > 0")
        if (self.grid is not None and not self.grid) or (self.choice is not None and not self.choice):
            raise ValueError("grid/choice needs at least one value")
        return self

    def candidates(self) -> list[Any]:
        """Values that must validate against the method config: every grid / choice value; for a range its
        bounds and an interior point a sampler can draw (a float range on an integer key fails here, not
        inside a trial)."""
        if self.uniform is not None:
            return [*self.uniform, self.uniform[0] + (self.uniform[1] - self.uniform[0]) * 0.37]
        if self.loguniform is not None:
            lo, hi = self.loguniform
            return [lo, hi, lo * (hi / lo) ** 0.37]
        return list(self.grid or self.choice)


class SchedulerBlock(StrictModel):
    type: str = Field("asha", pattern="^(asha|fifo)$")
    grace_period: int = Field(1, ge=1, description="evaluations before a trial may be stopped")
    reduction_factor: float = Field(2.0, gt=1)


class SweepConfig(StrictModel):
    search: Literal["variants", "optuna"] = Field(
        "variants",
        description="variants: every grid point × num_samples random draws; optuna: Bayesian (TPE), "
        "num_samples trials, seeded",
    )
    num_samples: int = Field(1, ge=1)
    max_concurrent_trials: int | None = Field(None, ge=1, description="default: what the cluster fits")
    seed: int = 0
    scheduler: SchedulerBlock = SchedulerBlock()
    space: dict[str, Dimension] = {}


class ConfirmBlock(StrictModel):
    """The confirm stage: the explore stage's best settings trained again with fresh paired seeds and tested on
    the test tasks, which the explore stage never read; ``candidate`` moves only when the best confirmed
    setting's interval against the base lies above 0 (Holm-adjusted over the settings)."""

    top_k: int = Field(2, ge=1, description="how many of the explore stage's best settings are confirmed")
    seeds: int | list[int] = Field(
        3,
        description="paired seeds per setting: a count (the first positive seeds the explore stage did not "
        "train with) or the seeds themselves; 0: no confirm stage - the single-seed dev gate, 'unconfirmed'",
    )
    confidence: float = Field(0.95, gt=0, lt=1)

    @field_validator("seeds")
    @classmethod
    def _an_interval(cls, v):
        n = v if isinstance(v, int) else len(v)
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct: {v}")
        if n < 0:
            raise ValueError("a count of seeds is 0 or more")
        if n == 1:
            raise ValueError(
                "1 seed gives no interval: give 2 or more, or 0 for no confirm stage (the single-seed dev gate, "
                "reported as unconfirmed)"
            )
        return v

    @property
    def on(self) -> bool:
        return self.seeds != 0 and self.seeds != []


class SweepJobConfig(StrictModel):
    """A sweep file: the method, its base preset (+ overrides by path), and the search space."""

    method: str
    base: str | dict[str, Any] = Field(
        ...,
        description="path of the method's base config (relative to the repo "
        "root), or the whole config inline",
    )
    base_overrides: dict[str, Any] = {}
    sweep: SweepConfig = SweepConfig()
    test_every_trial: bool = Field(False, description="export + test every trial, not only the best")
    group_out: list[str] = Field(
        ["train.seed"], description="space keys averaged over in the report's groups"
    )
    confirm: ConfirmBlock = ConfirmBlock()
    candidate_margin: float = Field(
        0.0,
        ge=0,
        description="without a confirm stage (confirm.seeds: 0), the alias `candidate` moves only when the best "
        "setting's dev score beats the base model's by more than this",
    )


def trial_config(base: MethodConfig, params: dict[str, Any], source: str) -> MethodConfig:
    return with_params(base, flat_params(params), source)


def point_key(params: dict[str, Any]) -> str:
    """A sampled point's key in the configs :func:`check_space` returns (the point as Tune's trial holds it)."""
    return json.dumps(params, sort_keys=True)


def config_of(
    base: MethodConfig, configs: dict[str, MethodConfig], params: dict[str, Any], source: str
) -> MethodConfig:
    """The point's typed config: the one validated before Ray (a grid point), else ``params`` applied to ``base``
    and validated now (a value a sampler drew)."""
    return configs.get(point_key(params)) or trial_config(base, params, source)


def check_space(
    base: MethodConfig, space: dict[str, Dimension], source: str, max_points: int = 10_000
) -> dict[str, MethodConfig]:
    """Every dimension's values must give a valid method config (unknown keys fail here), and so must
    every point of the grid: values valid alone can be invalid together (λXY = λXZ = λYZ = 0).

    Returns each grid point's validated config by :func:`point_key` when every dimension is a grid (the trials
    then receive their configs typed, validated once here); empty when a dimension is sampled."""
    for key, dim in space.items():
        for value in dim.candidates():
            try:
                trial_config(base, {key: value}, source)
            except ConfigError as exc:
                raise ConfigError(
                    f"{source}: sweep.space.{key}={value!r}: {str(exc).split(': ', 1)[-1]}"
                ) from None
    grids = {k: d.grid for k, d in space.items() if d.grid is not None}
    others = {k: d.candidates()[0] for k, d in space.items() if d.grid is None}
    if math.prod(len(v) for v in grids.values()) > max_points:
        return {}
    configs = {}
    for point in itertools.product(*grids.values()):
        params = {**others, **dict(zip(grids, point, strict=True))}
        try:
            configs[point_key(params)] = trial_config(base, params, source)
        except ConfigError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in zip(grids, point, strict=True))
            raise ConfigError(f"{source}: sweep grid point {shown}: {str(exc).split(': ', 1)[-1]}") from None
    return {} if others else configs


def confirm_seeds(confirm: ConfirmBlock, explored: set[int], source: str) -> list[int]:
    """The confirm stage's seeds: a count gives the first positive seeds the explore stage did not train with; a
    list is refused where it shares one with the explore stage (a seed that selected a setting would grade it)."""
    if isinstance(confirm.seeds, list):
        if shared := sorted(set(confirm.seeds) & explored):
            raise ConfigError(
                f"{source}: confirm.seeds {shared} trained in the explore stage too; a seed that selected a "
                "setting cannot confirm it - pick seeds it did not train with"
            )
        return list(confirm.seeds)
    return list(itertools.islice((s for s in itertools.count(1) if s not in explored), confirm.seeds))


# ---------------------------------------------------------------- a compare file
class StageConfig(StrictModel):
    method: str
    config: str | dict[str, Any] = Field(
        ..., description="the method's preset file (relative to the repo root), or the whole config inline"
    )
    overrides: dict[str, Any] = Field({}, description="dotted keys set on this config")


class ArmConfig(StageConfig):
    start: StageConfig | None = Field(
        None,
        description="a stage trained first, from the same base model with the arm's seed (the compare file's "
        "common_overrides do not reach it); the arm then trains from its exported model - e.g. in-domain TSDAE "
        "before supervised training, set against the supervised arm alone",
    )


class RegisterBlock(StrictModel):
    arm: str = Field("best", description="the arm to register (`best`: the one ranked first)")
    name: str | None = Field(
        None,
        description="registered model name (default: the arm's tracking."
        "registry_model_name, else its method)",
    )
    alias: str = "candidate"


class CompareJobConfig(StrictModel):
    """A compare file: the seeds, the arms, the reference arm, the statistics and the optional registration."""

    seeds: list[int] = Field(..., min_length=1)
    arms: dict[str, ArmConfig] = Field(..., min_length=1)
    reference: str | None = Field(
        None, description="the arm every other one is set against (default: the first)"
    )
    common_overrides: dict[str, Any] = Field(
        {}, description="dotted keys set on every arm (steps, batch, eval)"
    )
    headline: str | None = Field(
        None,
        description="the test figure arms are ranked and gated on (default: the "
        "method's headline, e.g. sts_avg_spearman_all)",
    )
    budget: Literal["steps", "sentences"] = Field(
        "steps",
        description="what arms share: equal steps at one "
        "global batch, or equal training sentences (steps × global "
        "batch: batch sizes compared at equal epochs)",
    )
    confidence: float = Field(0.95, gt=0, lt=1)
    interval: Literal["t", "bootstrap"] = "t"
    max_concurrent_trials: int | None = Field(None, ge=1)
    registration: RegisterBlock | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct: {v}")
        return v
