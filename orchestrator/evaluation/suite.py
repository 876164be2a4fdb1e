"""What a method's final evaluation returns: one :class:`TestReport`, whatever the method.

The sweep and train jobs log ``metrics`` to MLflow, put ``headline`` in the registered model's
description, and paste ``table`` into the report; ``detail`` keeps the evaluator's raw result
(written next to the exported model as ``test.json``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.evaluation import sts


@dataclass
class TestReport:
    title: str  # e.g. "STS test sets (Spearman / Pearson ×100, cls_before_pooler)"
    metrics: dict[str, float]  # flat, for MLflow
    headline: str  # the key of ``metrics`` that summarises the model
    table: str  # Markdown
    detail: dict = field(default_factory=dict)

    __test__ = False  # not a pytest class

    @property
    def headline_value(self) -> float:
        return self.metrics[self.headline]

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    def merged(self, other: TestReport) -> TestReport:
        """Two evaluations of one model in one report (the first one's headline)."""
        return TestReport(
            f"{self.title}; {other.title}",
            {**self.metrics, **other.metrics},
            self.headline,
            f"**{self.title}**\n\n{self.table}\n\n**{other.title}**\n\n{other.table}",
            {**self.detail, **other.detail},
        )


def sts_report(encoder, tasks: list[str], pooling: str) -> TestReport:
    result = sts.evaluate(encoder, tasks)
    return TestReport(
        f"STS test sets (Spearman / Pearson ×100, `{pooling}`)",
        sts.flat_metrics(result, "sts_"),
        "sts_avg_spearman_all",
        sts.format_table(result),
        {"sts": result},
    )


def headline_metrics(report: TestReport) -> dict[str, float]:
    """The metrics a person compares: per STS task its Spearman ``all`` (+ the averages), and every
    non-STS metric."""
    keep = {
        k: v
        for k, v in report.metrics.items()
        if not k.startswith("sts_") or k.endswith("_spearman_all") or k == report.headline
    }
    return keep


def compare_table(
    base: TestReport, candidate: TestReport, base_name: str = "base", candidate_name: str = "candidate"
) -> str:
    """Markdown: each headline metric of the base and the candidate, and candidate − base (×100)."""
    b, c = headline_metrics(base), headline_metrics(candidate)
    rows = [
        f"| metric | {base_name} | {candidate_name} | {candidate_name} − {base_name} |",
        "|---|---:|---:|---:|",
    ]
    rows += [
        f"| {k} | {b[k] * 100:.2f} | {c[k] * 100:.2f} | {(c[k] - b[k]) * 100:+.2f} |" for k in c if k in b
    ]
    return "\n".join(rows)
