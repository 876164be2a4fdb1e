"""A finished comparison re-read with Holm's adjustment: which of its intervals survive several arms set
against one reference (or base)?

Result files written before the leaderboard kept per-seed scores hold each paired difference's mean and its
t interval over n seed pairs; for a t interval that is enough to recover the standard error exactly
(half-width = t_{(1+c)/2, n-1} · se), hence each comparison's p and its Holm step-level interval. Files written
since keep the per-seed scores and their own adjusted intervals; this script reads the older ones.

    python bench/holm_reread.py sifter_compare_cpu      # → bench/results/sifter_compare_cpu_holm.{md,json}
"""

from __future__ import annotations

import json

from _common import RESULTS, write_results
from scipy import stats


def _step(d: dict, rank: int, m: int, confidence: float) -> dict:
    se = (d["high"] - d["low"]) / (2 * stats.t.ppf(0.5 + confidence / 2, d["n"] - 1))
    p = float(2 * stats.t.sf(abs(d["mean"]) / se, d["n"] - 1))
    level = 1 - (1 - confidence) / (m - rank)
    half = float(stats.t.ppf(0.5 + level / 2, d["n"] - 1)) * se
    return {"p": p, "level": level, "low": d["mean"] - half, "high": d["mean"] + half}


def family(board: dict, side: str) -> dict[str, dict]:
    """Holm over every arm's ``side`` comparison (vs_reference, vs_base): raw and adjusted, by arm."""
    c = board["confidence"]
    members = {r["arm"]: r[side] for r in board["rows"] if r.get(side) and r[side]["n"] > 1}
    m = len(members)
    first = {a: _step(d, 0, 1, c)["p"] for a, d in members.items()}
    out, running = {}, 0.0
    for rank, arm in enumerate(sorted(members, key=first.get)):
        d, step = members[arm], _step(members[arm], rank, m, c)
        running = max(running, min(1.0, (m - rank) * step["p"]))
        survives = (
            running < 1 - c and step["low"] > 0 if d["mean"] > 0 else running < 1 - c and step["high"] < 0
        )
        out[arm] = {
            "raw": d,
            "p": step["p"],
            "p_adjusted": running,
            "level": step["level"],
            "low": step["low"],
            "high": step["high"],
            "survives": bool(survives),
        }
    return out


def _ci(mean: float, low: float, high: float) -> str:
    return f"{mean * 100:+.2f} [{low * 100:+.2f}, {high * 100:+.2f}]"


def main(name: str) -> None:
    board = json.loads((RESULTS / f"{name}.json").read_text())
    if board["interval"] != "t":
        raise SystemExit(
            f"{name}: a {board['interval']} interval; only t intervals give back their standard error"
        )
    fams = {side: family(board, side) for side in ("vs_reference", "vs_base")}
    lines = [
        f"# `{name}` re-read with Holm's adjustment",
        "",
        f"Command: `python bench/holm_reread.py {name}`. Source: `bench/results/{name}.md` (its command there); "
        f"headline {board['headline']}, ×100, {board['confidence']:.0%} t intervals over seed pairs. Each interval "
        "covers the seed-to-seed variation of training on fixed test sets. Holm: the arm with the i-th smallest p "
        "of m is set at confidence 1 − α/(m − i + 1); its adjusted p is the running maximum of (m − i + 1)·p; a "
        "difference survives when its adjusted p is below α and its step-level interval excludes 0.",
        "",
    ]
    for side, title in (
        ("vs_reference", f"against the reference arm `{board['reference']}`"),
        ("vs_base", "against the untouched base read the arm's way"),
    ):
        fam = fams[side]
        lines += [
            f"## {len(fam)} arms {title}",
            "",
            "| arm | Δ raw [95%] | p | Holm level | Δ Holm-adjusted | adjusted p | survives |",
            "|---|---|---:|---:|---|---:|---|",
        ]
        for arm, f in sorted(fam.items(), key=lambda kv: kv[1]["p"]):
            d = f["raw"]
            lines.append(
                f"| {arm} | {_ci(d['mean'], d['low'], d['high'])} | {f['p']:.3g} | {f['level']:.4f} | "
                f"{_ci(d['mean'], f['low'], f['high'])} | {f['p_adjusted']:.3g} | "
                f"{'**yes**' if f['survives'] else 'no'} |"
            )
        lines.append("")
    survivors = {side: [a for a, f in fam.items() if f["survives"]] for side, fam in fams.items()}
    lines += [
        f"Surviving against `{board['reference']}`: {', '.join(survivors['vs_reference']) or 'none'}; "
        f"against the base: {', '.join(survivors['vs_base']) or 'none'}."
    ]
    write_results(
        f"{name}_holm",
        {"source": name, "families": fams, "survivors": survivors, "confidence": board["confidence"]},
        "\n".join(lines),
    )
    print("\n".join(lines))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "name", nargs="?", default="sifter_compare_cpu", help="bench/results/NAME.json to re-read"
    )
    main(ap.parse_args().name)
