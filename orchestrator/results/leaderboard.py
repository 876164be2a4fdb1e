"""A comparison's leaderboard, from its runs: which arm wins on my data, and is the difference real?

Input: every arm's runs keyed by seed (each run's test metrics, dev score and training-loss level) and the
untouched base measured once per test-time pooling. Per arm: mean ± std over seeds of every headline
test figure; the paired difference (:mod:`orchestrator.stats`) against the base read with the arm's own
pooling and against the named reference arm, each with its interval and verdict ("indistinguishable"
where it crosses 0) - and, where more than one arm is set against the same reference (or base), Holm's
adjusted p and interval beside the raw one, which the registration gate reads; every arm's per-seed
scores, so anyone can recompute an interval; the loss level at the end of training, flagged when saturated (a loss near 0
carries no gradient: such an arm tests nothing). Arms are ranked by their mean headline figure.

Pure functions of plain data (no Ray, no MLflow): the job (:mod:`orchestrator.drivers.compare`) feeds
them, tests feed them synthetic runs.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from orchestrator.stats import Adjusted, PairedDifference, gate, holm

SATURATED_LOSS = 1e-3  # a contrastive loss this low at the end of training: the batch's negatives are trivial


@dataclass
class ArmRuns:
    """One arm's runs: ``runs[seed] = {"test": {metric: value}, "dev": float, "loss_first": .., "loss_last": ..}``."""

    name: str
    method: str
    pooling: str  # test-time pooling: which base measurement it stands beside
    runs: dict[int, dict] = field(default_factory=dict)
    budget: str = ""  # steps × global batch, as trained


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else math.nan)


def metric_keys(test: dict[str, float], headline: str) -> list[str]:
    """Per-task STS Spearman 'all' and every non-STS figure, the headline last."""
    keys = [
        k
        for k in test
        if k != headline
        and (not k.startswith("sts_") or (k.endswith("_spearman_all") and not k.startswith("sts_avg")))
    ]
    return [*keys, headline]


def build(
    arms: list[ArmRuns],
    bases: dict[str, dict],
    *,
    reference: str | None,
    headline: str,
    confidence: float = 0.95,
    interval: str = "t",
) -> dict:
    """The leaderboard as plain JSON-able data. ``bases[pooling] = {"label", "dev", "test": {...}}``.

    Every paired difference uses the seeds both sides ran (a failed run drops its pair, and ``n`` says so);
    the reference arm's own row has no difference against itself."""
    by_name = {a.name: a for a in arms}
    if reference is not None and reference not in by_name:
        raise ValueError(f"reference arm {reference!r} is not one of the arms ({', '.join(by_name)})")
    first = next((r["test"] for a in arms for r in a.runs.values() if r.get("test")), {})
    keys = metric_keys(first, headline) if first else [headline]
    scored = {p: b for p, b in bases.items() if headline in b.get("test", {})}
    strongest = max(scored, key=lambda p: scored[p]["test"][headline]) if scored else None
    rows = []
    for a in arms:
        scores = {s: r["test"][headline] for s, r in a.runs.items() if headline in r.get("test", {})}
        base = bases.get(a.pooling)
        row = {
            "arm": a.name,
            "method": a.method,
            "pooling": a.pooling,
            "seeds": sorted(scores),
            "n": len(scores),
            "mean": {},
            "std": {},
            "base": base["label"] if base else None,
            "budget": a.budget,
        }
        for k in keys:
            row["mean"][k], row["std"][k] = _mean_std(
                [r["test"][k] for r in a.runs.values() if k in r["test"]]
            )
        row["dev_mean"], row["dev_std"] = _mean_std(
            [r["dev"] for r in a.runs.values() if r.get("dev") is not None and math.isfinite(r["dev"])]
        )
        losses = [r["loss_last"] for r in a.runs.values() if r.get("loss_last") is not None]
        row["loss_first"], _ = _mean_std(
            [r["loss_first"] for r in a.runs.values() if r.get("loss_first") is not None]
        )
        row["loss_last"], _ = _mean_std(losses)
        row["saturated"] = bool(losses) and row["loss_last"] < SATURATED_LOSS
        row["per_seed"] = {
            s: {k: r["test"][k] for k in keys if k in r["test"]} for s, r in sorted(a.runs.items())
        }
        row["dev_per_seed"] = {s: r.get("dev") for s, r in sorted(a.runs.items())}
        rows.append(row)
    # the three families, each adjusted over its members (Holm): against the base read the arm's way, against
    # the base read its strongest way, against the reference arm
    families: dict[str, dict[str, tuple]] = {"vs_base": {}, "vs_strongest_base": {}, "vs_reference": {}}
    for a in arms:
        scores = {s: r["test"][headline] for s, r in a.runs.items() if headline in r.get("test", {})}
        base = bases.get(a.pooling)
        if base is not None and scores and headline in base["test"]:
            families["vs_base"][a.name] = (scores, base["test"][headline])
        if strongest is not None and strongest != a.pooling and scores:
            families["vs_strongest_base"][a.name] = (scores, scored[strongest]["test"][headline])
        if reference is not None and a.name != reference:
            ref = by_name[reference]
            ref_scores = {
                s: r["test"][headline] for s, r in ref.runs.items() if headline in r.get("test", {})
            }
            common = sorted(set(scores) & set(ref_scores))
            if common:
                families["vs_reference"][a.name] = (
                    {s: scores[s] for s in common},
                    {s: ref_scores[s] for s in common},
                )
    for side, family in families.items():
        adjusted = holm(family, confidence=confidence, method=interval) if family else {}
        for row in rows:
            row[side] = _diff(adjusted[row["arm"]]) if row["arm"] in adjusted else None
    for row in rows:
        # registered only above the base read the arm's way *and* read its strongest way, each after Holm's
        # adjustment when several arms are set against it
        row["gate"] = _passes(row["vs_base"]) and (
            row["vs_strongest_base"] is None or _passes(row["vs_strongest_base"])
        )
    rows.sort(
        key=lambda r: -r["mean"][headline] if math.isfinite(r["mean"].get(headline, math.nan)) else math.inf
    )
    return {
        "headline": headline,
        "keys": keys,
        "reference": reference,
        "confidence": confidence,
        "interval": interval,
        "bases": bases,
        "strongest_base": strongest,
        "rows": rows,
    }


