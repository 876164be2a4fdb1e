"""jobs/train.py end to end on the session's Ray cluster, and its fail-fast preflight."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train(tmp_path, *args, timeout=600, extra_env=None, jobs=None):
    """``python jobs/train.py --method simcse --preset smoke ARGS`` to its end: (exit code, stdout, stderr). With
    ``jobs`` (the session's job server) forked from a process that imported the job's libraries once."""
    proc = start(tmp_path, *args, extra_env=extra_env, jobs=jobs)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess([], proc.returncode, out, err)


def start(tmp_path, *args, extra_env=None, jobs=None, merged=False):
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, **(extra_env or {})}
    cmd = [ROOT / "jobs" / "train.py", "--method", "simcse", "--preset", "smoke", "--no-progress", *args]
    if jobs is not None:
        return jobs.start(cmd, cwd=tmp_path, env=env, stderr_apart=not merged)
    return subprocess.Popen(
        [sys.executable, *map(str, cmd)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
    )


URI_PASSWORD = "uri-canary-51c9"
FAKE_MLFLOW_PASSWORD = "fake-mlflow-password-7f3a91"


def test_unreachable_tracking_server_fails_fast(tmp_path):
    from conftest import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.time()
    res = train(tmp_path, "--tracking-uri", uri, timeout=60)
    assert res.returncode == 2 and time.time() - t0 < 30
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: MLflow tracking server {uri} unreachable")


@pytest.fixture(scope="module")
def started_alongside(ray_cluster, tiny_bert_dir, tiny_shards, tmp_path_factory, job_server):
    """The module's two short failing jobs, started at once and each checked by its own test below: they run
    while the live job's steps wait (its step delay), not one after the other (suite time). Each has its own
    folder: (folder, start time, job)."""
    assert os.environ.get("RAY_ADDRESS")  # the session's cluster: the jobs join it, as under `ray job submit`
    nan, gpu = tmp_path_factory.mktemp("nan"), tmp_path_factory.mktemp("gpu")
    jobs = {
        "nan": (
            nan,
            time.time(),
            start(
                nan,
                "--storage",
                str(nan / "store"),
                "--name",
                "nan",
                "--no-base",
                f"model.name_or_path={tiny_bert_dir}",
                "model.max_length=16",
                "train.batch_size=8",
                "train.max_steps=8",
                "train.eval_steps=8",
                "train.lr=1e30",
                f"data.shards={tiny_shards}",  # the session's corpus: nothing parsed again
                "eval.tasks=[stsb]",
                "scaling.num_workers=1",
                "run.max_failures=0",
                jobs=job_server,
            ),
        ),
        "gpu": (
            gpu,
            time.time(),
            start(
                gpu,
                "--storage",
                str(gpu / "store"),
                "--no-base",
                f"model.name_or_path={tiny_bert_dir}",
                "scaling.use_gpu=true",
                "scaling.wait_for_nodes_s=4",
                jobs=job_server,
            ),
        ),
    }
    yield jobs
    for _, _, job in jobs.values():
        job.kill()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_job_tracks_live_exports_and_keeps_secrets(
    started_alongside, ray_cluster, tiny_bert_dir, mlflow_server, tmp_path, job_server
):
    """The train job against the real MLflow server. The run exists from the start and rank 0 logs into
    it as it trains - a dev evaluation is read from the server while the job is still running (each step
    slowed by a test hook). Then: the run's numbers and the logged model (it loads through pyfunc), the
    export, and no secret anywhere it wrote or logged."""
    import mlflow

    proc = start(
        tmp_path,
        "--storage",
        str(tmp_path / "store"),
        "--tracking-uri",  # a password in the URI (issue 56): used for basic auth, shown nowhere
        mlflow_server.replace("http://", f"http://sieve:{URI_PASSWORD}@"),
        "--name",
        "live",
        f"model.name_or_path={tiny_bert_dir}",
        "model.max_length=16",
        "train.batch_size=8",
        "train.max_steps=8",
        "train.eval_steps=2",
        "train.log_steps=1",
        "train.epochs=6",
        "data.limit=60",
        "data.parser_workers=1",
        "eval.tasks=[stsb]",
        "eval.max_length=32",
        "tracking.experiment=live",
        "scaling.num_workers=1",
        extra_env={"SIEVE_STEP_DELAY_S": "1.5", "MLFLOW_TRACKING_PASSWORD": FAKE_MLFLOW_PASSWORD},
        jobs=job_server,
        merged=True,
    )
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    seen_running = None
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        exp = client.get_experiment_by_name("live")
        runs = client.search_runs([exp.experiment_id]) if exp else []
        if runs:
            history = client.get_metric_history(runs[0].info.run_id, "stsb_dev_spearman")
            if history and proc.poll() is None:
                seen_running = (len(history), client.get_metric_history(runs[0].info.run_id, "loss"))
                break
        time.sleep(1)
    # a second job of the same name on the same storage, while the first trains: refused in one line
    # naming the owner, before it touches anything (the first one's model is checked below)
    second = train(
        tmp_path, "--storage", str(tmp_path / "store"), "--name", "live", timeout=120, jobs=job_server
    )
    assert second.returncode == 2 and re.fullmatch(
        rf"error: --name 'live' is claimed by jobs/train.py on \S+, pid {proc.pid}, started .* \(still running; "
        r"\S+/claims/live.json\): wait for it to end, or pick another --name",
        second.stderr.strip().splitlines()[-1],
    ), second.stderr[-2000:]
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    assert not (tmp_path / "store" / "claims" / "live.json").exists()  # given back when the job ended
    assert (
        f"engine: experiment 'live' started at {tmp_path / 'store' / 'sweeps' / 'live'}" in out
    )  # the one engine
    assert seen_running is not None, "no dev evaluation reached MLflow while the job ran"
    n_dev, losses = seen_running
    assert n_dev >= 1 and len(losses) >= 2  # loss every step, dev every 2 steps, before the end
    run = client.search_runs([client.get_experiment_by_name("live").experiment_id])
    assert len(run) == 1 and run[0].info.status == "FINISHED"  # the end of the run went into the same run
    final = client.get_metric_history(run[0].info.run_id, "stsb_dev_spearman")
    assert sorted(m.step for m in final) == [2, 4, 6, 8]  # each evaluation once
    assert "samples_per_s" in run[0].data.metrics and "test_sts_stsb_spearman_all" in run[0].data.metrics
    run_id = run[0].info.run_id
    assert run[0].data.params["method"] == "simcse" and run[0].data.params["lambda_xx"] == "1.0"
    assert "base_dev" in run[0].data.metrics  # the base model was measured in the same run
    # one 1-CPU worker leaves a core idle: the base was measured on it while the model trained
    assert re.search(
        r"base model: measured while the model trains, on the \d+ cores? training leaves idle", out
    )
    exported = tmp_path / "store" / "models" / "live"  # under --storage, its absolute path in the summary
    assert (exported / "test.json").is_file() and f'"model_dir": "{exported}"' in out
    card = (exported / "README.md").read_text()  # Sieve's card, not sentence-transformers' empty one
    assert (
        "Trained by Sieve's `simcse` recipe" in card and "train run `live`" in card and "Unknown" not in card
    )
    assert "| metric | base | candidate | candidate − base |" in card  # the scores beside the base's
    assert "Training: 8 steps, batch 8 × 1 workers" in card and run[0].data.metrics["steps_trained"] == 8
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(  # a train run says it registered nothing, and who does
            "registered: nothing - a train run exports ("
        )
    )
    mlflow.set_tracking_uri(mlflow_server)
    assert mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(["a b c"]).shape == (1, 32)

    # secrets in the environment (AWS key from the S3 fixture, MLflow password, the Ray token) never reach
    # params, tags, metrics, artifacts, the logged model, exports, checkpoints or the job's output
    secrets = [
        os.environ["AWS_SECRET_ACCESS_KEY"],
        FAKE_MLFLOW_PASSWORD,
        URI_PASSWORD,
        Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip(),
    ]
    logged = tmp_path / "logged"
    mlflow.artifacts.download_artifacts(run_id=run_id, dst_path=str(logged / "run"))
    mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model", dst_path=str(logged / "model"))
    recorded = json.dumps([run[0].data.params, run[0].data.tags, list(run[0].data.metrics)])
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 20 and any(p.is_relative_to(logged / "model") for p in written)
    for secret in secrets:
        assert secret not in out and secret not in recorded
        leaked = [str(p) for p in written if secret.encode() in p.read_bytes()]
        assert leaked == [], f"secret found in {leaked}"
    # nor Ray's logs of the session (its drivers', workers' and controllers' output): the URI's password
    ray_logs = [p for p in Path(os.environ["SIEVE_TEST_RAY_TEMP"]).rglob("*.log") if p.is_file()]
    assert ray_logs and not [str(p) for p in ray_logs if URI_PASSWORD.encode() in p.read_bytes()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loss_that_turns_nan_stops_the_job_in_one_line_and_its_run_ends_failed(started_alongside):
    """A learning rate far too large (1e30 - finite: a config refuses inf) makes the loss NaN within a few
    steps. The worker stops before training on it; the job prints the worker's one line (not Ray's nested
    errors), exits 2, exports nothing, and the MLflow run it made at the start ends FAILED with that reason."""
    import mlflow

    tmp_path, _, proc = started_alongside["nan"]
    out, err = proc.communicate(timeout=280)
    res = subprocess.CompletedProcess([], proc.returncode, out, err)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2, res.stderr[-3000:]
    assert re.fullmatch(
        r"error: the loss is (nan|inf) at step [1-8] \(train.lr 1e\+30\): training stops here; .+", last
    )
    assert not (tmp_path / "store" / "models" / "nan").exists()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("sieve").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["sieve.failure"] == last.removeprefix("error: ")


@pytest.mark.timeout(120)
def test_a_cluster_that_never_gets_a_fitting_node_stops_the_job_after_its_wait(started_alongside):
    """Joined to a cluster (which might add nodes), a job asking for a GPU no node has waits
    ``scaling.wait_for_nodes_s`` and stops in one line naming the key and both numbers - not Ray's silent wait
    for a placement; the MLflow run the job had made ends FAILED with that line."""
    import mlflow

    tmp_path, t0, proc = started_alongside["gpu"]
    out, err = proc.communicate(timeout=100)
    res = subprocess.CompletedProcess([], proc.returncode, out, err)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and proc.ended_at - t0 < 60, res.stderr[-3000:]
    assert last == (
        "error: scaling.use_gpu=true: each worker needs 1 GPU, and no node of the Ray cluster has more than 0 "
        "(waited scaling.wait_for_nodes_s=4 s); nothing was trained"
    )
    assert "waiting up to 4 s for the cluster to add one" in res.stdout
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("sieve").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["sieve.failure"] == last.removeprefix("error: ")
