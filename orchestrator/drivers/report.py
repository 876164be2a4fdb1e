"""Sweep reports: a Markdown summary and two plots, written atomically to the output directory
(and logged to MLflow by the job)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.drivers.sweep import params_label
from orchestrator.storage import atomic_dir


def write_sweep_report(out_dir: str | Path, *, name: str, method: str, metric: str, rows: list[dict],
                       best_params: dict, test, registered: dict | None, wall_s: float,
                       metric_label: str = "STS-B dev Spearman", group_out: list[str] | None = None) -> Path:
    """``test``: the best trial's :class:`~orchestrator.evaluation.suite.TestReport` (or None).
    When several trials have test scores, a table groups them by setting (``group_out`` keys,
    e.g. the seed, averaged over: mean ± std)."""
    return _write(out_dir, name=name, method=method, metric=metric, rows=rows, best_params=best_params, test=test,
                  registered=registered, wall_s=wall_s, label=metric_label, group_out=group_out or [])


def group_rows(rows: list[dict], group_out: list[str], headline: str) -> list[dict]:
    """Trials with a test score grouped by their params minus ``group_out``: n, mean, std of
    the best dev score and of the test ``headline``."""
    import numpy as np

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
        out.append({"setting": key, "n": len(rs), "dev_mean": float(dev.mean()), "dev_std": float(dev.std(ddof=1)) if len(rs) > 1 else 0.0,
                    "test_mean": float(tst.mean()), "test_std": float(tst.std(ddof=1)) if len(rs) > 1 else 0.0})
    return sorted(out, key=lambda g: -g["dev_mean"])


def group_table(groups: list[dict], label: str, headline: str) -> str:
    lines = [f"| setting | trials | {label} ×100 (mean ± std) | test {headline} ×100 (mean ± std) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {g['setting']} | {g['n']} | {g['dev_mean'] * 100:.2f} ± {g['dev_std'] * 100:.2f} | "
              f"{g['test_mean'] * 100:.2f} ± {g['test_std'] * 100:.2f} |" for g in groups]
    return "\n".join(lines)


def _write(out_dir, *, name, method, metric, rows, best_params, test, registered, wall_s, label, group_out) -> Path:
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
        groups = group_rows(rows, group_out, test.headline) if test else []
        if sum(g["n"] for g in groups) > 1:
            lines += ["", f"## Settings over {', '.join(group_out) or 'trials'} (every trial tested)", "",
                      group_table(groups, label, test.headline)]
            (tmp / "groups.json").write_text(json.dumps(groups, indent=2))
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
