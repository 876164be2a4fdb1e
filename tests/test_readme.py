"""The README's "Your own data" commands are accepted as written: every job's keys and values validate
(``--print-config``), and every flag the evaluation command uses exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def own_data_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.startswith(".venv/bin/python jobs/")]


@pytest.mark.slow
def test_the_own_data_commands_are_accepted_as_written():
    commands = own_data_commands()
    assert {c[1] for c in commands} == {"jobs/train.py", "jobs/evaluate.py", "jobs/compare.py"} and len(
        commands
    ) == 4
    for cmd in commands:
        args = [sys.executable, *cmd[1:]]
        if cmd[1] == "jobs/evaluate.py":  # no --print-config: its flags exist
            helptext = subprocess.run(
                [sys.executable, cmd[1], "--help"], cwd=ROOT, capture_output=True, text=True
            ).stdout
            assert all(f in helptext for f in cmd[2:] if f.startswith("--")), cmd
            continue
        res = subprocess.run([*args, "--print-config"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (cmd, res.stderr[-2000:])
        if "data.corpus=my_corpus.txt" in cmd:
            assert "corpus: my_corpus.txt" in res.stdout
        if cmd[3] == "siamese":
            assert "path: my_train.tsv" in res.stdout and "name: held_out" in res.stdout
