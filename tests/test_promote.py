"""jobs/promote.py against a real (embedded) MLflow registry."""

import subprocess
import sys
from pathlib import Path

import pytest
from forked import run_forked

from orchestrator import tracking

ROOT = Path(__file__).resolve().parents[1]


def promote(cwd, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "promote.py"), "--model", "enc", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _bad_alias_message() -> str:
    from mlflow.utils.validation import _BAD_ALIAS_CHARACTERS_MESSAGE

    return _BAD_ALIAS_CHARACTERS_MESSAGE


BAD_ALIAS = _bad_alias_message()


def promote_in_turn(cwd, cases: list[list[str]], jobs) -> list[tuple[int, str]]:
    """``promote.py --model enc ARGS`` for each case, one after the other, forked by the session's job server
    (tests/forked.py): (exit code, stderr)."""
    job = str(ROOT / "jobs" / "promote.py")
    got = run_forked(
        [(str(i), [job, "--model", "enc", *a], cwd) for i, a in enumerate(cases)], cwd, serial=True, jobs=jobs
    )
    return [(got[str(i)]["rc"], got[str(i)]["stderr"]) for i in range(len(cases))]


@pytest.mark.slow
def test_promote_moves_champion_and_refuses_worse(embedded_tracking, tiny_bert_dir, job_server):
    import mlflow

    tracking.setup(None, "sieve")
    with mlflow.start_run():
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    good = tracking.register(info.model_uri, "enc", alias="candidate", tags={"test_score": "0.70"})
    worse = tracking.register(info.model_uri, "enc", tags={"test_score": "0.60"})

    desc = mlflow.MlflowClient().get_registered_model("enc").description  # what the aliases mean
    assert "**champion**" in desc and "jobs/promote.py --model enc --from-alias candidate" in desc
    res = promote(embedded_tracking, "--version", str(good))  # one plain run, as a user types it
    assert res.returncode == 0, res.stderr
    assert tracking.alias_version("enc", "champion") == good

    worded = tracking.register(info.model_uri, "enc", tags={"test_score": "0.70", "note": "good"})
    refused, forced, missing, no_metric, no_alias, no_from, *bad = promote_in_turn(
        embedded_tracking,
        [
            ["--version", str(worse)],
            ["--version", str(worse), "--force"],
            ["--version", "99"],
            # what it cannot compare is refused, and @champion stays where it is (v2, forced above)
            ["--version", str(good), "--metric", "test_nope"],
            ["--version", str(good), "--alias", " "],
            ["--from-alias", "nope"],
            # refused before any registry call: MLflow's alias rules, a tag that is not a number
            ["--version", str(good), "--alias", "latest"],
            ["--version", str(good), "--alias", "v3"],
            ["--version", str(good), "--alias", "my champion"],
            ["--version", str(worded), "--metric", "note"],
        ],
        job_server,
    )
    assert refused[0] == 2 and "Traceback" not in refused[1]
    assert "refusing to promote enc v2 (test_score=0.6) over @champion v1" in refused[1]  # v1 held it then
    assert forced[0] == 0, forced[1]
    assert missing[0] == 2 and missing[1].strip() == "error: model 'enc' has no version 99"
    assert no_metric[0] == 2 and "Traceback" not in no_metric[1], no_metric[1]
    assert (
        no_metric[1].strip() == "error: --metric 'test_nope': enc v1 has no such tag (its tags: test_score)"
    )
    assert no_alias[0] == 2 and no_alias[1].strip() == "error: --alias is empty"
    assert no_from[0] == 2 and no_from[1].strip() == "error: model 'enc' has no alias 'nope'"
    assert [(rc, err.strip().splitlines()[-1]) for rc, err in bad] == [
        (2, "error: --alias 'latest': 'latest' alias name (case insensitive) is reserved."),
        (2, "error: --alias 'v3': Version alias name 'v3' is reserved."),
        (2, f"error: --alias 'my champion': Invalid alias name: 'my champion'. {BAD_ALIAS}"),
        (2, f"error: --metric 'note': enc v{worded}'s tag is 'good', not a number"),
    ]
    assert tracking.alias_version("enc", "champion") == worse  # forced, then held through every refusal
    # a version whose own run found it no better than the untouched base: refused however high its tag
    unbeaten = tracking.register(info.model_uri, "enc", tags={"test_score": "0.90", "beats_base": "false"})
    [(rc, err)] = promote_in_turn(embedded_tracking, [["--version", str(unbeaten)]], job_server)
    assert (rc, err.strip()) == (
        2,
        f"error: refusing to promote enc v{unbeaten}: it was registered with beats_base=false (it did not beat "
        "the untouched base model in its own run); pass --force to do it anyway",
    )
    assert tracking.alias_version("enc", "champion") == worse


