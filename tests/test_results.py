"""Every figure in a result file names the command that made it, and that command still runs in today's tree: each
``python ...`` a result file (``bench/results/*.md``) or ``docs/RESULTS.md`` names is parsed by today's code - a
job's keys and values resolved with ``--print-config``, a script's flags found in its ``--help`` - and a command
whose script is gone, whose preset is gone or whose flag no longer exists fails here, naming the file."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from forked import run_forked

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "docs" / "RESULTS.md", *sorted((ROOT / "bench" / "results").glob("*.md"))]
COMMAND = re.compile(r"`((?:\.venv/bin/)?python [^`]+)`")
PLACEHOLDER = ("<", "$", "[", "...", "…")  # a command written as a pattern (`jobs/<job>.py`), not one to run
RESOLVES = {"train", "compare", "mine_negatives"}  # jobs whose --print-config resolves the whole config
MODES = ("--resume", "--status", "--take-over")  # what a command did, not what it reads


def named_commands() -> dict[tuple[str, ...], list[str]]:
    """Each distinct command (its words) → the files that name it."""
    out: dict[tuple[str, ...], list[str]] = {}
    for source in SOURCES:
        for span in COMMAND.findall(source.read_text(encoding="utf-8")):
            if not any(p in span for p in PLACEHOLDER):
                words = tuple(shlex.split(span))
                out.setdefault((Path(words[0]).name, *words[1:]), []).append(source.name)
    return out


def resolves(script: str) -> bool:
    """A job whose whole config ``--print-config`` resolves (a bench script answers ``--help``)."""
    path = Path(script)
    return path.parent.name == "jobs" and (path.stem in RESOLVES or path.stem.endswith("_sweep"))


def test_the_files_name_their_commands_and_the_extraction_reads_them():
    commands = named_commands()
    scripts = {c[1] for c in commands}
    assert len(commands) > 30 and {"jobs/compare.py", "bench/faults.py"} <= scripts  # the walk finds them
    assert ("python", "jobs/compare.py", "--preset", "qqp_retrieval") in {c[:4] for c in commands}


@pytest.mark.slow
def test_every_command_a_result_file_names_parses_in_todays_tree(tmp_path, job_server):
    commands = named_commands()
    missing = [f"{c[1]} ({', '.join(files)})" for c, files in commands.items() if not (ROOT / c[1]).is_file()]
    assert missing == [], f"result files name scripts that no longer exist: {missing}"
    cases, checks = [], {}
    for i, (words, files) in enumerate(sorted(commands.items())):
        script, args = words[1], [a for a in words[2:] if a not in MODES]
        argv = [*args, "--print-config"] if resolves(script) else ["--help"]
        cases.append((str(i), [str(ROOT / script), *argv], ROOT))
        checks[str(i)] = (words, files, resolves(script))
    got = run_forked(cases, tmp_path, jobs=job_server)
    failures = []
    for key, (words, files, resolved) in checks.items():
        res, where = got[key], f"{' '.join(words)} (in {', '.join(sorted(set(files)))})"
        if res["rc"] != 0:
            failures.append(f"{where}: exit {res['rc']}: {(res['stderr'].strip().splitlines() or [''])[-1]}")
        elif not resolved:  # a script without a config: each flag the command passes is one its --help lists
            unknown = [f for f in words[2:] if f.startswith("--") and f.split("=")[0] not in res["stdout"]]
            if unknown:
                failures.append(f"{where}: no such flag {unknown}")
    assert failures == [], "\n".join(failures)


def test_the_readme_results_table_is_the_one_the_json_gives():
    """README's results table is written by ``bench/readme_results.py --write`` from the result files' JSON: equal to
    what the script renders now (a figure typed by hand, or a file rerun without the table rewritten, fails), and each
    verdict agrees with its interval (the script refuses "seen" where the comparison's interval reaches 0)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import readme_results
    finally:
        sys.path.pop(0)
    text = (ROOT / "README.md").read_text()
    start, end = text.index(readme_results.BEGIN), text.index(readme_results.END) + len(readme_results.END)
    assert text[start:end] == readme_results.block()
    # the agreement check can fail: a "seen" verdict on an interval that covers 0 is refused
    row = next(r for r in readme_results.ROWS if r.file == "siamese_compare_topics_cpu")
    bad = readme_results.Row(row.method, row.setting, row.file, row.arm, row.versus, "seen")
    saved = readme_results.ROWS
    readme_results.ROWS = [bad]
    try:
        with pytest.raises(ValueError, match="verdict 'seen' but the interval says seen=False"):
            readme_results.table()
    finally:
        readme_results.ROWS = saved
