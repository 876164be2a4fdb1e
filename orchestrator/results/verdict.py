"""A sweep's closing verdict: at most eight lines, the last the console prints (the summary's JSON goes to a
file beside the report).

What a user decides on, in order: what won (method and setting); its dev and test figures beside the
untouched base and the current champion; the largest per-task regression against the base (a win on the
average can hide one); whether the margin over the base is outside the noise between seeds; where the report
and the registered version are (absolute paths); the next command. The registration line stays last.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from orchestrator.evaluation.suite import TestReport, headline_metrics
from orchestrator.results.leaderboard import SATURATED_LOSS
from orchestrator.results.publish import Choice, setting_of
from orchestrator.spec import BaseResult


def saturation_line(rows: list[dict]) -> str | None:
    """The explore trials whose training loss ended below :data:`~orchestrator.results.leaderboard.SATURATED_LOSS`
    (a contrastive loss that low: every batch's negatives are trivial, the trial trained on no signal and its
    figures test nothing) - said as the comparison's leaderboard flags an arm; None when there is none."""
    last = {
        r["trial"]: losses[-1]
        for r in rows
        if (losses := [h["loss"] for h in r.get("history", []) if isinstance(h.get("loss"), int | float)])
    }
    flat = {t: v for t, v in last.items() if v < SATURATED_LOSS}
    if not flat:
        return None
    worst = min(flat, key=flat.get)
    return (
        f"saturated: {len(flat)} of {len(last)} explore trial(s) ended with a training loss below "
        f"{SATURATED_LOSS:g} (lowest: {worst}, {flat[worst]:.2g}) - they trained on no signal, and their figures "
        "test nothing; a harder task (a larger batch, hard negatives) or fewer steps"
    )


def _x100(v: float) -> str:
    return f"{v * 100:.2f}"


def seed_devs(rows: list[dict], best: dict, group_out: list[str]) -> list[float]:
    """The dev scores of every seed of the chosen setting."""
    key = setting_of(best["params"], group_out)
    return [r["best_dev"] for r in rows if r["checkpoint_path"] and setting_of(r["params"], group_out) == key]


def verdict(
    *,
    method: str,
    choice: Choice,
    metric_label: str,
    test: TestReport,
    base: BaseResult | None,
    champion: dict,
    registered: dict,
    devs: list[float],
    report: Path,
    summary_json: Path,
    job: str,
    gate: str,
    rows: list[dict] = (),
) -> list[str]:
    best = choice.best
    setting = json.dumps(best["params"], sort_keys=True, default=str)
    lines = [f"verdict: {method} {setting} (trial {best['trial']})"]

    dev = f"dev {metric_label} {_x100(choice.best_dev)}"
    if choice.base_dev is not None:
        dev += f" vs base {_x100(choice.base_dev)} ({(choice.best_dev - choice.base_dev) * 100:+.2f})"
    h, value = test.headline, test.headline_value
    figures = f"{dev}; test {h} {_x100(value)}"
    if base is not None and h in base.test.metrics:
        figures += f" vs base {_x100(base.test.metrics[h])} ({(value - base.test.metrics[h]) * 100:+.2f})"
    if champion.get("test_score") and champion.get("test_metric", h) == h:
        score = float(champion["test_score"])
        figures += f"; champion v{champion['version']} {_x100(score)} ({(value - score) * 100:+.2f})"
    else:
        figures += "; no champion yet"
    lines.append(figures)

    if base is not None:
        mine, theirs = headline_metrics(test), headline_metrics(base.test)
        diffs = {
            k: mine[k] - theirs[k] for k in mine if k in theirs and k != h and not k.startswith("sts_avg")
        }
        if diffs:
            worst = min(diffs, key=diffs.get)
            up = sum(d > 0 for d in diffs.values())
            lines.append(
                f"largest regression against the base: {worst} {diffs[worst] * 100:+.2f} ({up} of {len(diffs)} "
                "tasks up)"
                if diffs[worst] < 0
                else f"no task below the base ({up} of {len(diffs)} up)"
            )

    margin = None if choice.base_dev is None else choice.best_dev - choice.base_dev
    if len(devs) >= 2 and margin is not None:
        sd = statistics.stdev(devs)
        lines.append(
            f"noise: the setting's dev over {len(devs)} seeds has sd {sd * 100:.2f}; its margin over the base "
            f"({margin * 100:+.2f}) is {abs(margin) / sd:.1f} sd"
            if sd > 0
            else f"noise: the setting's {len(devs)} seeds gave the same dev score"
        )
    elif margin is None:
        lines.append("noise: no base score to set a margin against")
    else:
        lines.append(
            "noise: one seed per setting, so the margin's noise is not measured here; jobs/compare.py runs "
            "paired seeds and gives its confidence interval"
        )
    lines.append(
        f"report: {report.resolve()} (summary JSON: {summary_json.resolve()}); MLflow: "
        f"models:/{registered['name']}/{registered['version']}, run {registered.get('run_id')}"
    )
    name, version = registered["name"], registered["version"]
    lines.append(
        f"next: python jobs/promote.py --model {name} --version {version}   # to make it @champion"
        if choice.beats_base
        else f"next: python jobs/{job}.py --print-config   # the keys to sweep wider or train longer"
    )
    if saturated := saturation_line(rows):
        lines.append(saturated)
    lines.append(gate)
    return lines