def _diff(adj: Adjusted) -> dict:
    """A comparison as JSON: the raw interval and p; with ``adjusted`` (a family of more than one) Holm's p, the
    step-level interval and its verdict."""
    d = adj.raw
    out = {
        "n": d.n,
        "mean": d.mean,
        "low": d.low,
        "high": d.high,
        "p": d.p,
        "verdict": d.verdict,
        "confidence": d.confidence,
        "method": d.method,
    }
    if adj.m > 1:
        s = adj.interval
        out["adjusted"] = {
            "m": adj.m,
            "p": adj.p_adjusted,
            "low": s.low,
            "high": s.high,
            "confidence": s.confidence,
            "verdict": "indistinguishable" if not adj.p_adjusted < 1 - d.confidence else d.verdict,
        }
    return out


def _passes(d: dict | None) -> bool:
    """The gate on one comparison: the adjusted one when there is one, else the raw interval."""
    if d is None:
        return False
    if (adj := d.get("adjusted")) is not None:
        return adj["p"] < 1 - d["confidence"] and adj["low"] > 0
    return gate(_as_diff(d))


def _as_diff(d: dict) -> PairedDifference:
    return PairedDifference(d["n"], d["mean"], d["low"], d["high"], d["confidence"], d["method"])


def winner(board: dict, arm: str = "best") -> dict:
    """The row registration considers: the named arm, or the one ranked first (``best``)."""
    rows = board["rows"]
    if arm == "best":
        return rows[0]
    for r in rows:
        if r["arm"] == arm:
            return r
    raise ValueError(f"register.arm {arm!r} is not one of the arms ({', '.join(r['arm'] for r in rows)})")


def gate_text(row: dict, headline: str) -> str:
    """The registration rule and its figures, one paragraph (a registered version's description says it)."""
    d = row["vs_base"]
    if d is None:
        return f"{row['arm']}: no base measurement to gate on; not registered"
    rule = (
        f"gate: register only when the lower bound of the {d['confidence']:.0%} interval of {row['arm']} − base "
        f"({row['base']}) on {headline} is above 0"
        + (f" after Holm's adjustment over the {d['adjusted']['m']} arms" if d.get("adjusted") else "")
        + f", over {d['n']} seed(s): {ci_text(d)}"
    )
    if (strong := row.get("vs_strongest_base")) is not None:
        rule += f"; and against the base read its strongest way: {ci_text(strong)}"
    return f"{rule} → {'passed' if row['gate'] else 'not passed'}"


def _x100(v) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v * 100:.2f}"


def _pm(mean, std) -> str:
    if mean is None or not math.isfinite(mean):
        return "–"
    return (
        f"{mean * 100:.2f} ± {std * 100:.2f}"
        if std is not None and math.isfinite(std)
        else f"{mean * 100:.2f}"
    )


def ci_text(d: dict | None) -> str:
    """A comparison in one phrase: the raw interval, and Holm's beside it when adjusted."""
    if d is None:
        return "–"
    if d["n"] < 2:
        return f"{d['mean'] * 100:+.2f} (1 pair: no interval)"
    raw = _as_diff(d).describe(scale=100)
    if (adj := d.get("adjusted")) is None:
        return raw
    return (
        f"{raw}; Holm [{adj['low'] * 100:+.2f}, {adj['high'] * 100:+.2f}] p {adj['p']:.3g} {adj['verdict']}"
    )


def _loss(row: dict) -> str:
    if row["loss_last"] is None or not math.isfinite(row["loss_last"]):
        return "–"
    return f"{row['loss_first']:.3g} → {row['loss_last']:.3g}" + (
        " **saturated**" if row["saturated"] else ""
    )


def short(key: str) -> str:
    return key.removeprefix("sts_").removesuffix("_spearman_all")


