"""``--resume`` of a sweep that already finished and published (#39.4): the smoke sweep run once, then resumed
(answered from its record, ``published.json``: no Ray, no corpus, no base measured again), then resumed with
that record moved aside - the whole resume path every finished sweep's resume took before - and the record
put back. Wall times side by side in one run; results in bench/results/resume_finished.{json,md}.

    python bench/resume_finished.py [--name NAME]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _common import ROOT, write_results


def job(*args: str) -> tuple[float, int, str]:
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "sifter_sweep.py"), "--preset", "smoke", "--no-progress", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    last = (res.stdout.strip().splitlines() or [""])[-1]
    return time.time() - t0, res.returncode, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default=f"resume-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    args = ap.parse_args()
    record = ROOT / "outputs" / "sweeps" / args.name / "published.json"
    fresh = job("--name", args.name)
    assert fresh[1] == 0 and record.is_file(), fresh
    answered = job("--name", args.name, "--resume")
    aside = record.with_suffix(".aside")
    record.rename(aside)
    try:
        full = job("--name", args.name, "--resume")
    finally:
        if record.exists():
            aside.unlink()
        else:
            aside.rename(record)
    rows = [
        ("the sweep itself", fresh),
        ("`--resume`, answered from its record", answered),
        ("`--resume` without the record (the whole path: Ray, corpus, base, Tune restore, publish)", full),
    ]
    md = [
        "# `--resume` of a finished, published sweep (#39.4)",
        "",
        f"`python bench/resume_finished.py --name {args.name}` on this 2-core machine: the smoke sweep "
        "(`jobs/sifter_sweep.py --preset smoke`), then its `--resume` twice, one after the other.",
        "",
        "| run | wall (s) | exit | last line |",
        "|---|---:|---:|---|",
    ]
    md += [f"| {what} | {t:.1f} | {rc} | {last[:180]} |" for what, (t, rc, last) in rows]
    md += [
        "",
        f"Resumed from its record: **{answered[0]:.1f} s** against {full[0]:.1f} s for the whole path "
        f"({full[0] / max(answered[0], 1e-9):.0f}× less); target < 15 s.",
    ]
    write_results(
        "resume_finished",
        {
            "name": args.name,
            "rows": [
                {"run": what, "wall_s": t, "exit": rc, "last_line": last} for what, (t, rc, last) in rows
            ],
        },
        "\n".join(md),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
