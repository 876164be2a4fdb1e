"""The flags every job shares, so that they mean the same thing everywhere.

--preset NAME | --config FILE   the YAML to run (configs/<dir>/<preset>.yaml by default)
--name NAME                     run / sweep name
--tracking-uri URI              MLflow (default: MLFLOW_TRACKING_URI, else the embedded ./mlruns)
--storage DIR|s3://...          corpora, checkpoints, sweeps ($SIEVE_STORAGE/runs when set)
--no-progress                   no progress bars
--verbose                       Ray's worker logs and Tune's status table too (quiet by default)
--print-config                  print the resolved, validated config as YAML and exit; fed back
                                with --config it runs the same job
key.sub=value ...               overrides of any config key (YAML values)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import yaml
from pydantic import BaseModel

from orchestrator.config import DEFAULT_PRESET, storage_root


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and every flag's default in ``--help`` (every job uses it) - where it has
    one: no "(default: None)" beside a help that says what happens without the flag, nor on switches."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def job_parser(doc: str, preset_dir: str | None, resumes: str | None = None) -> argparse.ArgumentParser:
    """The shared flags; ``resumes`` (what the job runs: "sweep", "comparison") adds ``--resume``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)
    if resumes:
        ap.add_argument(
            "--resume", action="store_true", help=f"continue the {resumes} NAME after a crash (needs --name)"
        )
    src = ap.add_mutually_exclusive_group()
    src.add_argument(  # None when not given: a --resume then reads the plan its run kept, not the preset's
        "--preset", help=f"configs/{preset_dir or '<method>'}/<preset>.yaml (default: {DEFAULT_PRESET})"
    )
    src.add_argument("--config", help="a YAML config file (e.g. one written by --print-config)")
    ap.add_argument("--name", help="run name (default: <kind>-<time>)")
    ap.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: env MLFLOW_TRACKING_URI, else ./mlruns)"
    )
    ap.add_argument(
        "--storage",
        help="local path or s3:// URI for corpora, checkpoints and sweeps "
        "(default: $SIEVE_STORAGE/runs when SIEVE_STORAGE is set, else the config's run.storage)",
    )
    ap.add_argument(
        "--take-over",
        action="store_true",
        help="run under a --name whose claim a job that no longer runs left behind (killed, its machine lost)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    ap.add_argument("--verbose", action="store_true", help="Ray's worker logs and Tune's status table too")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    return ap


def resume_command(name: str) -> str:
    """The command that continues this job where it stopped: as it was started (its flags, its overrides), under
    its name, with ``--resume``."""
    args = [a for a in sys.argv[1:] if a not in ("--resume", "--take-over")]
    if "--name" not in args and not any(a.startswith("--name=") for a in args):
        args += ["--name", name]
    script = (
        os.path.relpath(sys.argv[0]) if not os.path.relpath(sys.argv[0]).startswith("..") else sys.argv[0]
    )
    return shlex.join(["python", script, *args, "--resume"])


def location_overrides(args: argparse.Namespace, prefix: str = "") -> list[str]:
    """--storage / --tracking-uri as overrides of the config's ``run.storage`` / ``tracking.tracking_uri``.
    Without --storage, ``$SIEVE_STORAGE/runs`` when SIEVE_STORAGE is set (a cluster from infra/: one
    bucket, runs under its runs/ prefix), whatever the preset says."""
    out = []
    storage = args.storage or (f"{root}/runs" if (root := storage_root()) else None)
    if storage:
        out.append(f"{prefix}run.storage={storage}")
    if args.tracking_uri:
        out.append(f"{prefix}tracking.tracking_uri={args.tracking_uri}")
    return out


def print_config(cfg: BaseModel | dict) -> int:
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    return 0
