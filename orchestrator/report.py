"""Sweep reports: a Markdown summary and two plots, written atomically to the output directory
(and logged to MLflow by the job)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.storage import atomic_dir
from orchestrator.sweep import params_label


def write_sweep_report(out_dir: str | Path, *, name: str, method: str, metric: str, rows: list[dict],
                       best_params: dict, test, registered: dict | None, wall_s: float,
                       metric_label: str = "STS-B dev Spearman") -> Path:
    """``test``: the best trial's :class:`~orchestrator.evaluation.suite.TestReport` (or None)."""
    return _write(out_dir, name=name, method=method, metric=metric, rows=rows, best_params=best_params, test=test,
                  registered=registered, wall_s=wall_s, label=metric_label)


def _write(out_dir, *, name, method, metric, rows, best_params, test, registered, wall_s, label) -> Path:
    with atomic_dir(out_dir) as tmp:
        _plots(tmp, rows, metric, label)
        lines = [f"# Sweep `{name}` ({method})", "",
                 f"{len(rows)} trials, wall time {wall_s / 60:.1f} min; metric `{metric}` ({label}, ×100).", "",
                 "## Trials (best dev first)", "",
                 "| # | trial | setting | best dev | evals | note |", "|---:|---|---|---:|---:|---|"]
        for i, r in enumerate(rows, 1):
            note = r["error"] or ("stopped early (ASHA)" if r["stopped_early"] else "")
            dev = f"{r['best_dev'] * 100:.2f}" if r["best_dev"] == r["best_dev"] else "–"
            lines.append(f"| {i} | {r['trial']} | {params_label(r['params'])} | {dev} | {len(r['history'])} | {note} |")
        lines += ["", "## Best configuration", "", "```json", json.dumps(best_params, indent=2), "```", ""]
        if test:
            lines += [f"## Best trial: {test.title}", "", test.table, ""]
        if registered:
            lines += ["## Registered", "", f"`{registered['name']}` version {registered['version']} "
                      f"with alias `{registered['alias']}` (run `{registered['run_id']}`).", ""]
        lines += ["![dev score per setting](dev_by_setting.png)", "", "![learning curves](learning_curves.png)", ""]
        (tmp / "summary.md").write_text("\n".join(lines))
        (tmp / "trials.json").write_text(json.dumps(rows, indent=2, default=str))
    return Path(out_dir)


def _plots(out: Path, rows: list[dict], metric: str, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r["best_dev"] == r["best_dev"]]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(scored))))
    ax.barh([params_label(r["params"]) or r["trial"] for r in scored][::-1],
            [r["best_dev"] * 100 for r in scored][::-1], color="#4c72b0")
    ax.set_xlabel(f"best {label} ×100")
    ax.set_title("Dev score per setting")
    if scored:
        lo = min(r["best_dev"] for r in scored) * 100
        ax.set_xlim(max(0, lo - 5), max(r["best_dev"] for r in scored) * 100 + 1)
    fig.tight_layout()
    fig.savefig(out / "dev_by_setting.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in scored[:5]:
        steps = [h.get("step", i) for i, h in enumerate(r["history"])]
        ax.plot(steps, [h[metric] * 100 for h in r["history"]], marker="o", label=params_label(r["params"])[:60])
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(f"{label} ×100")
    ax.set_title("Learning curves of the top trials")
    if scored:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=110)
    plt.close(fig)
