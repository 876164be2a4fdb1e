"""The README's "Your own data" commands are accepted as written: every job's keys and values validate
(``--print-config``), and every flag the evaluation command uses exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from forked import run_forked

ROOT = Path(__file__).resolve().parents[1]


def own_data_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.startswith(".venv/bin/python jobs/")]


@pytest.mark.slow
def test_the_own_data_commands_are_accepted_as_written(tmp_path, job_server):
    commands = own_data_commands()
    assert {c[1] for c in commands} == {
        "jobs/train.py",
        "jobs/evaluate.py",
        "jobs/compare.py",
        "jobs/mine_negatives.py",
    } and len(commands) == 7
    # each as a real process, forked by the session's job server (it imported the jobs' libraries once);
    # evaluate.py has no --print-config: its --help lists every flag the command uses
    got = run_forked(
        [
            (
                str(i),
                [
                    str(ROOT / c[1]),
                    *(["--help"] if c[1] == "jobs/evaluate.py" else [*c[2:], "--print-config"]),
                ],
                ROOT,
            )
            for i, c in enumerate(commands)
        ],
        tmp_path,
        jobs=job_server,
    )
    for i, cmd in enumerate(commands):
        res = got[str(i)]
        assert res["rc"] == 0, (cmd, res["stderr"][-2000:])
        if cmd[1] == "jobs/evaluate.py":
            assert all(f in res["stdout"] for f in cmd[2:] if f.startswith("--")), cmd
        if "data.corpus=my_corpus.txt" in cmd:
            assert "corpus: my_corpus.txt" in res["stdout"]
        if cmd[3] == "siamese":
            assert "path: my_train.tsv" in res["stdout"] and "name: held_out" in res["stdout"]
        if cmd[3] == "supervised_contrastive":
            assert "format: parquet" in res["stdout"] and "beir_mine: my_beir_folder" in res["stdout"]
            assert "- negative_1" in res["stdout"]
        if cmd[1] == "jobs/mine_negatives.py":
            assert "format: beir" in res["stdout"] and "path: my_beir_folder" in res["stdout"]
            assert "limit: null" in res["stdout"] and "where: null" in res["stdout"]
