"""The tracking outbox: a finished run survives a tracking outage. Its record (params, metric history, texts,
the exported model's folder) is logged at once when the server answers, kept under the run storage's
``tracking-pending/`` when it does not (``jobs/sync_tracking.py`` logs it later, idempotently), and set aside in
``tracking-pending/rejected/`` when the server refuses it - retrying a refusal would be refused again.

* :func:`run_record` - the record; :func:`replay` - log it (into the run the job made, or one made now);
* :func:`log_or_defer` - log now or keep; :func:`sync_pending` - log what was kept; :func:`outage` - the one
  line a job ends with when the server went away while it published.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from orchestrator import storage
from orchestrator.errors import ConfigError, DataError, ModelSourceError, TrackingError, TrackingRejected
from orchestrator.models import resolve_model_source
from orchestrator.tracking import (
    clean_params,
    find_run,
    is_outage,
    is_unreachable,
    log_metrics,
    log_sentence_encoder,
    logged_models,
    resolve_tracking_uri,
    setup,
)

REJECTED = "rejected"  # beside the pending records: refused ones, kept for a person, never retried


def pending_dir(storage_root: str) -> str:
    """Where records wait for the tracking server: in the run storage (an s3:// prefix on a cluster, so a
    record outlives the job's working directory)."""
    return storage.join(storage_root, "tracking-pending")


def run_record(
    *,
    experiment: str,
    run_name: str,
    method: str,
    params: dict,
    history: list[dict],
    metrics: dict[str, float],
    texts: dict[str, str] | None = None,
    model_dir: str | None = None,
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    model_format: str = "sentence-transformers",
) -> dict:
    """Everything a finished training run logs, as plain JSON (params already redacted). ``run_id``: the
    run the job made when it started (replays go into it); ``record_id`` keys the record either way."""
    steps = [
        {
            "step": int(h.get("step", 0)),
            "metrics": {
                k: float(v) for k, v in h.items() if k not in ("step", "epoch") and isinstance(v, int | float)
            },
        }
        for h in history
    ]
    model = (
        (model_dir if storage.is_s3(str(model_dir)) else str(Path(model_dir).resolve()))
        if model_dir
        else None
    )
    return {
        "record_id": run_id or uuid.uuid4().hex,
        "run_id": run_id,
        "experiment": experiment,
        "run_name": run_name,
        "method": method,
        "params": clean_params(params),
        "history": steps,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "texts": texts or {},
        "model_dir": model,
        "model_format": model_format,
        "tags": tags or {},
    }


# A method's own model format (not a sentence-transformers folder) is logged by its recipe: ``(method, folder)``
# → the recipe's ``log_model``. The drivers pass it in; the library never imports a recipe.
ModelLogger = Callable[[str, str], object]


def replay(record: dict, tracking_uri: str | None = None, log_model: ModelLogger | None = None) -> str:
    """Log ``record`` into its run - the one the job made at its start, or one made now and tagged with the
    record's id - and return the run id. Idempotent: replaying a record again adds nothing (params and
    model once, metric history only where it is missing). Raises :class:`TrackingError` naming the URI
    when the server is not there (or answers 5xx, or refuses the credential: worth retrying), and
    :class:`TrackingRejected` when the record itself is refused (retrying it would be refused again)."""
    uri = resolve_tracking_uri(tracking_uri)
    exp_id = setup(uri, record["experiment"])
    client = MlflowClient()
    try:
        run = (
            client.get_run(record["run_id"])
            if record.get("run_id")
            else find_run(exp_id, {"sieve.record": record["record_id"]})
        )
        with mlflow.start_run(
            run_id=run.info.run_id if run else None,
            experiment_id=exp_id,
            run_name=None if run else record["run_name"],
        ) as active:
            run_id = active.info.run_id
            mlflow.set_tags(
                {"sieve.method": record["method"], "sieve.record": record["record_id"], **record["tags"]}
            )
            have = client.get_run(run_id).data
            missing = {k: v for k, v in record["params"].items() if k not in have.params}
            if missing:
                mlflow.log_params(missing)
            logged = {
                (m.key, m.step)
                for key in {k for row in record["history"] for k in row["metrics"]}
                for m in client.get_metric_history(run_id, key)
            }
            for row in record["history"]:
                log_metrics(
                    {k: v for k, v in row["metrics"].items() if (k, row["step"]) not in logged},
                    step=row["step"],
                )
            log_metrics({k: v for k, v in record["metrics"].items() if k not in have.metrics})
            for name, text in record["texts"].items():
                mlflow.log_text(text, name)
            if record["model_dir"] and not logged_models(run_id, "model"):
                fmt = record.get("model_format", "sentence-transformers")
                if fmt == "sentence-transformers":  # a transformers encoder folder, checked as one
                    log_sentence_encoder(str(resolve_model_source(record["model_dir"])), name="model")
                elif log_model is None:
                    raise ConfigError(
                        f"run {record['run_name']!r}: its {fmt} model needs its method's logger"
                    )
                else:  # the method's own format (SIFTER-LSTM's folder has no config.json): fetched, not checked
                    with _fetched(record["model_dir"]) as folder:
                        log_model(record["method"], str(folder))
            return run_id
    except TrackingError:
        raise
    except (ModelSourceError, ConfigError, DataError):  # the record's own defect (a model folder that is not
        raise  # one): not an outage to retry for ever from tracking-pending/; storage failures still wait there
    except Exception as exc:  # noqa: BLE001 - sorted below: an outage waits, a refusal does not
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        if is_outage(exc):
            raise TrackingError(
                f"MLflow tracking server {uri}: logging run {record['run_name']!r} failed ({first})"
            ) from None
        raise TrackingRejected(
            f"MLflow tracking server {uri}: run {record['run_name']!r} was refused "
            f"({type(exc).__name__}: {first})"
        ) from None


@contextmanager
def _fetched(model_dir: str) -> Iterator[Path]:
    """An exported model's folder on this machine: a local one as it is, an s3:// one copied here (and
    removed once used)."""
    if not storage.is_s3(model_dir):
        yield Path(model_dir)
        return
    with tempfile.TemporaryDirectory(prefix="sieve-model-") as tmp:
        yield storage.get_dir(model_dir, Path(tmp) / "model", require_complete=True)


def log_or_defer(
    record: dict, tracking_uri: str | None, pending: str, log_model: ModelLogger | None = None
) -> str | None:
    """Log ``record`` now; if the tracking server is unreachable, keep it in ``pending`` (one file per run
    attempt, written atomically) and say so once - ``jobs/sync_tracking.py`` logs it when the server is back.
    A record the server refuses is kept in ``pending/rejected/`` (which the sync does not retry) and the
    job fails with one line naming it: parked as an outage, it would be refused at every sync."""
    name = f"{record['run_name']}-{record['record_id']}.json"
    try:
        return replay(record, tracking_uri, log_model)
    except TrackingError as exc:
        path = storage.join(pending, name)
        storage.write_bytes(path, json.dumps(record, indent=2).encode())
        print(
            f"warning: {exc}; the run's params, metrics and model are kept in {path} - "
            f"log them later with: python jobs/sync_tracking.py --pending {pending}",
            file=sys.stderr,
        )
        return None
    except TrackingRejected as exc:
        path = storage.join(pending, REJECTED, name)
        storage.write_bytes(path, json.dumps(record, indent=2).encode())
        raise TrackingRejected(
            f"{exc}; the run's params, metrics and model are kept in {path}, which "
            "jobs/sync_tracking.py does not retry"
        ) from None


RECORD_SHAPE = {
    "record_id": str,
    "experiment": str,
    "run_name": str,
    "method": str,
    "params": dict,
    "history": list,
    "metrics": dict,
    "texts": dict,
    "tags": dict,
}


def check_record(record) -> None:
    """A pending record as :func:`run_record` writes it, or ValueError naming what is wrong (before any MLflow
    call: a malformed record never leaves a half-logged run)."""
    if not isinstance(record, dict):
        raise ValueError(f"a JSON object expected, not {type(record).__name__}")
    wrong = [k for k, t in RECORD_SHAPE.items() if not isinstance(record.get(k), t)]
    if wrong:
        raise ValueError(f"missing or mistyped: {', '.join(wrong)}")
    if not all(
        isinstance(h, dict) and isinstance(h.get("metrics"), dict) and isinstance(h.get("step"), int)
        for h in record["history"]
    ):
        raise ValueError("history: each entry needs a step and its metrics")


def sync_pending(
    tracking_uri: str | None, pending: str, log_model: ModelLogger | None = None
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Log every pending record; a logged record's file is removed after it is in MLflow (a crash in
    between is harmless: the replay is idempotent). Returns ((file, run id) per logged record, (file,
    reason) per refused record). An outage stops the sync with one line naming the URI (the rest stay
    pending); a record the server refuses is moved to ``pending/rejected/`` and the sync goes on, so one
    bad record never holds back the others."""
    done, refused = [], []
    for name in sorted(f for f in storage.list_files(pending) if f.endswith(".json") and "/" not in f):
        path = storage.join(pending, name)
        data = storage.read_bytes(path)
        try:
            record = json.loads(data)
            check_record(record)
            run_id = replay(record, tracking_uri, log_model)
        except (
            json.JSONDecodeError,
            UnicodeDecodeError,
            ValueError,
            TrackingRejected,
            ModelSourceError,
            ConfigError,
            DataError,
        ) as exc:  # the record's fault, not the server's
            aside = storage.join(pending, REJECTED, name)
            storage.write_bytes(aside, data)
            storage.remove(path)
            if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError | ValueError):
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).splitlines()[0][:200]
                refused.append((aside, f"{path}: not a pending run record ({why})"))
            else:
                refused.append((aside, str(exc)))
            continue
        storage.remove(path)
        done.append((path, run_id))
    return done, refused


def outage(
    exc: BaseException, tracking_uri: str | None, what: str, kept_in: str, resume: str
) -> TrackingError | None:
    """The tracking server went away after training (publishing, or ending the parent run): nothing is
    lost - results and checkpoints are in ``kept_in`` and each publish step is idempotent - so the job
    ends with one line saying how to finish it, instead of a traceback. None for any other error."""
    seen, chain = set(), []
    while exc is not None and id(exc) not in seen:  # the run's own exit may fail again on top of it
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__context__
    if not any(is_unreachable(e) for e in chain):
        return None
    uri = resolve_tracking_uri(tracking_uri)
    return TrackingError(
        f"MLflow tracking server {uri} went away while {what} was being published; every "
        f"result and checkpoint is kept in {kept_in}. When the server is back: {resume} "
        "(publishes without training again)"
    )
