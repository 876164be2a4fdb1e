"""The untouched starting model, measured as a trained one is: :class:`BaseResult`, :func:`measure_base`.

Every result stands beside the base model measured in the same run with the same pooling and tasks; a
recipe's ``evaluate_base`` hook (``trainers/recipe.py``) calls :func:`measure_base` with its own dev
score and test report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.config import EncoderMethodConfig
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import load_encoder, pooling_for, resolve_model_source


@dataclass(frozen=True)
class BaseResult:
    """The untouched starting model, measured like a trained one: dev score + test report."""

    dev: float
    test: TestReport
    label: str  # e.g. "base (default, mean)"


def measure_base(
    cfg: EncoderMethodConfig, dev_score: Callable, evaluate: Callable, label: str = "base"
) -> BaseResult:
    """The untouched starting encoder of ``cfg``, with its pooling: ``dev_score(encoder, tokenizer, cfg)``
    and the method's test report ``evaluate(cfg, folder)`` - exactly what a trained model gets."""
    encoder, tokenizer = load_encoder(cfg.model.name_or_path, add_pooling_layer=False)
    return BaseResult(
        dev_score(encoder, tokenizer, cfg),
        evaluate(cfg, resolve_model_source(cfg.model.name_or_path)),
        f"{label} ({cfg.model.name_or_path}, {pooling_for(cfg)})",
    )
