"""What a finished job hands the user, and the rule it follows: the best setting is chosen, set
against the untouched base model measured in the same run, and registered - the alias ``candidate``
moves only when it beats the base on the dev metric.

* :func:`choose` - best setting (trials grouped over seeds, full-budget trials first) vs the base;
* :func:`register` - log the model, register a version (tags: both scores, ``beats_base``), move
  ``candidate`` only when it beats the base;
* :func:`log_trials` - one nested MLflow run per trial;
* pending records (:func:`run_record`, :func:`log_or_defer`, :func:`sync_pending`): a finished run
  survives a tracking outage - the record is kept and ``jobs/sync_tracking.py`` logs it later.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np

from orchestrator.drivers.registry import get_method
from orchestrator.errors import TrackingError
from orchestrator.spec import BaseResult
from orchestrator.tracking import (
    clean_params,
    find_run,
    log_metrics,
    log_params,
    log_sentence_encoder,
    resolve_tracking_uri,
    setup,
)
from orchestrator.tracking import register as register_version


# ---------------------------------------------------------------- the best setting against the base
def setting_of(params: dict, group_out: list[str]) -> str:
    return json.dumps({k: v for k, v in params.items() if k not in group_out}, sort_keys=True, default=str)


def is_baseline(params: dict, baseline_params: dict) -> bool:
    return bool(baseline_params) and all(params.get(k) == v for k, v in baseline_params.items())


@dataclass
class Choice:
    best: dict  # the trial row to export and register (the best seed of the best setting)
    best_dev: float  # the best setting's dev score: mean over its seeds (its trial's own with one seed)
    base_dev: float | None  # the base's dev score (None: no base to compare with)
    base_label: str
    margin: float

    @property
    def beats_base(self) -> bool:
        return self.base_dev is None or self.best_dev > self.base_dev + self.margin


def choose(rows: list[dict], *, group_out: list[str], base: BaseResult | None, baseline_params: dict,
           margin: float = 0.0) -> Choice:
    """The best setting by mean dev score over its seeds; trials that ran the whole budget are
    preferred to ones ASHA stopped (never set a stopped trial against a full one). The base is the
    untouched model (``base``) or, for a method whose baseline is a point of its grid (SIFTER-LSTM's
    plain LSTM), the mean over that point's seeds."""
    scored = [r for r in rows if r["checkpoint_path"] and r["best_dev"] == r["best_dev"]]
    full = [r for r in scored if not r["stopped_early"]] or scored
    candidates = [r for r in full if not is_baseline(r["params"], baseline_params)] or full
    groups: dict[str, list[dict]] = {}
    for r in candidates:
        groups.setdefault(setting_of(r["params"], group_out), []).append(r)
    best_group = max(groups.values(), key=lambda g: np.mean([r["best_dev"] for r in g]))
    best = max(best_group, key=lambda r: r["best_dev"])
    best_dev = float(np.mean([r["best_dev"] for r in best_group]))
    if base is not None:
        return Choice(best, best_dev, base.dev, base.label, margin)
    baseline = [r for r in scored if is_baseline(r["params"], baseline_params)]
    base_dev = float(np.mean([r["best_dev"] for r in baseline])) if baseline else None
    label = f"baseline {json.dumps(baseline_params)} (mean of {len(baseline)} trials)" if baseline else "none"
    return Choice(best, best_dev, base_dev, label, margin)


def gate_line(choice: Choice, metric_label: str, registered: dict) -> str:
    """The job's last line: what became candidate, or that nothing beat the base."""
    ref = f"{registered['name']} v{registered['version']}"
    if choice.base_dev is None:
        return f"candidate: {ref} (no base model to compare with)"
    scores = f"{metric_label} {choice.best_dev * 100:.2f} vs {choice.base_dev * 100:.2f} for the {choice.base_label}"
    if choice.beats_base:
        return f"candidate: {ref} beats the base model ({scores})"
    return (f"the sweep found nothing better than the base model ({scores}, margin {choice.margin * 100:.2f}): "
            f"{ref} is registered with beats_base=false and does not become candidate")


def register(model_uri: str, name: str, choice: Choice, *, description: str, tags: dict[str, str]) -> dict:
    """Register a version with both scores in its tags; ``candidate`` moves only when it beats the base."""
    tags = {**tags, "beats_base": str(choice.beats_base).lower(), "dev_score": f"{choice.best_dev:.6f}",
            **({"base_dev_score": f"{choice.base_dev:.6f}"} if choice.base_dev is not None else {})}
    alias = "candidate" if choice.beats_base else None
    version = register_version(model_uri, name, alias=alias, description=description, tags=tags)
    return {"name": name, "version": version, "alias": alias, "beats_base": choice.beats_base}


def log_trials(exp_id: str, parent_id: str, name: str, rows: list[dict], metric: str) -> None:
    """One nested run per trial, created once (a resumed sweep does not duplicate them)."""
    for r in rows:
        if find_run(exp_id, {"sieve.sweep": name, "sieve.trial": r["trial"]}) is not None:
            continue
        with mlflow.start_run(experiment_id=exp_id, run_name=r["trial"], nested=True, parent_run_id=parent_id):
            mlflow.set_tags({"sieve.sweep": name, "sieve.trial": r["trial"], "sieve.role": "trial",
                             "mlflow.parentRunId": parent_id})
            log_params(r["params"])
            for h in r["history"]:
                log_metrics({k: v for k, v in h.items() if k not in ("step", "epoch", "training_iteration")
                             and isinstance(v, int | float)}, step=int(h.get("step", 0)))
            final = {"best_" + metric: r["best_dev"], "evaluations": len(r["history"]),
                     "stopped_early": float(r["stopped_early"]),
                     **{f"test_{k}": v for k, v in r.get("test", {}).items()}}
            log_metrics({k: v for k, v in final.items() if v == v and not math.isinf(v)})
            if r["error"]:
                mlflow.set_tag("sieve.error", r["error"])


# ---------------------------------------------------------------- runs that survive a tracking outage

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
