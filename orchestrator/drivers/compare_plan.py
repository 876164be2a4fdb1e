"""``jobs/compare.py``'s first step: the compare file read, every arm's config validated, the arms checked
comparable (one base model, equal steps and global batch - or equal sentences - one test, one storage),
preflight - before Ray."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import (
    REPO_ROOT,
    EncoderMethodConfig,
    MethodConfig,
    apply_overrides,
    read_yaml,
    resolve_config_path,
    set_path,
    validate,
)
from orchestrator.drivers.cli import location_overrides, resume_command
from orchestrator.drivers.engine import (
    keep_plan,
    kept_plan,
    plan_uri,
    refuse_another_plan,
    sweep_dir,
    take_name,
)
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import preflight, settled
from orchestrator.errors import ConfigError
from orchestrator.evaluation.encode import test_time_pooling
from orchestrator.job_files import CompareJobConfig, StageConfig
from orchestrator.models import pooling_for
from trainers.recipe import GLOBAL_BATCH, SENTENCES, STEP_BUDGET, Recipe


# ---------------------------------------------------------------- 1. resolve
@dataclass
class ComparePlan:
    name: str
    job: CompareJobConfig
    arms: dict[
        str, tuple[type[Recipe], MethodConfig]
    ]  # every arm's validated config (train.seed set per trial)
    exp_id: str
    resume: bool = False
    progress: bool = True
    verbose: bool = False
    # arm → its start stage
    starts: dict[str, tuple[type[Recipe], MethodConfig]] = field(default_factory=dict)
    rerun: str = ""  # the command that continues it: said when a trial did not finish

    @property
    def first(self) -> MethodConfig:
        return next(iter(self.arms.values()))[1]

    def method_label(self, arm: str) -> str:
        """The arm's method, after its start stage's when it has one (``tsdae → sbert``)."""
        head = f"{self.starts[arm][0].name} → " if arm in self.starts else ""
        return head + self.arms[arm][0].name

    def budget_label(self, arm: str) -> str:
        """Steps × global batch, and the start stage's before it."""

        def budget(cfg: MethodConfig) -> str:
            return f"{cfg.train.max_steps} × {cfg.train.batch_size * cfg.scaling.num_workers}"

        cfg = self.arms[arm][1]
        after = (
            f" (after {self.starts[arm][0].name} {budget(self.starts[arm][1])})" if arm in self.starts else ""
        )
        return budget(cfg) + after


def arm_config(
    job: CompareJobConfig, name: str, source: str, cli: list[str]
) -> tuple[type[Recipe], MethodConfig]:
    return stage_config(job.arms[name], job.common_overrides, f"arms.{name}", f"arm {name!r}", source, cli)


def start_config(
    job: CompareJobConfig, name: str, source: str, cli: list[str], arm: tuple[type[Recipe], MethodConfig]
) -> tuple[type[Recipe], MethodConfig]:
    """The arm's start stage, validated, and refused where the arm could not stand beside the others: it
    starts from another base model, keeps its runs in another storage, or exports no encoder the arm can load."""
    stage = job.arms[name].start
    recipe, cfg = stage_config(stage, {}, f"arms.{name}.start", f"the start of arm {name!r}", source, cli)
    what = f"{source}: arm {name!r}: start ({stage.method})"
    if recipe.base_model(cfg) != arm[0].base_model(arm[1]):
        raise ConfigError(
            f"{what} starts from {recipe.base_model(cfg)!r}, the arm from {arm[0].base_model(arm[1])!r}: "
            "a start stage trains the arm's own base model"
        )
    if cfg.run.storage != arm[1].run.storage:
        raise ConfigError(
            f"{what}: run.storage {cfg.run.storage!r} differs from the arm's {arm[1].run.storage!r}"
        )
    if recipe.model_format != "sentence-transformers":
        raise ConfigError(f"{what}: the method exports no sentence encoder folder for the arm to start from")
    return recipe, cfg


def stage_config(
    stage: StageConfig, common: dict[str, Any], key: str, label: str, source: str, cli: list[str]
) -> tuple[type[Recipe], MethodConfig]:
    recipe = get_method(stage.method)
    if isinstance(stage.config, dict):
        data, where = dict(stage.config), f"{source}: {key}.config"
    else:
        path = Path(stage.config) if Path(stage.config).is_absolute() else REPO_ROOT / stage.config
        data, where = read_yaml(path), str(path)
    data["method"] = stage.method  # one preset serves simcse and sifter_simcse
    for k, value in {**common, **stage.overrides}.items():
        set_path(data, k.split("."), value, f"{source}: {key}: {k}")
    return recipe, validate(recipe.config_cls, apply_overrides(data, cli), f"{where} ({label} of {source})")


def shared(recipe: type[Recipe], cfg: MethodConfig, budget: str) -> dict[str, object]:
    """What an arm must share with the others: the recipe's list, with ``budget: sentences`` the steps and the
    global batch as one product."""
    out = recipe.comparable(cfg)
    if budget == "sentences":
        out[SENTENCES] = out.pop(STEP_BUDGET) * out.pop(GLOBAL_BATCH)
    return out


