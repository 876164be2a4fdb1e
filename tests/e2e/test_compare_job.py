"""``jobs/compare.py`` end to end on the session's local Ray cluster, on a tiny random BERT: 2 arms × 2 seeds,
the driver killed after the first trial finished and resumed; a trial of the resumed run killed (the job
ends non-zero naming it, its MLflow run FAILED) and trained alone by the command it names; every other
trial trained once and every trial tested once, the
leaderboard on the MLflow parent run (one child run per trial) and as the console's last lines, the
registration gate applied; the experiment's state then rewritten as if killed mid-publish, and the resume
replays every trial without training or testing it again (the engine's resume rule, the same for a sweep).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def compare_file(tmp_path: Path, model_dir: Path, shards: str) -> Path:
    cfg = {
        "seeds": [1, 2],
        "reference": "simcse",
        "arms": {
            "simcse": {"method": "simcse", "config": "configs/simcse/smoke.yaml"},
            "sifter": {"method": "sifter_simcse", "config": "configs/sifter_simcse/smoke.yaml"},
        },
        "common_overrides": {
            "model.name_or_path": str(model_dir),
            "model.max_length": 16,
            "train.batch_size": 8,
            "train.max_steps": 2,
            "train.eval_steps": 2,
            "data.shards": shards,  # the session's corpus
            "eval.tasks": ["stsb"],
            "eval.max_length": 32,
            "scaling.num_workers": 1,
        },
        "max_concurrent_trials": 2,  # two 1-worker trials at once: the suite pays for two waves, not four
        "registration": {"arm": "best"},
    }
    p = tmp_path / "compare.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def run_job(jobs, tmp_path, store, *args, new_session=False):
    """``python jobs/compare.py ARGS`` as its own process (forked by the session's job server), stdout and stderr
    one stream, the tracking URI not inherited."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return jobs.start(
        [ROOT / "jobs" / "compare.py", *args, "--no-progress", "--storage", str(store)],
        cwd=tmp_path,
        env=env,
        new_session=new_session,
    )


