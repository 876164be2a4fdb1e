"""Seeding a process that is not a training worker (``jobs/evaluate.py``, tests); training workers seed
themselves from ``train.seed`` and their rank (``trainers/common.py``)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, *, deterministic_torch: bool = True) -> None:
    """Seed python, numpy and torch so that the same seed gives the same numbers on CPU."""
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic_torch:
        torch.use_deterministic_algorithms(True, warn_only=True)
