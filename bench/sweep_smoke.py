"""Record the main job (`make sweep` = `jobs/sifter_sweep.py --preset smoke`) as a user meets it: wall time
of the whole job, lines it prints, every trial beside the untouched base model measured in the same run,
candidate − base per STS task, and the registration gate's verdict.

    python bench/sweep_smoke.py                 # runs the job (in a fresh outputs/ of this checkout)
    python bench/sweep_smoke.py --name NAME     # an existing sweep's outputs only (no wall time / lines)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _common import ROOT, write_results

TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name")
    ap.add_argument("--preset", default="smoke")
    args = ap.parse_args()
    name, wall, lines, gate = args.name, None, None, None
    if name is None:
        name = f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        t0 = time.time()
        res = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "sifter_sweep.py"), "--preset", args.preset, "--name", name],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        wall = (time.time() - t0) / 60
        out = (res.stdout + res.stderr).strip().splitlines()
        if res.returncode != 0:
            sys.exit("\n".join(out[-40:]))
        lines, gate = len(out), res.stdout.strip().splitlines()[-1]
    report = ROOT / "outputs" / "reports" / name
    rows = json.loads((report / "trials.json").read_text())
    base = json.loads((report / "base.json").read_text())
    confirmed = (
        report / "leaderboard.json"
    )  # explore, then confirm: the confirmed setting's mean over its seeds
    if confirmed.is_file():
        board = json.loads(confirmed.read_text())
        top = board["rows"][0]
        best = top["mean"]
        extra = (
            f"Confirm: {top['arm']} over seeds {top['seeds']}, test avg − base "
            f"{top['vs_base']['mean'] * 100:+.2f} [{top['vs_base']['low'] * 100:+.2f}, {top['vs_base']['high'] * 100:+.2f}] "
            f"(the candidate row below: its mean over those seeds; the trial rows: the explore stage, one seed each)."
        )
    else:  # confirm.seeds: 0 - the best trial's own test
        best = json.loads((ROOT / "outputs" / "models" / name / "test.json").read_text())["metrics"]
        extra = "Unconfirmed (confirm.seeds: 0): the candidate row is the best explore trial's own test."
    key = lambda t: f"sts_{t}_spearman_all"  # noqa: E731
    md = [f"# Main job `{name}` (`python jobs/sifter_sweep.py --preset {args.preset}`, 2-core CPU)", ""]
    if wall is not None:
        md += [
            f"Whole job **{wall:.1f} min** (Ray start, corpus build, the base model's evaluation, {len(rows)} explore "
            "trials, the confirm stage's trials and their 7-task tests, MLflow logging + registration, report); "
            f"it printed {lines} lines. Last line: `{gate}`",
            "",
        ]
    md += [extra, ""]
    md += [
        "| model | STS-B dev | " + " | ".join(TASKS) + " | avg |",
        "|---|---:|" + "---:|" * (len(TASKS) + 1),
        f"| {base['label']}, untouched, this run | {base['dev'] * 100:.2f} | "
        + " | ".join(f"{base['test'][key(t)] * 100:.2f}" for t in TASKS)
        + f" | {base['test']['sts_avg_spearman_all'] * 100:.2f} |",
        f"| candidate: {rows[0]['trial']} | {rows[0]['best_dev'] * 100:.2f} | "
        + " | ".join(f"{best[key(t)] * 100:.2f}" for t in TASKS)
        + f" | {best['sts_avg_spearman_all'] * 100:.2f} |",
        f"| candidate − base | {(rows[0]['best_dev'] - base['dev']) * 100:+.2f} | "
        + " | ".join(f"{(best[key(t)] - base['test'][key(t)]) * 100:+.2f}" for t in TASKS)
        + f" | {(best['sts_avg_spearman_all'] - base['test']['sts_avg_spearman_all']) * 100:+.2f} |",
        "",
        "Every trial (STS-B dev Spearman ×100 at each evaluation; all ran the same steps):",
        "",
        "| trial | " + " | ".join(f"step {int(h['step'])}" for h in rows[0]["history"]) + " |",
        "|---|" + "---:|" * len(rows[0]["history"]),
    ]
    md += [
        f"| {r['trial']} | " + " | ".join(f"{h['stsb_dev_spearman'] * 100:.2f}" for h in r["history"]) + " |"
        for r in rows
    ]
    md += [
        "",
        "Spearman `all` ×100, mean pooling (MiniLM's own) for the base and every trial. One seed per setting "
        "here: the seeded comparisons (5 seeds, `jobs/compare.py`) are `sifter_compare_cpu.md` and `sifter_compare_mean_cpu.md`.",
    ]
    write_results(
        "sweep_smoke",
        {
            "sweep": name,
            "wall_min": wall,
            "lines": lines,
            "gate": gate,
            "base": base,
            "candidate_test": best,
            "trials": rows,
        },
        "\n".join(md),
    )


if __name__ == "__main__":
    main()
