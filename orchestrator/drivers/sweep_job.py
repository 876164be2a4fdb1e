"""The driver every ``jobs/*_sweep.py`` shares: config → corpus → Tune sweep → MLflow parent and
child runs → best trial exported, tested on STS and registered (alias ``candidate``) → report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from orchestrator import storage, tracking
from orchestrator.config import (
    REPO_ROOT,
    _read_yaml,
    apply_overrides,
    config_hash,
    load_config,
    resolve_config_path,
)
from orchestrator.errors import ConfigError


def parse_args(doc: str, default_dir: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default="smoke", help=f"configs/{default_dir}/<preset>.yaml")
    src.add_argument("--config", help="a sweep YAML file")
    ap.add_argument("--name", help="sweep name (default: <dir>-<time>); required with --resume")
    ap.add_argument("--resume", action="store_true", help="continue the sweep NAME after a crash")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: env, else embedded ./mlruns)")
    ap.add_argument("--storage", help="local path or s3:// URI for corpora, trials and checkpoints")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the base config (sweep.* for the sweep)")
    return ap.parse_args()


def main(doc: str, default_dir: str) -> int:
    from orchestrator.drivers.sweep import SweepJobConfig, check_space, method_config

    args = parse_args(doc, default_dir)
    if args.resume and not args.name:
        raise ConfigError("--resume needs --name (the sweep to continue)")
    path = args.config or resolve_config_path(args.preset, default_dir)
    sweep_over = [o for o in args.overrides if o.startswith("sweep.")]
    base_over = [o for o in args.overrides if not o.startswith("sweep.")]
    job = load_config(SweepJobConfig, path, sweep_over)
    from orchestrator.drivers.registry import get_method

    method = get_method(job.method)
    base_path = Path(job.base) if Path(job.base).is_absolute() else REPO_ROOT / job.base
    base = apply_overrides(_read_yaml(base_path), [f"{k}={json.dumps(v)}" for k, v in job.base_overrides.items()])
    if args.storage:
        base_over.append(f"run.storage={args.storage}")
    if args.tracking_uri:
        base_over.append(f"tracking.tracking_uri={args.tracking_uri}")
    base = apply_overrides(base, base_over)
    cfg0 = method_config(method, base, {}, f"{base_path} (+ overrides)")
    check_space(method, base, job.sweep.space, str(path))
    name = args.name or f"{default_dir}-{time.strftime('%Y%m%d-%H%M%S')}"

    from orchestrator.drivers.train import preflight

    exp_id = preflight(cfg0)  # tracking server, storage, model source: fail before any Ray work

    import mlflow

    from orchestrator.drivers.cluster import init_ray
    from orchestrator.drivers.report import write_sweep_report
    from orchestrator.drivers.sweep import run_sweep, trial_rows
    from orchestrator.drivers.train import Outcome, export_and_test, prepare_data

    init_ray()
    t0 = time.time()
    shards = prepare_data(method, cfg0, progress=not args.no_progress)
    parent = tracking.find_run(exp_id, {"sieve.sweep": name, "sieve.role": "sweep"}) if args.resume else None
    with mlflow.start_run(run_id=parent.info.run_id if parent else None, experiment_id=exp_id,
                          run_name=None if parent else name) as run:
        if parent is None:
            mlflow.set_tags({"sieve.sweep": name, "sieve.role": "sweep", "sieve.method": job.method})
            tracking.log_params({"base": cfg0.model_dump(mode="json"), "space": job.sweep.model_dump(mode="json"),
                                 "shards": shards, "config_hash": config_hash(cfg0)})
        grid = run_sweep(job, base, shards, name=name, storage_root=cfg0.run.storage, resume=args.resume,
                         progress=not args.no_progress)
        rows = trial_rows(grid, method.metric)
        scored = [r for r in rows if r["checkpoint_path"]]
        if not scored:
            raise ConfigError(f"sweep {name}: no trial reported a checkpoint (errors: {[r['error'] for r in rows]})")
        best = scored[0]
        best_cfg = method_config(method, base, best["params"], "best trial")
        outcome = Outcome(_checkpoint(best["checkpoint_path"]), best["best"], best["history"])
        model_dir, test = export_and_test(method, best_cfg, outcome, Path("outputs") / "models" / name)
        best["test"] = test.metrics
        if job.test_every_trial:  # e.g. mean ± std over seeds needs every trial's test score
            for r in scored[1:]:
                cfg_r = method_config(method, base, r["params"], f"trial {r['trial']}")
                _, t = export_and_test(method, cfg_r, Outcome(_checkpoint(r["checkpoint_path"]), r["best"], r["history"]),
                                       Path("outputs") / "models" / f"{name}-trials" / r["trial"])
                r["test"] = t.metrics
        _log_children(exp_id, run.info.run_id, name, rows, method.metric)
        tracking.log_metrics({**{f"best_test_{k}": v for k, v in test.metrics.items()},
                              f"best_{method.metric}": best["best_dev"]})
        info = (method.log_model or tracking.log_sentence_encoder)(model_dir, name="best_model")
        reg_name = best_cfg.tracking.registry_model_name or job.method.replace("_", "-")
        chash = config_hash(best_cfg)
        version = tracking.register(
            info.model_uri, reg_name, alias="candidate",
            description=(f"sweep {name}; best trial {best['trial']} ({json.dumps(best['params'])}); "
                         f"{method.metric_label} {best['best_dev'] * 100:.2f}; "
                         f"test {test.headline} {test.headline_value * 100:.2f}; config {chash}"),
            tags={"sweep": name, "config_hash": chash, "trial": best["trial"], "run_id": run.info.run_id,
                  method.metric: f"{best['best_dev']:.6f}",
                  "test_metric": test.headline, "test_score": f"{test.headline_value:.6f}",  # what promote compares
                  **{f"test_{k}": f"{v:.6f}" for k, v in test.metrics.items()
                     if not k.startswith("sts_") or k in ("sts_stsb_spearman_all", "sts_avg_spearman_all")}},
        )
        wall_s = time.time() - t0
        registered = {"name": reg_name, "version": version, "alias": "candidate", "run_id": run.info.run_id}
        report_dir = Path("outputs") / "reports" / name
        best_params = {"trial": best["trial"], "params": best["params"], "config": best_cfg.model_dump(mode="json")}
        write_sweep_report(report_dir, name=name, method=job.method, metric=method.metric,
                           metric_label=method.metric_label, rows=rows, group_out=job.group_out,
                           best_params=best_params, test=test, registered=registered, wall_s=wall_s)
        mlflow.log_artifacts(str(report_dir), "report")
        mlflow.log_metric("wall_s", wall_s)
    print(test.table)
    uri = tracking.resolve_tracking_uri(cfg0.tracking.tracking_uri)
    ui = (f".venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
          if uri.startswith("sqlite") else uri)
    print(json.dumps({"sweep": name, "trials": len(rows), "best_trial": best["trial"], "best_params": best["params"],
                      "best_dev": best["best_dev"], f"test_{test.headline}": test.headline_value,
                      "registered": registered, "wall_s": round(wall_s, 1), "report": str(report_dir / "summary.md"),
                      "mlflow_ui": ui}, indent=2))
    return 0


def _checkpoint(path: str):
    from ray.train import Checkpoint

    if storage.is_s3(path):
        fs, p = storage.pyarrow_filesystem(path)
        return Checkpoint(p, filesystem=fs)
    return Checkpoint(path)


def _log_children(exp_id: str, parent_id: str, name: str, rows: list[dict], metric: str) -> None:
    """One nested run per trial, created once (a resumed sweep does not duplicate them)."""
    import mlflow

    for r in rows:
        if tracking.find_run(exp_id, {"sieve.sweep": name, "sieve.trial": r["trial"]}) is not None:
            continue
        with mlflow.start_run(experiment_id=exp_id, run_name=r["trial"], nested=True, parent_run_id=parent_id):
            mlflow.set_tags({"sieve.sweep": name, "sieve.trial": r["trial"], "sieve.role": "trial",
                             "mlflow.parentRunId": parent_id})
            tracking.log_params(r["params"])
            for h in r["history"]:
                tracking.log_metrics({k: v for k, v in h.items() if k not in ("step", "epoch", "training_iteration")
                                      and isinstance(v, int | float)}, step=int(h.get("step", 0)))
            final = {"best_" + metric: r["best_dev"], "evaluations": len(r["history"]),
                     "stopped_early": float(r["stopped_early"]),
                     **{f"test_{k}": v for k, v in r.get("test", {}).items()}}
            tracking.log_metrics({k: v for k, v in final.items() if v == v})
            if r["error"]:
                mlflow.set_tag("sieve.error", r["error"])
