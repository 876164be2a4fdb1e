"""What a sweep trial's Ray Train controller unpickles: the report callback that records every report.

The controller is a new process per trial, and it imports whatever a callback's pickle refers to: a callback
defined beside the trainer code would make every trial's controller import torch, transformers, MLflow and
SciPy before it could start the workers (seconds of every trial's start: ``bench/results/smoke_times.md``).
So this module imports Ray Tune's callback and the storage helpers only.
"""

from __future__ import annotations

import json

import pyarrow.fs as pafs
from ray.train import UserCallback
from ray.tune.integration.ray_train import TuneReportCallback

from orchestrator import storage


def uri_on(filesystem, path: str) -> str:
    """A path on a Ray storage filesystem as a URI: Ray keeps S3 paths without their scheme
    (``bucket/key``), which would name a local folder once recorded."""
    if "://" not in path and isinstance(filesystem, pafs.S3FileSystem):
        return "s3://" + path.lstrip("/")
    return path


def checkpoint_uri(checkpoint) -> str:
    """Where a reported checkpoint (a ``ray.train.Checkpoint``) lives, as ``train.checkpoint_at`` reads it back."""
    return uri_on(checkpoint.filesystem, checkpoint.path)


class RecordingCallback(UserCallback):
    """Keeps every report (metrics + checkpoint path) of a Ray Train run in ``reports_uri``, keyed by step, so a
    finished run's results outlive its driver (a comparison's start stage: recorded, not reported to Tune)."""

    def __init__(self, reports_uri: str):
        super().__init__()
        self.reports_uri = reports_uri
        # a run resumed after a crash keeps the reports made before it
        self.by_step = (
            {str(r.get("step")): r for r in json.loads(storage.read_bytes(reports_uri))}
            if storage.exists(reports_uri)
            else {}
        )

    def after_report(self, run_context, metrics, checkpoint):
        super().after_report(run_context, metrics, checkpoint)
        record = {**metrics[0], **({"checkpoint_path": checkpoint_uri(checkpoint)} if checkpoint else {})}
        self.by_step[str(record.get("step"))] = record
        storage.write_bytes(self.reports_uri, json.dumps(list(self.by_step.values()), default=str).encode())


class RecordingTuneReportCallback(RecordingCallback, TuneReportCallback):
    """Ray Tune's ``TuneReportCallback`` that also keeps every report (:class:`RecordingCallback`): a sweep
    trial's."""
