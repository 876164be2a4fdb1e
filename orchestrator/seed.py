"""The one seed helper used everywhere (python, numpy, torch, Ray Data shuffles)."""

from __future__ import annotations

import hashlib
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


def derive_seed(seed: int, *names: object) -> int:
    """A stable child seed for a named sub-task (a shard, a trial, an epoch).

    Python's ``hash`` is salted per process, so this uses a fixed digest instead.
    """
    digest = hashlib.sha256(repr((seed, *names)).encode()).digest()
    return int.from_bytes(digest[:4], "little")
