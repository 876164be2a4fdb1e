"""Train one method on Ray Train, export the best checkpoint, run its test evaluation,
and track everything in MLflow.

    python jobs/train.py --method sifter_simcse --preset smoke [key=value ...]
    python jobs/train.py --method simcse --config my.yaml --tracking-uri http://mlflow:5000
"""

from __future__ import annotations

import argparse
import json
import time

import _bootstrap


def main() -> int:
    from orchestrator import storage
    from orchestrator.config import config_hash, load_config, resolve_config_path
    from orchestrator.drivers import publish
    from orchestrator.drivers.cluster import init_ray
    from orchestrator.drivers.registry import get_method, method_names
    from orchestrator.drivers.train import build_trainer, export_and_test, fit, preflight, prepare_data

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", required=True, help=f"one of: {', '.join(method_names())}")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default="smoke", help="configs/<method>/<preset>.yaml")
    src.add_argument("--config", help="a YAML config file")
    ap.add_argument("--name", help="run name (default: <method>-<time>)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: env, else embedded ./mlruns)")
    ap.add_argument("--storage", help="local path or s3:// URI for corpora, checkpoints and exports")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = ap.parse_args()

    method = get_method(args.method)
    path = args.config or resolve_config_path(args.preset, args.method)
    overrides = [*args.overrides, *([f"run.storage={args.storage}"] if args.storage else [])]
    if args.tracking_uri:
        overrides.append(f"tracking.tracking_uri={args.tracking_uri}")
    cfg = load_config(method.config_cls, path, overrides)
    if getattr(cfg, "method", args.method) != args.method:
        cfg.method = args.method
    name = args.name or cfg.run.name or f"{args.method}-{time.strftime('%Y%m%d-%H%M%S')}"

    preflight(cfg)  # tracking server, storage, model source: fail before any Ray work

    init_ray()
    t0 = time.time()
    shards = prepare_data(method, cfg, progress=not args.no_progress)
    trainer = build_trainer(method, cfg, shards, name=name)
    outcome = fit(trainer, method)
    model_dir, test = export_and_test(method, cfg, outcome, f"outputs/models/{name}")
    if storage.is_s3(cfg.run.storage):
        storage.put_dir(model_dir, storage.join(cfg.run.storage, "models", name))
    wall_s = time.time() - t0

    # The run is logged after training from one record; if the tracking server went away meanwhile,
    # the record waits in outputs/tracking-pending/ for `jobs/sync_tracking.py` (nothing is lost).
    record = publish.run_record(
        experiment=cfg.tracking.experiment, run_name=name, method=args.method,
        params={**cfg.model_dump(mode="json"), "config_hash": config_hash(cfg), "shards": shards},
        history=outcome.history,
        metrics={**{f"test_{k}": v for k, v in test.metrics.items()}, "wall_s": wall_s,
                 f"best_{method.metric}": outcome.best_metrics.get(method.metric, float("nan"))},
        texts={"test.md": f"# {test.title}\n\n{test.table}\n"}, model_dir=str(model_dir))
    run_id = publish.log_or_defer(record, cfg.tracking.tracking_uri)
    print(test.table)
    print(json.dumps({"run_id": run_id or "pending (tracking server unreachable)", "model_dir": str(model_dir), "wall_s": round(wall_s, 1),
                      "best_dev": outcome.best_metrics.get(method.metric)}, indent=2))
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
