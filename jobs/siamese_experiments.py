"""Siamese adaptation experiments: ORIG / NAIVE / SIAMESE per experiment and one ALL model, on Ray
Train, evaluated by Δ cosine distance, tracked in MLflow, SIAMESE and ALL registered
(``siamese-<experiment>@candidate``, ``siamese-all@candidate``), results table + bar chart.

    python jobs/siamese_experiments.py                     # smoke preset, embedded MLflow, local Ray
    python jobs/siamese_experiments.py --preset paper --tracking-uri http://mlflow:5000
    python jobs/siamese_experiments.py base.train.max_steps=20 models='[orig, siamese]'
"""

from __future__ import annotations

import argparse
import json
import time

import _bootstrap


def main() -> int:
    from orchestrator.config import load_config, resolve_config_path
    from orchestrator.drivers.experiments import ExperimentsConfig, run_experiments

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default="smoke", help="configs/siamese_experiments/<preset>.yaml")
    src.add_argument("--config", help="an experiments YAML file")
    ap.add_argument("--name", help="run name (default: siamese-<time>)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: env, else embedded ./mlruns)")
    ap.add_argument("--storage", help="local path or s3:// URI for episodes and checkpoints")
    ap.add_argument("overrides", nargs="*", help="key=value overrides (base.* for the shared run settings)")
    args = ap.parse_args()
    overrides = list(args.overrides)
    if args.storage:
        overrides.append(f"base.run.storage={args.storage}")
    if args.tracking_uri:
        overrides.append(f"base.tracking.tracking_uri={args.tracking_uri}")
    cfg = load_config(ExperimentsConfig, args.config or resolve_config_path(args.preset, "siamese_experiments"),
                      overrides)
    for exp in cfg.experiments:  # every run's config validates before anything starts
        for mode in ("naive", "siamese"):
            cfg.run_config(exp, mode)
    cfg.run_config(None, "all")
    out = run_experiments(cfg, args.name or f"siamese-{time.strftime('%Y%m%d-%H%M%S')}")
    print(open(out["report"]).read())
    print(json.dumps({k: v for k, v in out.items() if k != "results"}, indent=2))
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