class Planted:
    """A pickle that creates a file when it is loaded (``open(path, "w")``): what a planted Tune state would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def kill_a_starting_trial(where: Path, started_before: set[str], proc) -> str:
    """SIGKILL the process of the first trial that starts training after ``started_before`` (its audit record
    names its process); its name."""
    deadline = time.time() + 300
    while time.time() < deadline:
        for f in sorted((where / "invocations").iterdir()):
            if f.name not in started_before:
                record = json.loads(f.read_text())
                os.kill(record["pid"], signal.SIGKILL)
                return record["trial"]
        if proc.poll() is not None:
            pytest.fail(
                "the resumed comparison ended before a trial could be killed:\n" + proc.stdout.read()[-3000:]
            )
        time.sleep(0.1)
    pytest.fail("no trial started in time")


def test_compare_killed_and_resumed_trains_and_tests_each_trial_once(
    ray_cluster, tiny_bert_dir, tiny_shards, tmp_path, job_server
):
    store = tmp_path / "store"
    cfg = compare_file(tmp_path, tiny_bert_dir, tiny_shards)
    proc = run_job(job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", new_session=True)
    where = store / "sweeps" / "cmp"
    deadline = time.time() + 600
    while time.time() < deadline:  # killed once the first test is kept (the other trial may be mid-way)
        if (where / "tests").is_dir() and any((where / "tests").iterdir()):
            break
        if proc.poll() is not None:
            pytest.fail("the comparison ended before it could be killed:\n" + proc.stdout.read()[-3000:])
        time.sleep(0.5)
    else:
        pytest.fail("no trial finished in time")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    tested_before = {p.stem for p in (where / "tests").iterdir()}
    assert (where / "base" / "mean.json").is_file()  # the base, measured once, kept for the resume
    # the finished trials' leaderboard, read from the storage by the name alone: the plan the comparison kept
    # (2 steps × 8), not the default preset's (20 × 32)
    status = run_job(job_server, tmp_path, store, "--name", "cmp", "--status")
    interim, _ = status.communicate(timeout=300)
    assert status.returncode == 0 and f"interim: {len(tested_before)} of 4 trials tested" in interim, interim[
        -2000:
    ]
    (budgets,) = [
        line for line in interim.splitlines() if line.startswith("Trained for (steps × global batch): ")
    ]
    assert "sifter 2 × 8" in budgets and "simcse 2 × 8" in budgets, budgets  # in rank order

    # the killed driver's claim on its name stays behind: a resume is refused in one line naming it, until
    # the user says to take it over
    again = run_job(job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume")
    refused, _ = again.communicate(timeout=300)
    assert again.returncode == 2 and re.search(
        rf"error: --name 'cmp' is claimed by jobs/compare.py on \S+, pid {proc.pid}, started .* \(no longer running; "
        r".*claims/cmp.json\): if it no longer runs, pass --take-over to run under this name$",
        refused.strip(),
    ), refused[-2000:]
    started_before = {p.name for p in (where / "invocations").iterdir()}
    # read here, not at the kill: the killed driver's trial workers live on the cluster until Ray reaps them; one
    # trial may be trained and not yet tested
    trained_before = {p.name for p in (where / "done").iterdir()}
    proc = run_job(
        job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume", "--take-over"
    )
    # a trial of the resumed run killed as the kernel's OOM killer would (SIGKILL to its process) while it
    # trains: the job ends non-zero, in one line naming it and the command that trains it alone
    victim = kill_a_starting_trial(where, started_before, proc)
    out, _ = proc.communicate(timeout=800)
    assert "--take-over: the claim on 'cmp' of jobs/compare.py on " in out
    assert (
        "engine: experiment 'cmp' resumed (finished trials replay their records) at " in out
    )  # the engine's
    last = out.strip().splitlines()[-1]
    assert proc.returncode == 2 and re.fullmatch(
        rf"error: comparison 'cmp': 1 of 4 trial\(s\) did not finish \({victim}: .+\); the others are kept - "
        r"rerun with: python \S*jobs/compare\.py --config \S+compare.yaml --name cmp --no-progress --storage \S+ "
        r"--resume   \(it trains the missing trial\(s\) only\)",
        last,
    ), out[-4000:]
    assert not (where / "published.json").exists() and not (tmp_path / "outputs" / "reports" / "cmp").exists()
    assert not (store / "claims" / "cmp.json").exists()  # given back on the way out
    started_takeover = {p.name for p in (where / "invocations").iterdir()} - started_before
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (failed,) = mlflow.search_runs(
        search_all_experiments=True, filter_string="tags.`sieve.role` = 'compare'", output_format="list"
    )
    assert failed.info.status == "FAILED" and "did not finish" in failed.data.tags["sieve.failure"]

    # Tune's own saved state is never read by a resume (issue 54): a tuner.pkl and a newest experiment snapshot
    # planted in the storage, each a pickle that creates a file when loaded, create nothing
    marker = tmp_path / "planted-payload-ran"
    payload = pickle.dumps(Planted(str(marker)))
    (where / "tuner.pkl").write_bytes(payload)
    (where / "experiment_state-2099-01-01_00-00-00.json").write_text(
        json.dumps(
            {"trial_data": [], "runner_data": {"_type": "CLOUDPICKLE_FALLBACK", "value": payload.hex()}}
        )
    )
    pickle.loads(payload)  # the control: loaded, the payload does run
    assert marker.exists()
    marker.unlink()

    # the command it named trains that trial alone (the finished ones replayed) and publishes the whole
    proc = run_job(job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    assert not marker.exists()
    assert "engine: experiment 'cmp' resumed (finished trials replay their records) at " in out
    assert not (store / "claims" / "cmp.json").exists()  # given back at the end

    # trials trained per run: the first run's kill can land while another trial is mid-way, so that one starts
    # again in the take-over run; each run starts a trial at most once, and none whose training had finished
    def trial(name: str) -> str:
        return name.rsplit("-", 1)[0]

    started_last = {p.name for p in (where / "invocations").iterdir()} - started_before - started_takeover
    first, takeover, last_run = (
        [trial(n) for n in names] for names in (started_before, started_takeover, started_last)
    )
    assert tested_before <= trained_before and all(first.count(t) == 1 for t in trained_before), first
    trials = set(first) | set(takeover)
    assert len(trials) == 4 and victim in takeover, (first, takeover)
    assert sorted(takeover) == sorted(trials - trained_before), (
        takeover
    )  # each untrained trial once, no other
    assert last_run == [victim], last_run  # the resume trains the missing trial alone
    starts = first + takeover + last_run
    # a resume handed another plan than the one the comparison kept is refused, naming the first difference
    other = run_job(
        job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume", "train.max_steps=3"
    )
    refused, _ = other.communicate(timeout=300)
    assert other.returncode == 2 and refused.strip().splitlines()[-1].startswith(
        "error: --resume: comparison 'cmp' was started with another plan (arms.sifter.config.train.max_steps: "
        "2 vs 3; kept at "
    ), refused[-2000:]
    tests = sorted(p.stem for p in (where / "tests").iterdir())
    assert len(tests) == 4 and tested_before <= set(tests)
    lines = out.strip().splitlines()
    summary = json.loads(
        out[out.rindex('\n{\n  "comparison"') : out.index("\n}", out.rindex('\n{\n  "comparison"')) + 2]
    )
    assert (
        summary["trials"] == 4 and not summary["failed"] and sorted(summary["ranked"]) == ["sifter", "simcse"]
    )
    assert any(line.startswith("| **base (") for line in lines)  # the leaderboard, the base first
    assert lines[-1].startswith("gate: register only when the lower bound")
    board = json.loads((tmp_path / "outputs" / "reports" / "cmp" / "leaderboard.json").read_text())
    assert {r["arm"]: r["n"] for r in board["rows"]} == {"simcse": 2, "sifter": 2}
    sifter = next(r for r in board["rows"] if r["arm"] == "sifter")
    assert sifter["vs_reference"]["n"] == 2 and sifter["seeds"] == [1, 2]
    registered = summary["registered"]
    assert (registered is not None) == next(r for r in board["rows"] if r["arm"] == summary["ranked"][0])[
        "gate"
    ]

    exp = mlflow.get_experiment_by_name("sieve")
    parents = mlflow.search_runs(
        [exp.experiment_id], filter_string="tags.`sieve.role` = 'compare'", output_format="list"
    )
    assert (
        len(parents) == 1 and "| **base (" in parents[0].data.tags["mlflow.note.content"]
    )  # the UI description
    assert parents[0].info.status == "FINISHED"  # the failed run, resumed and finished
    children = mlflow.search_runs(
        [exp.experiment_id], filter_string="tags.`sieve.role` = 'trial'", output_format="list"
    )
    assert sorted(c.data.tags["sieve.trial"] for c in children) == tests
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    assert all("test_sts_avg_spearman_all" in c.data.metrics for c in children)
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(parents[0].info.run_id, "leaderboard")}
    assert {
        "leaderboard/leaderboard.md",
        "leaderboard/leaderboard.json",
        "leaderboard/leaderboard.png",
    } <= artifacts
    assert "sifter_vs_reference_low" in parents[0].data.metrics

    # killed before its publish ended (the record of publication removed): resumed, each trial is called again
    # (a resume runs the plan as a new experiment), replays its reports, trains and tests nothing, and the
    # publish adds no second parent run, child run or version - the engine's resume rule for every job
    replays = where / "replays"
    replayed = len(list(replays.iterdir())) if replays.is_dir() else 0
    (where / "published.json").unlink()
    kept = {p.stem: p.stat().st_mtime_ns for p in (where / "tests").iterdir()}
    proc = run_job(job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    assert sorted(p.name.rsplit("-", 1)[0] for p in (where / "invocations").iterdir()) == sorted(starts)
    assert len(list(replays.iterdir())) == replayed + 4  # every trial called again, and replayed
    assert {p.stem: p.stat().st_mtime_ns for p in (where / "tests").iterdir()} == kept  # nothing tested again
    again = json.loads((tmp_path / "outputs" / "reports" / "cmp" / "leaderboard.json").read_text())
    assert [r["per_seed"] for r in again["rows"]] == [r["per_seed"] for r in board["rows"]]
    parents = mlflow.search_runs(
        [exp.experiment_id], filter_string="tags.`sieve.role` = 'compare'", output_format="list"
    )
    children = mlflow.search_runs(
        [exp.experiment_id], filter_string="tags.`sieve.role` = 'trial'", output_format="list"
    )
    assert len(parents) == 1 and sorted(c.data.tags["sieve.trial"] for c in children) == tests
    versions = mlflow.MlflowClient().search_model_versions("name = 'sifter-simcse'") + (
        mlflow.MlflowClient().search_model_versions("name = 'simcse'")
    )
    assert len(versions) == (registered is not None)

    # resumed once more, a finished comparison answers from its record: no Ray, nothing trained
    again = run_job(job_server, tmp_path, store, "--config", str(cfg), "--name", "cmp", "--resume")
    out2, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out2[-4000:]
    assert "Started a local Ray instance" not in out2 and "| **base (" in out2
    assert out2.strip().splitlines()[-1].startswith("comparison 'cmp' had finished and was published")
    assert sorted(p.name.rsplit("-", 1)[0] for p in (where / "invocations").iterdir()) == sorted(starts)
