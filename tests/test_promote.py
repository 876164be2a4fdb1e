"""jobs/promote.py against a real (embedded) MLflow registry."""

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import tracking

ROOT = Path(__file__).resolve().parents[1]


def promote(cwd, *args):
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "promote.py"), "--model", "enc", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_promote_moves_champion_and_refuses_worse(embedded_tracking, tiny_bert_dir):
    import mlflow

    tracking.setup(None, "sieve")
    with mlflow.start_run():
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    good = tracking.register(info.model_uri, "enc", alias="candidate", tags={"test_score": "0.70"})
    worse = tracking.register(info.model_uri, "enc", tags={"test_score": "0.60"})

    res = promote(embedded_tracking, "--version", str(good))
    assert res.returncode == 0, res.stderr
    assert tracking.alias_version("enc", "champion") == good

    res = promote(embedded_tracking, "--version", str(worse))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "refusing to promote enc v2 (test_score=0.6) over @champion v1" in res.stderr
    assert tracking.alias_version("enc", "champion") == good  # unchanged

    res = promote(embedded_tracking, "--version", str(worse), "--force")
    assert res.returncode == 0 and tracking.alias_version("enc", "champion") == worse

    res = promote(embedded_tracking, "--version", "99")
    assert res.returncode == 2 and res.stderr.strip() == "error: model 'enc' has no version 99"
