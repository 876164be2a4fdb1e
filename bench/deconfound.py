"""What carries SIFTER's difference from SimCSE: ``configs/compare/sifter_deconfounded.yaml``'s arms, each change
on its own, read from the comparison's per-seed scores (``bench/results/sifter_deconfounded_cpu.json``).

    python jobs/compare.py --preset sifter_deconfounded --out bench/results/sifter_deconfounded_cpu.md
    python bench/deconfound.py        # appends the section below to that file, and its JSON beside it

Three paired differences on the 7-task STS average, one family (Holm-adjusted over the three):
  dropout          simcse_d15 − simcse       SimCSE's dropout 0.1 → SIFTER's 0.15, nothing else
  views            sifter_avg − simcse_d15   SIFTER's three pairs for SimCSE's one, the loss at one term's scale
  loss scale       sifter − sifter_avg       the sum of three terms for their mean, nothing else
(sifter − simcse, the comparison ``sifter_cls`` made, is their sum.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.stats import holm  # noqa: E402 - the repo root on the path first

RESULTS = ROOT / "bench" / "results"
STEPS = {  # name → (arm, minus arm, what changes)
    "dropout": ("simcse_d15", "simcse", "SimCSE at dropout 0.15 instead of 0.1"),
    "views": (
        "sifter_avg",
        "simcse_d15",
        "SIFTER's three pairs instead of SimCSE's one, the loss at one term's scale",
    ),
    "loss scale": ("sifter", "sifter_avg", "the three terms summed instead of averaged"),
}
MARK = "\n## What carries the difference (`python bench/deconfound.py`)\n"


def read(name: str) -> tuple[dict, str]:
    board = json.loads((RESULTS / f"{name}.json").read_text())
    return board, board["headline"]


def carry(board: dict, headline: str) -> dict:
    scores = {r["arm"]: {s: v[headline] for s, v in r["per_seed"].items()} for r in board["rows"]}
    family = {k: (scores[a], scores[b]) for k, (a, b, _) in STEPS.items()}
    out = {}
    for k, adj in holm(family, confidence=board["confidence"]).items():
        raw, step = adj.raw, adj.interval
        out[k] = {
            "arms": list(STEPS[k][:2]),
            "n": raw.n,
            "mean": raw.mean,
            "low": raw.low,
            "high": raw.high,
            "p": raw.p,
            # Holm's verdict: the adjusted p below α and the step-level interval clear of 0 (an arm after a failed
            # step never passes, whatever its interval)
            "holm": {
                "low": step.low,
                "high": step.high,
                "p": adj.p_adjusted,
                "verdict": step.verdict if adj.p_adjusted < 1 - board["confidence"] else "indistinguishable",
            },
        }
    return out


def section(found: dict, headline: str) -> str:
    lines = [
        MARK,
        f"Paired by seed on {headline} (×100), one family of three, Holm-adjusted (each at its step's level):",
        "",
        "| change | arms | mean | 95% interval | Holm interval | adjusted p | verdict |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for k, d in found.items():
        h = d["holm"]
        lines.append(
            f"| {k}: {STEPS[k][2]} | {d['arms'][0]} − {d['arms'][1]} | {d['mean'] * 100:+.2f} | "
            f"[{d['low'] * 100:+.2f}, {d['high'] * 100:+.2f}] | [{h['low'] * 100:+.2f}, {h['high'] * 100:+.2f}] | "
            f"{h['p']:.3f} | {h['verdict']} |"
        )
    carriers = [k for k, d in found.items() if d["holm"]["verdict"] != "indistinguishable"]
    lines += [
        "",
        "What carries it: "
        + (
            ", ".join(f"{k} ({found[k]['holm']['verdict']})" for k in carriers)
            if carriers
            else "none of the three on its own is distinguishable from no change at this scale"
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="sifter_deconfounded_cpu", help="bench/results/NAME.json and NAME.md")
    args = ap.parse_args()
    board, headline = read(args.name)
    found = carry(board, headline)
    md = RESULTS / f"{args.name}.md"
    text = md.read_text()
    text = text.split(MARK)[0].rstrip("\n") + "\n" + section(found, headline)
    md.write_text(text)
    (RESULTS / f"{args.name}_carry.json").write_text(json.dumps(found, indent=2) + "\n")
    print(section(found, headline))


if __name__ == "__main__":
    main()