@pytest.mark.slow
def test_a_champion_set_through_the_rest_api_is_what_the_next_job_reads(
    mlflow_server, tiny_bert_dir, tmp_path, monkeypatch, job_server
):
    """Promotion where the MLflow UI does it - its REST call moves @champion - and a job that reads
    ``models:/enc@champion`` gets that version (and can log its scores to the version's run)."""
    import json
    import urllib.request

    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    tracking.setup(None, "rest")
    with mlflow.start_run() as run:
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    v1 = tracking.register(info.model_uri, "rest-enc", tags={"test_score": "0.5"})
    v2 = tracking.register(info.model_uri, "rest-enc", tags={"test_score": "0.6"})
    body = json.dumps({"name": "rest-enc", "alias": "champion", "version": str(v2)}).encode()
    req = urllib.request.Request(
        f"{mlflow_server}/api/2.0/mlflow/registered-models/alias",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    assert tracking.alias_version("rest-enc", "champion") == v2 != v1
    res = job_server.run(
        [
            str(ROOT / "jobs" / "evaluate.py"),
            "--model",
            "models:/rest-enc@champion",
            "--tracking-uri",
            mlflow_server,
            "--tasks",
            "stsb",
            "--log-to-run",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (
        "pooling: mean (the model's own)" in res.stdout and f"logged to run {run.info.run_id}" in res.stdout
    )
    direct = job_server.run(
        [
            str(ROOT / "jobs" / "evaluate.py"),
            "--model",
            str(tiny_bert_dir),
            "--tasks",
            "stsb",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("| stsb |"))
    assert row in direct.stdout  # the champion's folder is the tiny model's: the same scores
    logged = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    assert "eval_sts_stsb_spearman_all" in logged
    assert f"models:/rest-enc@champion: version {v2}" in res.stdout  # the version it read, named
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("warning:")] == [
        f"warning: rest-enc@champion is v{v2}, set outside jobs/promote.py (it never promoted a version of "
        "rest-enc: nothing checked this one)"
    ]  # moved by the UI before any promotion: said, though there is nothing to compare it with

    # promote.py stands behind v2; the UI's alias editor (its REST call) then moves @champion to the worse
    # v1, skipping promote.py's check: the next job that reads @champion says so in one line, and still runs
    ok = job_server.run(
        [
            str(ROOT / "jobs" / "promote.py"),
            "--model",
            "rest-enc",
            "--version",
            str(v2),
            "--tracking-uri",
            mlflow_server,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    body = json.dumps({"name": "rest-enc", "alias": "champion", "version": str(v1)}).encode()
    req = urllib.request.Request(
        f"{mlflow_server}/api/2.0/mlflow/registered-models/alias",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    res = job_server.run(
        [
            str(ROOT / "jobs" / "evaluate.py"),
            "--model",
            "models:/rest-enc@champion",
            "--tracking-uri",
            mlflow_server,
            "--tasks",
            "stsb",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    warnings = [ln for ln in res.stdout.splitlines() if ln.startswith("warning:")]
    assert warnings == [
        f"warning: rest-enc@champion is v{v1} (test_score 0.5000), set outside jobs/promote.py; it "
        f"scores below v{v2} (0.6000), the champion promote.py had set"
    ]
    # and promote.py asked to approve the hand-moved champion weighs it against the one it promoted, not itself
    approve = job_server.run(
        [
            str(ROOT / "jobs" / "promote.py"),
            "--model",
            "rest-enc",
            "--version",
            str(v1),
            "--tracking-uri",
            mlflow_server,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert approve.returncode == 2 and approve.stderr.strip() == (
        f"error: refusing to promote rest-enc v{v1} (test_score=0.5) over @champion v{v2} (test_score=0.6) "
        f"(@champion was moved to v{v1} outside Sieve; v{v2} is the last it promoted); pass --force to do it anyway"
    )
