"""Siamese adaptation as the paper's Table 1 sets it (#36.3): the three comparisons' leaderboards side by side
and the paper's claim tested as it states it.

Each experiment is one ``jobs/compare.py`` run (ORIG measured in it, NAIVE the reference arm, 3 paired seeds):

    python jobs/compare.py --preset siamese_sentiment --out bench/results/siamese_compare_sentiment_cpu.md
    python jobs/compare.py --preset siamese_topics --out bench/results/siamese_compare_topics_cpu.md
    python jobs/compare.py --preset siamese_crisis --out bench/results/siamese_compare_crisis_cpu.md
    python bench/siamese_compare.py

The claim (Kruspe 2020): where the test classes are the training classes, NAIVE (a classifier fine-tuned end to
end) is as good as SIAMESE; on classes it never saw, SIAMESE is ahead. "Seen" when SIAMESE − NAIVE's interval is
above 0 on the unseen-class experiments and does not lie above 0 on the seen-class one.
"""

from __future__ import annotations

import json

from _common import RESULTS, write_results

EXPERIMENTS = {  # experiment → whether its test classes are its training classes
    "sentiment": True,
    "topics": False,
    "crisis": False,
}


def _x(v: float) -> str:
    return f"{v * 100:.2f}"


def _ci(d: dict | None) -> str:
    if not d:
        return "–"
    return f"{d['mean'] * 100:+.2f} [{d['low'] * 100:+.2f}, {d['high'] * 100:+.2f}] {d['verdict']}"


def read(experiment: str) -> dict:
    return json.loads((RESULTS / f"siamese_compare_{experiment}_cpu.json").read_text())


def claim(boards: dict[str, dict]) -> tuple[dict[str, str], str]:
    """Per experiment what SIAMESE − NAIVE shows against what the paper says, and the overall verdict."""
    per, held = {}, []
    for exp, board in boards.items():
        row = next(r for r in board["rows"] if r["arm"] == "siamese")
        d = row["vs_reference"]
        above = d["low"] > 0
        if EXPERIMENTS[exp]:  # seen classes: NAIVE as good
            ok = not above
            per[exp] = f"seen classes: NAIVE {'as good (as the paper)' if ok else 'behind (not the paper)'}"
        else:
            ok = above
            per[exp] = (
                f"unseen classes: SIAMESE {'ahead (as the paper)' if ok else 'not ahead (not the paper)'}"
            )
        held.append(ok)
    verdict = "seen" if all(held) else ("partly seen" if any(held) else "not seen")
    return per, verdict


def main() -> None:
    boards = {e: read(e) for e in EXPERIMENTS}
    per, verdict = claim(boards)
    lines = [
        "# Siamese adaptation as the paper's Table 1 sets it: ORIG / NAIVE / SIAMESE / ALL over 3 paired seeds",
        "",
        f"**The paper's claim is {verdict} here.** " + "; ".join(f"{e}: {t}" for e, t in per.items()) + ".",
        "",
        "MiniLM (mean pooling) adapted per experiment, each set in a role we chose - not the paper's for two "
        "of the three (`docs/FIDELITY.md`, Siamese): sentiment: Sentiment140's 359 hand-labelled test tweets "
        "train (the paper: its 1.6M training tweets, not here) and Sanders tests; topics: Sanders' 4 company "
        "topics train, the PIT-2015 (SemEval) trending topics test (the paper: SemEval trains, Sanders tests); "
        "crisis: 6 CrisisLexT26 events train, 3 unseen events test (the paper: CrisisNLP trains, CrisisLexT26 "
        "tests). Equal encoder work: SIAMESE and ALL 60 steps of 16 "
        "pairs; NAIVE a 60-step head-only warm-up (ours: a fresh head's gradients are noise to the encoder) then "
        "60 joint steps of 32 texts. Constant lr 2e-5, the last checkpoint. Δ cosine distance ×100 on 5,000 "
        "same- and 5,000 different-class test pairs; same-class MAP ×100. Differences are paired by seed, "
        "mean [95% t interval]; NAIVE is the reference arm; ORIG is measured in each run.",
        "",
        "| experiment | test set (classes) | ORIG | NAIVE | SIAMESE | ALL | SIAMESE − NAIVE | SIAMESE − ORIG | wall |",
        "|---|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for exp, b in boards.items():
        h = b["headline"]
        rows = {r["arm"]: r for r in b["rows"]}
        base = next(iter(b["bases"].values()))["test"][h]

        def cell(arm, rows=rows, h=h):
            r = rows[arm]
            return f"{_x(r['mean'][h])} ± {_x(r['std'][h])}"

        test = h.removesuffix("_delta")
        seen = "seen" if EXPERIMENTS[exp] else "unseen"
        lines.append(
            f"| {exp} | {test} ({seen}) | {_x(base)} | {cell('naive')} | {cell('siamese')} | {cell('all')} | "
            f"{_ci(rows['siamese']['vs_reference'])} | {_ci(rows['siamese']['vs_base'])} | "
            f"{b['wall_s'] / 60:.1f} min |"
        )
    lines += [
        "",
        "Same-class MAP ×100 (mean ± std over seeds; ORIG from the same run):",
        "",
        "| experiment | ORIG | NAIVE | SIAMESE | ALL |",
        "|---|---:|---:|---:|---:|",
    ]
    for exp, b in boards.items():
        key = b["headline"].removesuffix("_delta") + "_map"
        rows = {r["arm"]: r for r in b["rows"]}
        base = next(iter(b["bases"].values()))["test"].get(key, float("nan"))
        lines.append(
            f"| {exp} | {_x(base)} | "
            + " | ".join(
                f"{_x(rows[a]['mean'][key])} ± {_x(rows[a]['std'][key])}" for a in ("naive", "siamese", "all")
            )
            + " |"
        )
    lines += [
        "",
        "Reading (the run of 2026-12-05, code at 9e513f3): SIAMESE beats ORIG on Δ in every experiment, and ALL "
        "(the same 60 steps spread over three sets) is below SIAMESE everywhere and no better than ORIG on two "
        "sets (crisis: indistinguishable; topics: −9.04). Against NAIVE the claim holds on the unseen crisis events (+10.55) and not on the unseen PIT-2015 "
        "topics, where SIAMESE − NAIVE is indistinguishable on Δ and NAIVE has the higher MAP (84.07 vs 81.40; a "
        "4-topic training set teaches little about 163 new topics). On the seen sentiment classes SIAMESE is far "
        "ahead, where the paper finds NAIVE as good: NAIVE's classifier fits Sentiment140's 323 training tweets "
        "(loss 0.0013 at the end, the sentiment leaderboard) - with the paper's 1.6M tweets it could not.",
        "",
        "Each experiment's full leaderboard (every arm against ORIG and NAIVE, the training loss, the command): "
        + ", ".join(f"`siamese_compare_{e}_cpu.md`" for e in boards)
        + ".",
    ]
    write_results("siamese_compare_cpu", {"verdict": verdict, "per_experiment": per}, "\n".join(lines))


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main()
