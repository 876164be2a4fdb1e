"""A comparison arm's start stage (``arms.<name>.start`` in a compare file): trained first, inside the arm's
trial, from the same base model with the arm's seed; its model exported to the comparison's storage; the
arm then trains from that folder. In-domain TSDAE before supervised training (TSDAE's domain adaptation) is
such an arm, set against the supervised arm alone.

Kept like a trial: the stage's every report in ``reports/<trial>-start.json`` (recorded, not reported to
Tune: the trial's results are the arm's), its Ray Train run under ``train/<trial>-start``, its model in
``start/<trial>-start`` (committed last). A resumed trial whose stage model is committed does not train the
stage again; one killed while the stage trained resumes it from its last checkpoint.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from orchestrator import storage
from orchestrator.config import MethodConfig, with_params
from orchestrator.drivers.compare_plan import seeded
from orchestrator.drivers.engine import reports_uri
from orchestrator.drivers.recording import RecordingCallback
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import build_trainer, fit


def start_uri(where: str, trial: str) -> str:
    """Where the start stage of ``trial`` keeps its exported model."""
    return storage.join(where, "start", f"{trial}-start")


def start_from(
    stage: tuple[str, MethodConfig], cfg: MethodConfig, *, trial: str, shards: str, where: str
) -> MethodConfig:
    """Train ``stage`` (method name, config) with ``cfg``'s seed, export its selected checkpoint (the recipe's
    rule: TSDAE's last) and return ``cfg`` reading its model from there."""
    method, stage_cfg = stage
    recipe, stage_cfg = get_method(method), seeded(stage_cfg, cfg.train.seed)
    key, model = f"{trial}-start", start_uri(where, trial)
    if not storage.is_complete(model):
        storage.write_bytes(  # an audit line per start: a resume that trains the stage again shows here
            storage.join(where, "start-invocations", f"{key}-{time.time_ns()}.json"),
            json.dumps({"trial": key, "method": method, "seed": cfg.train.seed}).encode(),
        )
        trainer = build_trainer(
            recipe,
            stage_cfg,
            shards,
            name=key,
            callbacks=[RecordingCallback(reports_uri(where, key))],
            storage_path=storage.join(where, "train"),
        )
        outcome = fit(trainer, recipe, stage_cfg)
        with tempfile.TemporaryDirectory() as tmp, outcome.best_checkpoint.as_directory() as ckpt:
            recipe.export(stage_cfg, Path(ckpt), Path(tmp) / "model")
            storage.put_dir(Path(tmp) / "model", model)
    return with_params(cfg, {"model.name_or_path": model}, f"the model its start stage ({method}) trained")
