#!/usr/bin/env bash
# The wheels bench/gpu.sh needs on the lent GPU machine, whose image lacks them (.library/device/KINDS.md): pydantic
# and its three dependencies (~2.5 MB), for Python 3.12 on x86-64 Linux, into .whl/ (git-ignored). Run it here
# once, then name .whl in the device call's `carry`; bench/gpu.sh installs them to /tmp/site when .whl exists.
# DeepSpeed is optional: without it the ZeRO rows say so.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
for pkg in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$pkg"
done
ls -la .whl
