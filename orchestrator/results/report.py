"""Sweep reports: a Markdown summary and two plots, written atomically to the output directory (and
logged to MLflow by the job).

The untouched base model, measured in the same run, is the first row of the comparison and a line
on the learning-curve plot. Trials are set side by side at an equal step (the last step every
trial reached) as well as at their best; a trial ASHA stopped is shown at the step it reached.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # no pyplot: a figure drawn to a file needs no backend or display

from orchestrator.evaluation.suite import TestReport, compare_table, headline_metrics
from orchestrator.results.publish import Choice, params_label
from orchestrator.spec import BaseResult
from orchestrator.storage import atomic_dir


def common_step(rows: list[dict]) -> int | None:
    """The last evaluation step every scored trial reached (where all can be compared)."""
    steps = [int(r["history"][-1].get("step", 0)) for r in rows if r["history"]]
    return min(steps) if steps else None


def dev_at(row: dict, step: int | None, metric: str) -> float:
    at = [h[metric] for h in row["history"] if int(h.get("step", -1)) == step]
    return at[-1] if at else float("nan")


def group_rows(rows: list[dict], group_out: list[str], headline: str) -> list[dict]:
    """Trials with a test score grouped by their params minus ``group_out``: n, mean, std of
    the best dev score and of the test ``headline``."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if headline not in r.get("test", {}):
            continue
        key = params_label({k: v for k, v in r["params"].items() if k not in group_out}) or "(all)"
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        dev = np.array([r["best_dev"] for r in rs])
        tst = np.array([r["test"][headline] for r in rs])
        out.append(
            {
                "setting": key,
                "n": len(rs),
                "dev_mean": float(dev.mean()),
                "dev_std": float(dev.std(ddof=1)) if len(rs) > 1 else 0.0,
                "test_mean": float(tst.mean()),
                "test_std": float(tst.std(ddof=1)) if len(rs) > 1 else 0.0,
            }
        )
    return sorted(out, key=lambda g: -g["dev_mean"])


def group_table(groups: list[dict], label: str, headline: str) -> str:
    lines = [
        f"| setting | trials | {label} ×100 (mean ± std) | test {headline} ×100 (mean ± std) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {g['setting']} | {g['n']} | {g['dev_mean'] * 100:.2f} ± {g['dev_std'] * 100:.2f} | "
        f"{g['test_mean'] * 100:.2f} ± {g['test_std'] * 100:.2f} |"
        for g in groups
    ]
    return "\n".join(lines)


def _x100(v: float | None) -> str:
    return f"{v * 100:.2f}" if v is not None and v == v else "–"


def write_sweep_report(
    out_dir: str | Path,
    *,
    name: str,
    method: str,
    recipe,  # the method's recipe class: its metric and label
    rows: list[dict],
    group_out: list[str],
    choice: Choice,
    base: BaseResult | None,
    test: TestReport,
    best_config: dict,
    registered: dict,
    gate: str,
    wall_s: float,
    champion: dict | None = None,
    other_bases: list[BaseResult] = (),
) -> Path:
    """``champion``: the tags of the version ``@champion`` pointed at before this sweep (its test scores).
    ``other_bases``: the base model measured with other poolings (``base`` is the strongest)."""
    metric, label, best = recipe.metric, recipe.metric_label, choice.best
    step = common_step(rows)
    with atomic_dir(out_dir) as tmp:
        _plots(tmp, rows, metric, label, base)
        _loss_curves(tmp, rows)
        _per_task(tmp, test, base, champion or {})
        lines = [
            f"# Sweep `{name}` ({method})",
            "",
            f"{len(rows)} trials, wall time {wall_s / 60:.1f} min; metric `{metric}` ({label}, ×100).",
            "",
            "## Against the base model (measured in this run, same pooling and tasks)",
            "",
            f"| model | {label} | test {test.headline} |",
            "|---|---:|---:|",
        ]
        if base is not None:
            lines.append(
                f"| {base.label}{' (the strongest: the gate compares with it)' if other_bases else ''} | "
                f"{_x100(base.dev)} | {_x100(base.test.metrics.get(test.headline))} |"
            )
            lines += [
                f"| {b.label} | {_x100(b.dev)} | {_x100(b.test.metrics.get(test.headline))} |"
                for b in other_bases
            ]
        elif choice.base_dev is not None:
            lines.append(f"| {choice.base_label} | {_x100(choice.base_dev)} | – |")
        lines += [
            f"| best setting: {params_label(best['params'])} (trial {best['trial']}; setting mean "
            f"{_x100(choice.best_dev)}) | {_x100(best['best_dev'])} | {_x100(test.headline_value)} |",
            "",
            f"**{gate}**",
            "",
        ]
        if base is not None:
            lines += ["### Candidate − base per test task (×100)", "", compare_table(base.test, test), ""]
        lines += [
            "## Trials (best dev first)",
            "",
            f"Side by side at step {step} (the last step every trial reached) and at each trial's best.",
            "",
            f"| # | trial | setting | dev @ step {step} | best dev | at step | steps | note |",
            "|---:|---|---|---:|---:|---:|---:|---|",
        ]
        for i, r in enumerate(rows, 1):
            note = r["error"] or ("stopped early (ASHA)" if r["stopped_early"] else "")
            reached = int(r["history"][-1].get("step", 0)) if r["history"] else 0
            at_best = int(r["best"].get("step", 0)) if r["best"] else 0
            lines.append(
                f"| {i} | {r['trial']} | {params_label(r['params'])} | {_x100(dev_at(r, step, metric))} | "
                f"{_x100(r['best_dev'])} | {at_best} | {reached} | {note} |"
            )
        groups = group_rows(rows, group_out, test.headline)
        if sum(g["n"] for g in groups) > 1:
            lines += [
                "",
                f"## Settings over {', '.join(group_out) or 'trials'} (every trial tested)",
                "",
                group_table(groups, label, test.headline),
            ]
            (tmp / "groups.json").write_text(json.dumps(groups, indent=2))
        lines += [
            "",
            "## Best configuration",
            "",
            "```json",
            json.dumps({"trial": best["trial"], "params": best["params"], "config": best_config}, indent=2),
            "```",
            "",
            f"## Best trial: {test.title}",
            "",
            test.table,
            "",
            "## Registered",
            "",
            f"`{registered['name']}` version {registered['version']}, alias "
            f"{'`' + registered['alias'] + '`' if registered['alias'] else 'none (did not beat the base)'} "
            f"(run `{registered['run_id']}`).",
            "",
            "![dev score per setting](dev_by_setting.png)",
            "",
            "![learning curves](learning_curves.png)",
            "",
            "![training loss](loss_curves.png)",
            "",
            "![per task: candidate, base, champion](per_task.png)",
            "",
        ]
        (tmp / "summary.md").write_text("\n".join(lines))
        (tmp / "trials.json").write_text(json.dumps(rows, indent=2, default=str))
        if base is not None:
            (tmp / "base.json").write_text(
                json.dumps(
                    {
                        "label": base.label,
                        "dev": base.dev,
                        "test": base.test.metrics,
                        "others": [
                            {"label": b.label, "dev": b.dev, "test": b.test.metrics} for b in other_bases
                        ],
                    },
                    indent=2,
                )
            )
    return Path(out_dir)


