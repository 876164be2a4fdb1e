"""README's results table, written from the result files' JSON (never typed twice): one row per method and
setting, its paired difference against the untouched base and against the comparison its paper makes, each with
its 95% interval (Holm-adjusted where the file set several arms against one reference), and the verdict.

    python bench/readme_results.py           # print the table
    python bench/readme_results.py --write   # replace README's table with it (tests/test_results.py checks it)

The verdict is ours, and must agree with the figures: ``seen`` only where the paper's comparison lies above 0,
``not seen`` where it does not, ``not testable here`` with the reason this setup cannot show the effect.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results table: bench/readme_results.py --write -->", "<!-- end of results table -->"


@dataclass(frozen=True)
class Row:
    method: str
    setting: str
    file: str  # bench/results/<file>.json (a leaderboard)
    arm: str
    versus: str  # the paper's comparison: another arm (its vs_reference read, negated when ``arm`` is the reference)
    verdict: str


ROWS = [
    Row(
        "SIFTER-SimCSE",
        "[CLS] + MLP (the papers'), MiniLM, 40 steps × 64, 5 seeds; against SimCSE at its dropout",
        "sifter_deconfounded_cpu",
        "sifter",
        "simcse",
        "not seen: indistinguishable after Holm (adjusted p 0.051; SIFTER averaged, trained alike, fails the step "
        "before, so this interval's clearing 0 does not count); neither SIFTER's dropout 0.15 (+0.12 [−0.06, +0.30]) "
        "nor its views (+0.14 [−0.10, +0.38]) distinguishable alone: on the means they share the difference",
    ),
    Row(
        "SIFTER-SimCSE",
        "mean pooling (MiniLM's own), 5 seeds; against SimCSE",
        "sifter_compare_mean_cpu",
        "sifter",
        "simcse",
        "not testable here — because the contrastive loss is saturated (~1e-5): the batch's negatives are trivial",
    ),
    Row(
        "TSDAE",
        "adapting MiniLM on 4,286 tweets, 400 steps × 8 (the paper's batch), 3 seeds; against MLM as the paper sets it",
        "tsdae_compare_cpu",
        "tsdae",
        "mlm",
        "not testable here — because MiniLM is already sentence-trained (the paper adapts BERT-base, not here); "
        "TSDAE ahead on the mean, indistinguishable",
    ),
    Row(
        "TSDAE → SBERT",
        "TSDAE before STS-B training, 3 seeds; against STS-B training alone",
        "tsdae_supervised_cpu",
        "tsdae_sbert",
        "sbert",
        "not testable here — because of the same start, and no NLI stage (no NLI data ships)",
    ),
    Row(
        "SIFTER-LSTM",
        "SST-2, 10 seeds; against the plain LSTM",
        "sentiment_compare_cpu",
        "sifter-lstm",
        "lstm",
        "not seen: the paper's +0.47 lies inside the interval (not ruled out)",
    ),
    Row(
        "Siamese adaptation",
        "unseen crisis events, 3 seeds; against NAIVE at equal encoder work",
        "siamese_compare_crisis_cpu",
        "siamese",
        "naive",
        "seen",
    ),
    Row(
        "Siamese adaptation",
        "unseen topics, 3 seeds; against NAIVE",
        "siamese_compare_topics_cpu",
        "siamese",
        "naive",
        "not seen (the topic sets' roles are the paper's reversed: docs/FIDELITY.md)",
    ),
    Row(
        "Supervised contrastive",
        "QQP retrieval, mined hard negatives, 3 seeds; against in-batch negatives",
        "qqp_retrieval_compare_cpu",
        "mined",
        "in_batch",
        "not seen: MiniLM is near its ceiling on Quora questions (base nDCG@10 92.93)",
    ),
]


def interval(d: dict | None, sign: int = 1) -> str:
    """``+0.26 [+0.08, +0.44]`` (×100), Holm's adjusted interval where the file has one."""
    if not d:
        return "–"
    adj = d.get("adjusted")
    low, high = (adj["low"], adj["high"]) if adj else (d["low"], d["high"])
    mean, low, high = sign * d["mean"], *sorted((sign * low, sign * high))
    text = f"{mean * 100:+.2f} [{low * 100:+.2f}, {high * 100:+.2f}]".replace("-", "−")  # the README's minus
    return text + (" Holm" if adj else "")


def paper_side(board: dict, row: Row) -> tuple[dict | None, int]:
    """The comparison the paper makes, as the file holds it: ``arm`` against ``versus`` (sign -1: the file set
    ``versus`` against ``arm``, its reference)."""
    rows = {r["arm"]: r for r in board["rows"]}
    if board["reference"] == row.versus:
        return rows[row.arm]["vs_reference"], 1
    if board["reference"] == row.arm:
        return rows[row.versus]["vs_reference"], -1
    raise ValueError(f"{row.file}: neither {row.arm} nor {row.versus} is the reference {board['reference']}")


def above_zero(d: dict, sign: int) -> bool:
    """Seen: Holm's verdict where the file has one (an arm after a failed step fails, whatever its step-level
    interval), else the interval clear of 0 on the arm's side."""
    adj = d.get("adjusted") or d
    if "verdict" in adj:
        return adj["verdict"] == ("higher" if sign > 0 else "lower")
    return min(sign * adj["low"], sign * adj["high"]) > 0


def table() -> str:
    lines = [
        "| method | setting | vs the base | vs the paper's comparison | verdict | file |",
        "|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        board = json.loads((RESULTS / f"{row.file}.json").read_text())
        arm = {r["arm"]: r for r in board["rows"]}[row.arm]
        versus, sign = paper_side(board, row)
        seen = above_zero(versus, sign)
        if row.verdict.startswith("seen") != seen:  # the words agree with the figures, or nothing is written
            raise ValueError(
                f"{row.method} ({row.file}): verdict {row.verdict!r} but the interval says {seen=}"
            )
        lines.append(
            f"| {row.method} | {row.setting} | {interval(arm.get('vs_base'))} | {interval(versus, sign)} | "
            f"{row.verdict} | [`{row.file}.md`](bench/results/{row.file}.md) |"
        )
    head = board_note()
    return head + "\n\n" + "\n".join(lines)


def board_note() -> str:
    return (
        "Paired differences ×100 on each file's headline (STS average Spearman, TwitterPara AP, accuracy, Δ cosine "
        "distance, nDCG@10), mean [95% interval] over seed pairs, read from the files' JSON by "
        "`bench/readme_results.py`:"
    )


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="replace README's table with the one the JSON gives")
    args = ap.parse_args()
    if not args.write:
        print(block())
        return
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    README.write_text(text[:start] + block() + text[end:])
    print(f"wrote {README}")


if __name__ == "__main__":
    main()