def markdown(board: dict) -> str:
    """The leaderboard: the bases first, then the arms ranked; a second table per task."""
    h, ref = board["headline"], board["reference"]
    conf = f"{board['confidence']:.0%} CI, {'t over seed pairs' if board['interval'] == 't' else 'bootstrap'}"
    lines = [
        f"Ranked by mean {h} (×100) over seeds. Δ: paired by seed, mean [{conf}]; "
        '"indistinguishable" where the interval contains 0; where several arms are set against one reference '
        "(or base), Holm's adjusted interval (each at its step's level) and adjusted p follow the raw one, and "
        "the registration gate reads them. An interval covers the seed-to-seed variation of training on these "
        "fixed test sets, not the sampling of the test sets. Loss: the training loss at the first and the last "
        f"evaluation (mean over seeds); below {SATURATED_LOSS:g} the arm trains on no signal. Per-seed scores: "
        "the JSON beside this file.",
        "",
        f"| arm | method | pooling | n | {short(h)} ×100 | Δ vs base | Δ vs {ref or 'reference'} | dev ×100 | loss |",
        "|---|---|---|---:|---:|---|---|---:|---|",
    ]
    for pooling, b in board["bases"].items():
        lines.append(
            f"| **{b['label']}** (untouched, this run) | – | {pooling} | – | {_x100(b['test'].get(h))} | – | – "
            f"| {_x100(b.get('dev'))} | – |"
        )
    for r in board["rows"]:
        name = f"**{r['arm']}**" if r["arm"] == ref else r["arm"]
        lines.append(
            f"| {name} | {r['method']} | {r['pooling']} | {r['n']} | {_pm(r['mean'][h], r['std'][h])} | "
            f"{ci_text(r['vs_base'])} | {'(reference)' if r['arm'] == ref else ci_text(r['vs_reference'])} | "
            f"{_pm(r['dev_mean'], r['dev_std'])} | {_loss(r)} |"
        )
    budgets = [f"{r['arm']} {r['budget']}" for r in board["rows"] if r.get("budget")]
    if budgets:
        lines += ["", "Trained for (steps × global batch): " + "; ".join(budgets) + "."]
    others = [r for r in board["rows"] if r.get("vs_strongest_base")]
    if others:
        best = board["bases"][board["strongest_base"]]
        lines += [
            "",
            f"Against the untouched model read its strongest way, **{best['label']}** at "
            f"{_x100(best['test'].get(h))} (its user's yardstick), each arm read another way:",
            "",
        ]
        lines += [f"- {r['arm']} ({r['pooling']}): {ci_text(r['vs_strongest_base'])}" for r in others]
    keys = board["keys"]
    lines += [
        "",
        "Every test figure, mean ± std over seeds (×100):",
        "",
        "| arm | " + " | ".join(short(k) for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for b in board["bases"].values():
        lines.append(f"| {b['label']} | " + " | ".join(_x100(b["test"].get(k)) for k in keys) + " |")
    for r in board["rows"]:
        lines.append(f"| {r['arm']} | " + " | ".join(_pm(r["mean"][k], r["std"][k]) for k in keys) + " |")
    return "\n".join(lines)


def plot(board: dict, path) -> None:
    """Each arm's Δ headline vs its base with its interval as error bars (a horizontal bar chart)."""
    # lazy: only the plot needs matplotlib (the job's workers import the rest of this module)
    from matplotlib.figure import Figure

    rows = [r for r in board["rows"] if r["vs_base"] is not None]
    fig = Figure(figsize=(7.5, 0.5 * len(rows) + 1.7))
    ax = fig.subplots()
    for i, r in enumerate(rows):
        d = r["vs_base"]
        finite = math.isfinite(d["low"]) and math.isfinite(d["high"])
        err = [[(d["mean"] - d["low"]) * 100], [(d["high"] - d["mean"]) * 100]] if finite else None
        bars = ax.barh(
            i,
            d["mean"] * 100,
            xerr=err,
            capsize=4,
            color="tab:green"
            if r["gate"]
            else ("tab:gray" if d["verdict"] == "indistinguishable" else "tab:red"),
        )
        ci = f" [{d['low'] * 100:+.2f}, {d['high'] * 100:+.2f}]" if finite else ""
        ax.bar_label(bars, [f"{d['mean'] * 100:+.2f}{ci}"], fontsize=7, padding=6)
    # the leaderboard's first arm (ranked on the headline) marked; the base is the line at 0
    ax.set_yticks(
        range(len(rows)),
        [("★ " if r is board["rows"][0] else "") + f"{r['arm']} ({r['pooling']})" for r in rows],
    )
    ax.axvline(0, color="black", linewidth=0.8, label="the untouched base")
    ax.legend(fontsize=7, loc="lower right")
    ax.margins(x=0.35)  # room for the labels
    ax.set_xlabel(f"Δ {board['headline']} vs the untouched base, ×100 ({board['confidence']:.0%} CI)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def dumps(board: dict) -> str:
    """JSON with non-finite numbers as null."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(board), indent=2)
