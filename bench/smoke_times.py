"""Wall time of every job's smoke preset on this machine (#22.4: each should finish in <= 10 minutes on 2 cores).

Each job runs as a newcomer runs it - `python jobs/<job>.py --preset smoke` (`jobs/train.py --method M --preset smoke`
for the single-method runs) - one after the other, nothing else running, each with fresh run storage and a fresh
MLflow store under --out (so every corpus is built, every base model measured, as on a first run). A benchmark,
not a test: the figures go to bench/results/smoke_times_measured.{json,md}; a run of some jobs keeps the other
jobs' earlier records (each with its own commit and date).

    python bench/smoke_times.py                                 # every job (about an hour and a half here)
    python bench/smoke_times.py --jobs tsdae_sweep train:tsdae  # some of them
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT, write_results

JOBS = {
    "sifter_sweep": ["jobs/sifter_sweep.py"],
    "tsdae_sweep": ["jobs/tsdae_sweep.py"],
    "sentiment_sweep": ["jobs/sentiment_sweep.py"],
    "siamese_compare": ["jobs/compare.py", "--preset", "siamese_topics"],
    "parabart_sweep": ["jobs/parabart_sweep.py"],
    **{
        f"train:{m}": ["jobs/train.py", "--method", m]
        for m in ("sifter_simcse", "simcse", "tsdae", "sifter_lstm", "parabart")
    },
}
TARGET_MIN = 10.0
NAME = "smoke_times_measured"


def commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def run_job(job: str, out: Path) -> dict:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = out / job.replace(":", "-")
    work.mkdir(parents=True, exist_ok=True)
    cmd = [*JOBS[job], "--preset", "smoke", "--name", f"smoke-times-{stamp}", "--no-progress"]
    args = [*cmd, "--storage", str(work / "store"), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"]
    at = commit()  # the code the job starts with (HEAD may move while it runs)
    t0 = time.time()
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    wall = (time.time() - t0) / 60
    (work / "output.log").write_text(res.stdout + res.stderr)
    return {
        "job": job,
        "command": "python " + " ".join(cmd),
        "wall_min": round(wall, 2),
        "within_target": wall <= TARGET_MIN,
        "returncode": res.returncode,
        "last_line": outcome(res.stdout),
        "log": str(work / "output.log"),
        "commit": at,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def outcome(text: str) -> str:
    """What the job ended with: a sweep's registration gate line, else the train job's dev score beside its
    base's (from the JSON summary it prints last), else its last line. Reads a log with stderr in it too."""
    gates = [
        ln for ln in text.splitlines() if ln.startswith(("candidate:", "the sweep found nothing better"))
    ]
    if gates:
        return gates[-1][:300]
    summary = {}
    for block in reversed(re.findall(r"^\{\n.*?^\}$", text, re.S | re.M)):  # the last that parses
        try:
            summary = json.loads(block)
            break
        except ValueError:
            continue
    if summary.get("best_dev") is not None:
        base = summary.get("base_dev")
        return f"best dev {summary['best_dev'] * 100:.2f}" + (
            f" vs base {base * 100:.2f}" if base is not None else ""
        )
    test = next((k for k in summary if k.startswith("test_")), None)
    if test is not None:  # no dev set (TSDAE): the test headline beside the base's
        base = summary.get(f"base_{test}")
        return f"{test} {summary[test] * 100:.2f}" + (
            f" vs base {base * 100:.2f}" if base is not None else ""
        )
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def markdown(records: dict) -> str:
    rows = [
        "| job | command | wall (min) | <= 10 min | exit | commit, date | last line |",
        "|---|---|---:|:---:|---:|---|---|",
    ]
    for job in JOBS:
        r = records.get(job)
        if r is None:
            rows.append(f"| {job} | | not run by this script yet (see `smoke_times.md`) | | | | |")
            continue
        last = r["last_line"].replace("|", "\\|")
        rows.append(
            f"| {job} | `{r['command']}` | {r['wall_min']:.1f} | {'yes' if r['within_target'] else '**no**'} | "
            f"{r['returncode']} | {r['commit']}, {r['date']} | {last} |"
        )
    return "\n".join(
        [
            "# Smoke presets: wall time of each job (#22.4)",
            "",
            "`python bench/smoke_times.py [--jobs ...]`: each job's smoke preset run as a newcomer runs it, one after",
            "the other with nothing else running, fresh run storage and MLflow store each (corpora built, base",
            f"models measured). Target: <= {TARGET_MIN:.0f} minutes on this 2-core machine. Rows keep the commit and",
            "date they were measured at; `smoke_times.md` explains where each job's time goes.",
            "",
            *rows,
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    ap.add_argument(
        "--out", type=Path, default=None, help="where each job's storage, MLflow store and log go"
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the table from the recorded runs (and "
        "their logs, where still on this machine); run nothing",
    )
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="sieve-smoke-times-"))
    path = RESULTS / f"{NAME}.json"
    records = json.loads(path.read_text()).get("jobs", {}) if path.is_file() else {}
    if args.report_only:
        for r in records.values():
            if Path(r["log"]).is_file():
                r["last_line"] = outcome(Path(r["log"]).read_text())
        write_results(NAME, {"target_min": TARGET_MIN, "jobs": records}, markdown(records))
        return
    for job in args.jobs:
        print(f"{job} ...", flush=True)
        records[job] = run_job(job, out)
        print(f"{job}: {records[job]['wall_min']:.1f} min, exit {records[job]['returncode']}", flush=True)
        write_results(NAME, {"target_min": TARGET_MIN, "jobs": records}, markdown(records))  # after each job


if __name__ == "__main__":
    main()
