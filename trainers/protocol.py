"""How a trained sentence encoder is read: the evaluation protocol a recipe names.

A protocol says what a run's checkpoints and a sweep's settings are selected on (the dev score), what the
final test reads, and how the untouched base model is measured exactly as a trained one. A recipe names one
(``protocol = STS_DEV``) and :class:`~trainers.recipe.Recipe`'s hooks ``dev``, ``evaluate``,
``evaluate_base``, ``has_dev``, ``dev_tasks`` and ``selection_metric`` read it; a method with its own reading
(Siamese's Δ cosine, SIFTER-LSTM's SST-2, ParaBART's E_sem) writes those hooks itself instead.

* :data:`STS_DEV` (SimCSE's protocol): STS-B dev Spearman at every evaluation, the best checkpoint on it, and
  the test on the STS tasks (with any domain tasks first).
* :data:`DOMAIN` (TSDAE's protocol): unsupervised - fixed steps, the last checkpoint, no labelled data read
  before the final test - unless a labelled dev set is configured (``eval.dev``, with ``eval.select: best``);
  the test reads the domain tasks (TwitterPara AP, the headline) and the STS tasks. TSDAE, MLM and SBERT are
  read this way, so ``jobs/compare.py`` sets them side by side on one test.

Both protocols test with :func:`orchestrator.evaluation.domain.evaluate_encoder` (the exported folder, the
config's test-time pooling), which is why arms of different methods are comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from torch import nn

from orchestrator.config import EvalConfig
from orchestrator.evaluation import sts
from orchestrator.evaluation.domain import evaluate_encoder, get_evaluator
from orchestrator.evaluation.encode import HFEncoder, test_time_pooling
from orchestrator.models import pooling_for
from orchestrator.spec import BaseResult, measure_base


class DomainEval(EvalConfig):
    """The STS tasks (``tasks``) plus the domain tasks; optionally a labelled dev set for tuning."""

    dev: str | None = Field(
        None,
        description="empty: no labelled data before the final test (the paper); "
        "else a domain evaluator name (twitterpara_pit_dev: in-domain) or 'stsb_dev'",
    )
    select: Literal["last", "best"] = Field(
        "last", description="the run's checkpoint: the last (the paper) or the best on eval.dev"
    )
    dev_path: str | None = None
    domain: list[str] = ["twitterpara"]
    batch_size: int = Field(128, gt=0)
    max_length: int = Field(64, gt=0)


def encoder_for_eval(encoder: nn.Module, tokenizer, cfg) -> HFEncoder:
    """The training module's encoder read as its exported folder will be: the config's test-time pooling."""
    return HFEncoder(
        encoder,
        tokenizer,
        pooling=test_time_pooling(pooling_for(cfg)),
        batch_size=cfg.eval.batch_size,
        max_length=cfg.eval.max_length,
    )


def stsb_dev_score(encoder: nn.Module, tokenizer, cfg) -> float:
    """STS-B dev Spearman with the test-time pooling (what the exported folder computes)."""
    scores = sts.evaluate_data(encoder_for_eval(encoder, tokenizer, cfg), sts.load_task("stsb_dev"))
    return scores["spearman"]["all"]


def labelled_dev_score(encoder: nn.Module, tokenizer, cfg) -> float:
    """The configured labelled dev set's score (``eval.dev``); NaN, and nothing read, without one."""
    if cfg.eval.dev is None:
        return float("nan")
    if cfg.eval.dev == "stsb_dev":
        return stsb_dev_score(encoder, tokenizer, cfg)
    enc = encoder_for_eval(encoder, tokenizer, cfg)
    return next(iter(get_evaluator(cfg.eval.dev, cfg.eval.dev_path)(enc).values()))


@dataclass(frozen=True)
class Protocol:
    """One way of reading an encoder recipe's runs (module docstring)."""

    name: str
    summary: str  # the dev metric → the test, in a phrase (docs/METHODS.md's table)
    metric: str  # the dev metric every evaluation reports; higher is better
    metric_label: str
    dev_score: Callable[[nn.Module, object, object], float]  # (encoder, tokenizer, cfg) -> the dev score
    optional_dev: bool  # True: a dev score only where ``eval.dev`` names a labelled set (else none at all)

    def dev(self, encoder: nn.Module, tokenizer, cfg) -> float | dict:
        """What a worker's evaluation reports: the dev score, or (optional dev) nothing without a dev set."""
        if not self.optional_dev:
            return self.dev_score(encoder, tokenizer, cfg)
        return {self.metric: self.dev_score(encoder, tokenizer, cfg)} if cfg.eval.dev else {}

    def has_dev(self, cfg) -> bool:
        return not self.optional_dev or cfg.eval.dev is not None

    def dev_tasks(self, cfg) -> list[str]:
        if not self.optional_dev:
            return ["stsb_dev"]
        return [cfg.eval.dev] if cfg.eval.dev else []

    def selection_metric(self, cfg) -> str | None:
        """The best checkpoint on the dev score, or None for the last one (the unsupervised protocol)."""
        return self.metric if not self.optional_dev or cfg.eval.select == "best" else None

    # the final test of an exported folder (not a field: ``Recipe.comparable`` names this function)
    test = staticmethod(evaluate_encoder)

    def evaluate_base(self, cfg) -> BaseResult:
        """The untouched starting encoder, with the same pooling, on the dev score and the test report."""
        return measure_base(cfg, self.dev_score, evaluate_encoder)


STS_DEV = Protocol(
    "sts_dev",
    "STS-B dev Spearman (the best checkpoint) → the STS tasks",
    "stsb_dev_spearman",
    "STS-B dev Spearman",
    stsb_dev_score,
    optional_dev=False,
)
DOMAIN = Protocol(
    "domain",
    "none: fixed steps, the last checkpoint (or a labelled dev set, `eval.dev`) → the domain tasks + the STS tasks",
    "dev_score",
    "dev score on eval.dev (a labelled dev set, an explicit option)",
    labelled_dev_score,
    optional_dev=True,
)
