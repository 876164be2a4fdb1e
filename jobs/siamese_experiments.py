"""Siamese adaptation experiments: ORIG / NAIVE / SIAMESE per experiment and one ALL model, on Ray
Train, evaluated by Δ cosine distance, tracked in MLflow, SIAMESE and ALL registered
(``siamese-<experiment>@candidate``, ``siamese-all@candidate``), results table + bar chart.

    python jobs/siamese_experiments.py                     # smoke preset, embedded MLflow, local Ray
    python jobs/siamese_experiments.py --preset paper --tracking-uri http://mlflow:5000
    python jobs/siamese_experiments.py base.train.max_steps=20 models='[orig, siamese]'
    python jobs/siamese_experiments.py --name NAME --resume   # after a crash or a tracking outage: trains
                                                              # only what did not finish, publishes once
"""

from __future__ import annotations

import json
import time

import _bootstrap

from orchestrator import storage
from orchestrator.config import load_config, resolve_config_path
from orchestrator.drivers.cli import job_parser, location_overrides, print_config
from orchestrator.drivers.cluster import shutdown_ray
from orchestrator.drivers.experiments import run_experiments
from orchestrator.drivers.experiments_config import ExperimentsConfig
from orchestrator.errors import ConfigError


def main() -> int:
    ap = job_parser(__doc__, "siamese_experiments")
    ap.add_argument("--resume", action="store_true", help="continue the experiments NAME (needs --name)")
    args = ap.parse_args()
    if args.resume and not args.name:
        raise ConfigError("--resume needs --name (the experiments to continue)")
    overrides = [*args.overrides, *location_overrides(args, prefix="base.")]
    cfg = load_config(
        ExperimentsConfig, args.config or resolve_config_path(args.preset, "siamese_experiments"), overrides
    )
    if args.print_config:
        return print_config(cfg)
    for exp in cfg.experiments:  # every run's config validates before anything starts
        for mode in ("naive", "siamese"):
            cfg.run_config(exp, mode)
    cfg.run_config(None, "all")
    name = storage.safe_name(args.name or f"siamese-{time.strftime('%Y%m%d-%H%M%S')}", "--name")
    out = run_experiments(cfg, name, verbose=args.verbose, resume=args.resume)
    shutdown_ray()
    print(open(out["report"]).read())
    print(json.dumps({k: v for k, v in out.items() if k not in ("results", "gates")}, indent=2))
    print("\n".join(out["gates"]))
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
