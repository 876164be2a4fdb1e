"""The Siamese experiments file (``configs/siamese_experiments/*.yaml``): the settings every run shares, each
experiment's training set and test sets, the models to train (ORIG / NAIVE / SIAMESE / ALL), and the one method
config each run gets (:meth:`ExperimentsConfig.run_config`, validated as the Siamese recipe's)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from orchestrator.config import MethodConfig, StrictModel, flatten, set_path, validate
from orchestrator.data.labelled import LabelledSet
from orchestrator.drivers.registry import get_method

MODELS = ("orig", "naive", "siamese", "all")


class ExperimentBlock(StrictModel):
    train: LabelledSet
    test: list[LabelledSet] = Field(..., min_length=1)


class ExperimentsConfig(StrictModel):
    base: dict[str, Any] = Field(
        {}, description="SiameseConfig keys shared by every run (model, train, scaling, ...)"
    )
    experiments: dict[str, ExperimentBlock] = Field(..., min_length=1)
    all_pairs: int = Field(
        3000,
        gt=0,
        description="ALL: training pairs in all, drawn equally from every "
        "experiment's train set (the paper: 70,000)",
    )
    models: list[Literal["orig", "naive", "siamese", "all"]] = list(MODELS)
    naive: dict[str, Any] = Field(
        {},
        description="SiameseConfig keys set on NAIVE runs only, over base (e.g. "
        "head_warmup_steps, head_lr, train.max_steps, train.batch_size: NAIVE at SIAMESE's encoder work)",
    )
    candidate_margin: float = Field(
        0.0, ge=0, description="dev Δ a model must beat ORIG's by to become candidate"
    )
    models_at_once: int | None = Field(
        None,
        ge=1,
        description="models trained at the same time (default: what "
        "the cluster fits, each taking its workers' CPUs + 1 for its export and test)",
    )

    def run_config(self, experiment: str | None, mode: str) -> MethodConfig:
        """The SiameseConfig of one run (``experiment`` None = ALL)."""
        data = json.loads(json.dumps(self.base))
        if experiment is None:
            data.update(
                train_sets=[e.train.model_dump() for e in self.experiments.values()],
                test_sets=[t.model_dump() for e in self.experiments.values() for t in e.test],
                n_pairs=max(1, self.all_pairs // len(self.experiments)),
                mode="siamese",
            )
        else:
            e = self.experiments[experiment]
            data.update(
                train_sets=[e.train.model_dump()], test_sets=[t.model_dump() for t in e.test], mode=mode
            )
            if mode == "naive":
                for key, value in flatten(self.naive).items():  # a nested key sets that key alone
                    set_path(data, key.split("."), value, f"naive: {key}")
        return validate(get_method("siamese").config_cls, data, f"experiment {experiment or 'ALL'} ({mode})")
