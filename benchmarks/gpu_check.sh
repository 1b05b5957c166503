#!/usr/bin/env bash
# Every GPU-only path of dflash, one line per check, in at most 8 minutes:
#   bash benchmarks/gpu_check.sh
# Uses .venv when the repository has one (make test creates it), else python3.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! $PY -c "import torch, hydra, transformers, triton" 2>/dev/null; then
  echo "FAIL setup: $PY lacks torch/hydra-core/transformers/triton; run: $PY -m pip install -e ."
  exit 1
fi
$PY -c "import dflash" 2>/dev/null || $PY -m pip install --quiet --no-deps -e . >/dev/null 2>&1
export DFLASH_CACHE="${DFLASH_CACHE:-/tmp/dflash-gpu-check-cache}"
timeout 480 $PY benchmarks/gpu_check.py "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAIL gpu_check: ran past 8 minutes"
exit $rc
