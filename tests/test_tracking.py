import os
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator import tracking
from orchestrator.errors import TrackingError


def _roundtrip(tiny_bert_dir, experiment):
    import mlflow
    from sentence_transformers import SentenceTransformer

    tracking.setup(None, experiment)
    with mlflow.start_run() as run:
        tracking.log_params(
            {"train": {"lr": 1e-5, "aws_secret": "abc"}, "model": {"name_or_path": "default"}}
        )
        tracking.log_metrics({"stsb_dev_spearman": 0.5}, step=1)
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    got = mlflow.get_run(run.info.run_id).data
    assert got.params["train.lr"] == "1e-05" and got.params["train.aws_secret"] == tracking.REDACTED
    assert got.metrics["stsb_dev_spearman"] == 0.5

    v1 = tracking.register(info.model_uri, "tiny-enc", alias="candidate", description="first")
    v2 = tracking.register(info.model_uri, "tiny-enc", alias="candidate")
    assert v2 == v1 + 1 and tracking.alias_version("tiny-enc", "candidate") == v2
    assert tracking.alias_version("tiny-enc", "champion") is None
    tracking.set_alias("tiny-enc", "champion", v1)
    assert tracking.alias_version("tiny-enc", "champion") == v1

    # the registered model loads back (pyfunc) and gives the same vectors as the folder itself
    loaded = mlflow.pyfunc.load_model("models:/tiny-enc@champion")
    sentences = ["a man plays a guitar", "the cat sleeps"]
    got_vec = np.asarray(loaded.predict(sentences))
    ref = SentenceTransformer(str(tiny_bert_dir), device="cpu").encode(sentences)
    np.testing.assert_allclose(got_vec, ref, atol=1e-5)


@pytest.mark.slow
def test_embedded_store_roundtrip(embedded_tracking, tiny_bert_dir):
    _roundtrip(tiny_bert_dir, "embedded")
    import mlflow  # the experiment is a model-training one (the UI opens on its runs, not a GenAI overview)

    assert (
        mlflow.get_experiment_by_name("embedded").tags[tracking.EXPERIMENT_KIND] == "custom_model_development"
    )
    assert (embedded_tracking / "mlruns" / "mlflow.db").is_file()
    assert any((embedded_tracking / "mlruns" / "artifacts").rglob("MLmodel"))


@pytest.mark.slow
def test_real_server_roundtrip(mlflow_server, tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    _roundtrip(tiny_bert_dir, "server")


def test_unreachable_server_fails_fast_naming_uri():
    from conftest import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.time()
    with pytest.raises(TrackingError, match=f"MLflow tracking server {uri} unreachable"):
        tracking.setup(uri, "x")
    assert time.time() - t0 < 10


def test_redaction_by_key_and_value(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SUPERSECRETVALUE123")
    params = tracking.clean_params(
        {
            "storage": {"uri": "s3://b/x?key=SUPERSECRETVALUE123"},
            "mlflow": {"password": "hunter2"},
            "ray": {"auth_token": "t"},
            "lr": 0.1,
        }
    )
    assert "SUPERSECRETVALUE123" not in str(params)
    assert params["mlflow.password"] == params["ray.auth_token"] == tracking.REDACTED
    assert params["lr"] == "0.1"


def test_a_server_gone_at_publish_ends_the_sweep_with_the_resume_line(monkeypatch):
    """The tracking server dies after a sweep trained: the job's last line says nothing is lost and
    gives the command that publishes without training again (the real MLflow client's error against a
    dead port, also when the parent run's own exit fails on top of it); other errors pass through."""
    from conftest import free_port
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from orchestrator.config import load_config
    from orchestrator.drivers.sweep_job import SweepPlan, publish_outage
    from trainers.sifter_simcse import ContrastiveConfig

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception) as gone:
        MlflowClient(tracking_uri=dead).search_experiments()
    assert tracking.is_unreachable(gone.value)
    cfg = load_config(
        ContrastiveConfig, "configs/sifter_simcse/smoke.yaml", [f"tracking.tracking_uri={dead}"]
    )
    plan = SweepPlan("tiny", None, None, cfg, "1", default_dir="sifter_sweep")
    line = publish_outage(gone.value, plan)
    assert isinstance(line, TrackingError) and dead in str(line) and cfg.run.storage in str(line)
    assert "python jobs/sifter_sweep.py --name tiny --resume" in str(line)
    try:  # the run's exit fails again while the first error is handled: still recognised
        try:
            raise gone.value
        except Exception:
            raise RuntimeError("end_run failed") from None
    except RuntimeError as exc:
        exc.__context__ = gone.value
        assert publish_outage(exc, plan) is not None
    assert publish_outage(ValueError("a bug"), plan) is None
    assert publish_outage(MlflowException("RESOURCE_DOES_NOT_EXIST: no such model"), plan) is None


def test_jobs_started_at_once_share_a_fresh_embedded_store(tmp_path):
    """Two or more jobs started together on a laptop create (and migrate) one fresh embedded SQLite store:
    without the lock one of them failed ("Migration expected to match one row ... alembic_version", or
    the experiment created twice)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = (
        f"import sys; sys.path.insert(0, {str(root)!r}); from orchestrator import tracking; "
        "print(tracking.setup(None, 'sieve'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-800:] for _, e in outs]
    assert len({o.strip().splitlines()[-1] for o, _ in outs}) == 1  # one experiment


def test_a_moved_embedded_store_says_where_its_artifacts_still_are(tmp_path, monkeypatch, capsys):
    """MLflow keeps absolute artifact paths (relative ones are resolved when the experiment is made), so an
    embedded store copied elsewhere still points at the old folder: the next job says so in one line; an unmoved
    store says nothing."""
    import shutil
    import subprocess
    import sys

    from orchestrator import tracking

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = tmp_path / "first"
    first.mkdir()
    for _ in range(
        2
    ):  # a job makes the store (a process of its own: the file is complete when it ends), one reuses it
        done = subprocess.run(
            [sys.executable, "-c", "from orchestrator import tracking; tracking.setup(None, 'sieve')"],
            cwd=first,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        assert done.returncode == 0 and "warning" not in done.stderr, done.stderr[-2000:]
    shutil.copytree(first, tmp_path / "second")
    monkeypatch.chdir(tmp_path / "second")
    tracking.setup(None, "sieve")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was moved" in err[0] and str(first / "mlruns" / "artifacts") in err[0], err
    assert str((tmp_path / "second" / "mlruns").resolve()) in err[0]
