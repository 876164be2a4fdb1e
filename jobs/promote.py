"""Move the ``champion`` alias of a registered model to a version (the MLflow UI can do the same).

    python jobs/promote.py --model sifter-simcse --version 3 [--force] [--tracking-uri URI]
    python jobs/promote.py --model sifter-simcse --from-alias candidate      # what the last sweep proposed

Refuses a version without the ``--metric`` tag (or one that is not a number), an empty flag, an alias MLflow would
refuse (``latest`` and ``vN`` are reserved), a version or alias that does not exist; and, unless ``--force``, a
version registered with ``beats_base=false`` (it did not beat the untouched base in its own run - also as a first
champion) and a version whose test score (tag ``test_score``: the method's headline test metric, set at
registration) is below the champion's. Where ``@champion`` already points at the version but was moved there
outside Sieve (the MLflow UI's alias editor), the version is weighed against the one Sieve last promoted instead of
being approved. The alias move is one registry call, so a
reader sees either the old or the new champion, never neither.
"""

from __future__ import annotations

import argparse

import _bootstrap
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import _validate_model_alias_name, _validate_model_alias_name_reserved

from orchestrator import tracking
from orchestrator.drivers.cli import HelpFormatter
from orchestrator.errors import ConfigError, TrackingError
from orchestrator.models import CHAMPION_TAG


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", required=True, help="registered model name, e.g. sifter-simcse")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--version", type=int, help="the version to promote")
    src.add_argument("--from-alias", help="promote the version this alias points at (e.g. candidate)")
    ap.add_argument("--alias", default="champion", help="the alias to move")
    ap.add_argument(
        "--metric",
        default="test_score",
        help="the version tag compared "
        "with the current alias holder's (higher is better; set at registration)",
    )
    ap.add_argument(
        "--force", action="store_true", help="promote even when it scores below the current holder"
    )
    ap.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: env MLFLOW_TRACKING_URI, else ./mlruns)"
    )
    args = ap.parse_args()

    check_flags(args)
    tracking.setup(args.tracking_uri, "sieve")
    if args.from_alias:
        args.version = tracking.alias_version(args.model, args.from_alias)
        if args.version is None:
            raise TrackingError(f"model {args.model!r} has no alias {args.from_alias!r}")
    try:
        MlflowClient().get_model_version(args.model, str(args.version))
    except MlflowException:
        raise TrackingError(f"model {args.model!r} has no version {args.version}") from None
    new = numeric_metric(args.model, args.version, args.metric)
    if new is None:  # nothing to compare: never promote on a score that is not there
        have = sorted(MlflowClient().get_model_version(args.model, str(args.version)).tags)
        raise ConfigError(
            f"--metric {args.metric!r}: {args.model} v{args.version} has no such tag (its tags: "
            f"{', '.join(have) or 'none'})"
        )
    tags = MlflowClient().get_model_version(args.model, str(args.version)).tags
    if tags.get("beats_base") == "false" and not args.force:  # the job that registered it measured the base
        raise TrackingError(
            f"refusing to promote {args.model} v{args.version}: it was registered with beats_base=false (it did "
            "not beat the untouched base model in its own run); pass --force to do it anyway"
        )
    current = tracking.alias_version(args.model, args.alias)
    sanctioned = sieve_champion(args.model) if args.alias == "champion" else current
    if current == args.version and sanctioned in (None, args.version):
        print(f"{args.model}@{args.alias} is already version {args.version}")
        if args.alias == "champion" and sanctioned is None:  # moved here outside Sieve, no earlier promotion
            MlflowClient().set_registered_model_tag(args.model, CHAMPION_TAG, str(args.version))
        return 0
    held = sanctioned if current == args.version else current  # what it is weighed against
    if held is not None and not args.force:
        old = numeric_metric(args.model, held, args.metric)
        if old is not None and new < old:
            moved = (
                f" (@{args.alias} was moved to v{args.version} outside Sieve; v{held} is the last it promoted)"
                if held != current
                else ""
            )
            raise TrackingError(
                f"refusing to promote {args.model} v{args.version} ({args.metric}={new}) over "
                f"@{args.alias} v{held} ({args.metric}={old}){moved}; pass --force to do it anyway"
            )
    tracking.set_alias(args.model, args.alias, args.version)
    if args.alias == "champion":  # what a job reading @champion later compares a hand-moved alias with
        MlflowClient().set_registered_model_tag(args.model, CHAMPION_TAG, str(args.version))
    print(f"{args.model}@{args.alias}: v{held} -> v{args.version} ({args.metric}={new})")
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """Every flag refused before any registry call: an empty one, an alias MLflow would refuse."""
    for flag in (
        "model",
        "alias",
        "from_alias",
        "metric",
    ):  # an empty flag would reach MLflow as its exception
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise ConfigError(f"--{flag.replace('_', '-')} is empty")
    for flag, value in (("--alias", args.alias), ("--from-alias", args.from_alias)):
        try:  # MLflow's own alias rules, before any call: letters, digits, _ and -; latest and vN reserved
            if value is not None:
                _validate_model_alias_name(value)
                _validate_model_alias_name_reserved(value)
        except MlflowException as exc:
            raise ConfigError(f"{flag} {value!r}: {exc.message}") from None


def sieve_champion(model: str) -> int | None:
    """The version Sieve last promoted to ``@champion`` (the registered model's tag), None when it never did."""
    tag = MlflowClient().get_registered_model(model).tags.get(CHAMPION_TAG)
    return int(tag) if tag and tag.isdigit() else None


def numeric_metric(model: str, version: int, metric: str) -> float | None:
    """The version's ``metric`` tag as a number (None when it has none); a tag that is not a number is refused."""
    try:
        return tracking.version_metric(model, version, metric)
    except ValueError:
        value = MlflowClient().get_model_version(model, str(version)).tags[metric]
        raise ConfigError(
            f"--metric {metric!r}: {model} v{version}'s tag is {value!r}, not a number"
        ) from None


if __name__ == "__main__":
    _bootstrap.run(main)
