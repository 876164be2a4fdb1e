"""MLflow runs fed from the processes that train, not from the job's driver: a Tune trial's nested run and a
job's run, each made before training starts with its params logged once, and :class:`LiveRun` - a worker's
metrics sent while it trains, buffered through a tracking outage and sent when the server is back."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from orchestrator.tracking import clean_params, redact


class LiveRun:
    """Log metrics to an existing MLflow run while training runs, so the UI shows curves during it.

    Each call sends what is buffered plus the new points in one ``log_batch``; when the tracking server
    is away the points stay buffered (one warning) and go with the next call that reaches it; ``close``
    tries once more and returns what could not be sent (the caller keeps it in its run record)."""

    def __init__(self, run_id: str, tracking_uri: str):
        # one quick try per call: a training step must not wait on MLflow's retry back-off
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        self.run_id, self.uri = run_id, tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.pending: list = []
        self.warned = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.pending += [
            Metric(k, float(v), now, int(step))
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(float(v))
        ]
        self.flush()

    def flush(self) -> bool:
        try:
            while self.pending:
                self.client.log_batch(self.run_id, metrics=self.pending[:1000])
                self.pending = self.pending[1000:]
            return True
        except Exception as exc:  # noqa: BLE001 - any client error: keep the points, try again later
            if not self.warned:
                print(
                    f"warning: MLflow {self.uri} unreachable while training ({str(exc).splitlines()[0][:120]}); "
                    "metrics are buffered and sent when it is back",
                    file=sys.stderr,
                )
                self.warned = True
            return False

    def close(self) -> list[dict]:
        """Send what is left; returns the points that never reached the server (as plain dicts)."""
        self.flush()
        return [{"key": m.key, "value": m.value, "step": m.step} for m in self.pending]


def create_child_run(
    experiment_id: str,
    parent_run_id: str,
    name: str,
    tags: dict[str, str],
    params: dict[str, Any],
    tracking_uri: str,
) -> str:
    """A nested run created from a process that is not the parent's (a Tune trial): its id."""
    return create_run(
        experiment_id, name, {"mlflow.parentRunId": parent_run_id, **tags}, params, tracking_uri
    )


def create_run(
    experiment_id: str, name: str, tags: dict[str, str], params: dict[str, Any], tracking_uri: str
) -> str:
    """A top-level run made before training starts, its params logged once: its id."""
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.create_run(experiment_id, run_name=name, tags={"mlflow.runName": name, **tags})
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in clean_params(params).items()])
    return run.info.run_id


def close_failed(run_id: str, tracking_uri: str, exc: BaseException) -> None:
    """A job that stops after its run was made: the run ends FAILED (KILLED on Ctrl-C) with the reason's first
    line, redacted, as the tag ``sieve.failure``, and so do its trials' runs still RUNNING - nothing stays
    RUNNING. One quick try: the job's own error line must not wait on a tracking server that is away (the runs
    then stay as the server last saw them)."""
    reason = redact((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:500]
    keys = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict(zip(keys, ("0", "5"), strict=True)))
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        client.set_tag(run_id, "sieve.failure", reason)
        client.set_terminated(run_id, status)
        running = f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'RUNNING'"
        for child in client.search_runs([client.get_run(run_id).info.experiment_id], filter_string=running):
            client.set_tag(child.info.run_id, "sieve.failure", f"the job stopped: {reason}"[:500])
            client.set_terminated(child.info.run_id, status)
    except Exception:  # noqa: BLE001, S110 - best effort: the job's error is what the user must see
        pass
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