def _plots(out: Path, rows: list[dict], metric: str, label: str, base: BaseResult | None) -> None:
    scored = [r for r in rows if r["best_dev"] == r["best_dev"]]
    fig = Figure(figsize=(8, 0.5 + 0.45 * max(1, len(scored))))
    ax = fig.subplots()
    top = max(scored, key=lambda r: r["best_dev"]) if scored else None
    bars = ax.barh(
        [("★ " if r is top else "") + (params_label(r["params"]) or r["trial"]) for r in scored][::-1],
        [r["best_dev"] * 100 for r in scored][::-1],
        color=["#dd8452" if r is top else "#4c72b0" for r in scored][::-1],
    )
    ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)  # the values, readable without the axis
    if base is not None:
        ax.axvline(
            base.dev * 100, color="#c44e52", linestyle="--", label=f"{base.label}: {base.dev * 100:.2f}"
        )
        ax.legend(fontsize=7)
    ax.set_xlabel(f"best {label} ×100")
    ax.set_title("Dev score per setting")
    if scored:
        values = [r["best_dev"] * 100 for r in scored] + ([base.dev * 100] if base else [])
        ax.set_xlim(max(0, min(values) - 5), max(values) + 3)  # room for the value labels
    fig.tight_layout()
    fig.savefig(out / "dev_by_setting.png", dpi=110)

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for r in scored[:5]:
        steps = [h.get("step", i) for i, h in enumerate(r["history"])]
        ax.plot(
            steps, [h[metric] * 100 for h in r["history"]], marker="o", label=params_label(r["params"])[:60]
        )
    if base is not None:
        ax.axhline(base.dev * 100, color="#c44e52", linestyle="--", label=f"{base.label} (step 0)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(f"{label} ×100")
    ax.set_title("Learning curves of the top trials")
    if scored:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=110)


def _loss_curves(out: Path, rows: list[dict]) -> None:
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for r in rows[:5]:
        points = [(h.get("step", i), h["loss"]) for i, h in enumerate(r["history"]) if "loss" in h]
        if points:
            ax.plot(*zip(*points, strict=True), marker=".", label=params_label(r["params"])[:60])
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("training loss (at each evaluation)")
    ax.set_yscale("log")
    ax.set_title("Training loss of the top trials")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=110)


def _per_task(out: Path, test: TestReport, base: BaseResult | None, champion: dict) -> None:
    """Each headline test metric: the candidate, the base model (this run) and the current champion."""
    keys = list(headline_metrics(test))
    series = {"candidate": [test.metrics[k] for k in keys]}
    if base is not None:
        series["base (this run)"] = [base.test.metrics.get(k, np.nan) for k in keys]
    if champion:
        series[f"champion v{champion.get('version')}"] = [
            float(champion.get(f"test_{k}", "nan")) for k in keys
        ]
    fig = Figure(figsize=(1.5 + 0.9 * len(keys), 3.8))
    ax = fig.subplots()
    x = np.arange(len(keys))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + i * width, np.array(values) * 100, width, label=name)
        ax.bar_label(bars, fmt="%.1f", fontsize=5, padding=1)
    ax.set_xticks(
        x + width * (len(series) - 1) / 2,
        [k.replace("sts_", "").replace("_spearman_all", "") for k in keys],
        rotation=30,
        fontsize=7,
    )
    ax.set_ylabel("×100")
    finite = [v * 100 for vs in series.values() for v in vs if v == v]
    if finite:
        ax.set_ylim(max(0, min(finite) - 5), max(finite) + 2)
    ax.legend(fontsize=7)
    ax.set_title("Test per task")
    fig.tight_layout()
    fig.savefig(out / "per_task.png", dpi=110)
