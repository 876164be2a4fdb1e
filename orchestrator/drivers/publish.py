"""Runs that survive a tracking outage: a finished run is logged from one plain-JSON record; when
the tracking server is unreachable the record is kept and ``jobs/sync_tracking.py`` logs it later."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlflow

from orchestrator.drivers.registry import get_method
from orchestrator.errors import TrackingError
from orchestrator.tracking import clean_params, log_metrics, log_sentence_encoder, resolve_tracking_uri, setup

PENDING_DIR = Path("outputs") / "tracking-pending"


def run_record(*, experiment: str, run_name: str, method: str, params: dict, history: list[dict],
               metrics: dict[str, float], texts: dict[str, str] | None = None, model_dir: str | None = None,
               tags: dict[str, str] | None = None) -> dict:
    """Everything a finished training run logs, as plain JSON (params already redacted)."""
    steps = [{"step": int(h.get("step", 0)),
              "metrics": {k: float(v) for k, v in h.items() if k not in ("step", "epoch") and isinstance(v, int | float)}}
             for h in history]
    return {"experiment": experiment, "run_name": run_name, "method": method, "params": clean_params(params),
            "history": steps, "metrics": {k: float(v) for k, v in metrics.items()}, "texts": texts or {},
            "model_dir": str(Path(model_dir).resolve()) if model_dir else None, "tags": tags or {}}


def replay(record: dict, tracking_uri: str | None = None) -> str:
    """Create the MLflow run of ``record`` (params, every step's metrics, texts, the model); returns its id.
    Raises :class:`TrackingError` naming the URI when the server is not there."""
    uri = resolve_tracking_uri(tracking_uri)
    exp_id = setup(uri, record["experiment"])
    try:
        with mlflow.start_run(experiment_id=exp_id, run_name=record["run_name"]) as run:
            mlflow.set_tags({"sieve.method": record["method"], **record["tags"]})
            mlflow.log_params(record["params"])
            for row in record["history"]:
                log_metrics(row["metrics"], step=row["step"])
            log_metrics(record["metrics"])
            for name, text in record["texts"].items():
                mlflow.log_text(text, name)
            if record["model_dir"]:
                (get_method(record["method"]).log_model or log_sentence_encoder)(record["model_dir"], name="model")
            return run.info.run_id
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - any client error here means the server went away
        raise TrackingError(f"MLflow tracking server {uri}: logging run {record['run_name']!r} failed "
                            f"({str(exc).splitlines()[0][:200]})") from None


def log_or_defer(record: dict, tracking_uri: str | None = None, pending_dir: str | Path = PENDING_DIR) -> str | None:
    """Log ``record`` now; if the tracking server is unreachable, keep it in ``pending_dir`` (written
    atomically) and say so once - ``jobs/sync_tracking.py`` logs it when the server is back."""
    try:
        return replay(record, tracking_uri)
    except TrackingError as exc:
        pending = Path(pending_dir)
        pending.mkdir(parents=True, exist_ok=True)
        path = pending / f"{record['run_name']}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)
        print(f"warning: {exc}; the run's params, metrics and model are kept in {path} - "
              f"log them later with: python jobs/sync_tracking.py", file=sys.stderr)
        return None


def sync_pending(tracking_uri: str | None = None, pending_dir: str | Path = PENDING_DIR) -> list[tuple[str, str]]:
    """Log every pending record (oldest first); a logged record's file is removed. Returns (file, run id)."""
    done = []
    for path in sorted(Path(pending_dir).glob("*.json"), key=lambda p: p.stat().st_mtime):
        run_id = replay(json.loads(path.read_text()), tracking_uri)
        path.unlink()
        done.append((str(path), run_id))
    return done
