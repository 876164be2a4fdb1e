#!/usr/bin/env bash
# One prepared GPU run (under 8 minutes on an H100/H200): every method's training step (samples/s, tokens/s,
# peak memory, BERT-base size); SimCSE/SIFTER step throughput and MFU in
# bf16 at batch 64 and 512 for BERT-base/large (random init: the machine has no internet), the same
# for sentence-transformers' MNRL, and peak memory under ZeRO 0/2/3. Results: bench/results/gpu.{json,md}.
# On the device machine the results are also copied to $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DS_BUILD_OPS=0
# a single-process DeepSpeed group for the ZeRO memory runs
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29533} RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
timeout 470 "$PY" bench/gpu_bench.py "$@"
if [ -n "${OUT:-}" ]; then cp bench/results/gpu.* "$OUT"/ 2>/dev/null || true; fi