def check_comparable(
    arms: dict[str, tuple[type[Recipe], MethodConfig]], source: str, budget: str = "steps"
) -> None:
    """Arms differ in their method and settings, never in what they are measured against: one base model,
    equal steps at one global batch (or, ``budget: sentences``, equal steps × global batch), one test, one
    storage. Each difference is refused with its arm named."""
    (first, (s0, c0)), *rest = arms.items()
    want = shared(s0, c0, budget)
    for name, (_, cfg) in arms.items():
        if cfg.train.max_steps is None:
            raise ConfigError(
                f"{source}: arm {name!r}: a comparison runs every arm for a fixed number of steps; set "
                "train.max_steps"
            )
    for name, (recipe, cfg) in rest:
        for what, value in shared(recipe, cfg, budget).items():
            if value != want[what]:
                raise ConfigError(
                    f"{source}: arm {name!r} differs from arm {first!r} in {what}: {value!r} vs "
                    f"{want[what]!r}; arms are compared on the same base, budget and test"
                )


def resolve(args: argparse.Namespace) -> ComparePlan:
    """The plan from the compare file (``--config``, else the preset) and the overrides - or, with ``--resume`` /
    ``--status``, the one the comparison kept when it started: a resume reads that, never the preset's, and
    one given another plan by name is refused."""
    reads = getattr(args, "status", False)
    if args.resume and not args.name:
        raise ConfigError("--resume needs --name (the comparison to continue)")
    if reads and not args.name:
        raise ConfigError("--status needs --name (the comparison to read)")
    path = Path(args.config or resolve_config_path(args.preset or "smoke", "compare"))
    job = validate(
        CompareJobConfig,
        apply_overrides(
            read_yaml(path), [o.removeprefix("compare.") for o in args.overrides if o.startswith("compare.")]
        ),
        str(path),
    )
    cli = [o for o in args.overrides if not o.startswith("compare.")] + location_overrides(args)
    job, arms, starts = arms_of(job, str(path), cli)
    if args.print_config:
        return ComparePlan("", inlined(job, arms, starts), arms, "")
    first = next(iter(arms.values()))[1]
    if not (args.resume or reads):  # a new comparison: checked, then its name claimed, then its plan kept
        exp_ids = {preflight(cfg) for _, cfg in [*arms.values(), *starts.values()]}
        arms, starts = settle(arms), settle(starts)
        name = take_name(args, first.run.storage, "compare", "comparison")
        # what --resume and --status read: every arm's config, settled
        kept_at = plan_uri(sweep_dir(first.run.storage, name))
        keep_plan(kept_at, inlined(job, arms, starts))
    else:
        name = take_name(args, first.run.storage, "compare", "comparison", reads=reads)
        kept_at = plan_uri(sweep_dir(first.run.storage, name))
        given = bool(args.config or args.preset or args.overrides)
        kept = kept_plan(kept_at, CompareJobConfig, f"comparison {name!r}", given)
        if kept is not None:
            kept_job, kept_arms, kept_starts = arms_of(kept, kept_at, location_overrides(args))
            if (
                args.resume and given
            ):  # both read by today's config models: a key added since is no difference
                now = inlined(job, settle(arms), settle(starts))
                was = inlined(kept_job, settle(kept_arms), settle(kept_starts))
                refuse_another_plan(was, now, f"comparison {name!r}", kept_at)
            job, arms, starts = kept_job, kept_arms, kept_starts
        exp_ids = set() if reads else {preflight(cfg) for _, cfg in [*arms.values(), *starts.values()]}
        arms, starts = settle(arms), settle(starts)
    return ComparePlan(
        name,
        job,
        arms,
        min(exp_ids, default=""),
        args.resume,
        not args.no_progress,
        args.verbose,
        starts,
        resume_command(name),
    )


def settle(stages: dict) -> dict:
    """Each stage's config with its pooling resolved (:func:`settled`)."""
    return {n: (recipe, settled(cfg)) for n, (recipe, cfg) in stages.items()}


def arms_of(job: CompareJobConfig, source: str, cli: list[str]):
    """The compare file's arms and start stages, validated and checked comparable: (job, arms, starts)."""
    arms = {name: arm_config(job, name, source, cli) for name in job.arms}
    starts = {
        name: start_config(job, name, source, cli, arms[name]) for name, a in job.arms.items() if a.start
    }
    reference = job.reference or next(iter(job.arms))
    if reference not in arms:
        raise ConfigError(f"{source}: reference {reference!r} is not one of the arms ({', '.join(arms)})")
    if job.registration is not None and job.registration.arm not in ("best", *arms):
        raise ConfigError(
            f"{source}: registration.arm {job.registration.arm!r}: expected best or one of {', '.join(arms)}"
        )
    job = job.model_copy(update={"reference": reference})
    check_comparable(arms, source, job.budget)
    return job, arms, starts


def inlined(job: CompareJobConfig, arms: dict, starts: dict) -> CompareJobConfig:
    """The plan with every arm's (and start stage's) whole config inline: what ``--print-config`` prints and
    what a comparison keeps for its resume."""

    def inline(stage: StageConfig, cfg: MethodConfig) -> StageConfig:
        return stage.model_copy(update={"config": cfg.model_dump(mode="json"), "overrides": {}})

    arms_inline = {
        n: inline(a, arms[n][1]).model_copy(
            update={"start": inline(a.start, starts[n][1]) if a.start else None}
        )
        for n, a in job.arms.items()
    }
    return job.model_copy(update={"arms": arms_inline, "common_overrides": {}})


def seeded(cfg: MethodConfig, seed: int) -> MethodConfig:
    """An arm's config for one of the compare file's seeds: a typed copy (the seed was validated with the file,
    the arm's config with its arm), nothing validated again."""
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"seed": seed})})


def test_pooling(cfg: MethodConfig) -> str:
    return test_time_pooling(pooling_for(cfg)) if isinstance(cfg, EncoderMethodConfig) else "-"
