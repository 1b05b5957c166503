#!/usr/bin/env bash
# Re-runs the commands behind README's measured figures, one after another (they time
# themselves: run nothing else on the machine meanwhile), and keeps each output in
# $OUT (default readme-figures/). `--quick` runs only the default-run example and the
# benchmarks that take seconds; the full set includes the comparison sweep (~20 min on
# 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-readme-figures}
mkdir -p "$OUT"
run() {  # name, command...
    local name=$1; shift
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | grep -v 'it/s\]$\|step/s\]$\|shape/s\]$' > "$OUT/$name.txt"
    echo "   $((SECONDS - t0)) s -> $OUT/$name.txt"
}
echo "machine: $(nproc) cores, $(uname -m), $(python3 -c 'import platform; print(platform.processor() or "")')"
run default_run "$PY" examples/train_tiny_drafter.py
run bench_loss "$PY" benchmarks/bench_loss.py
run bench_plan "$PY" benchmarks/bench_plan.py
run bench_block_weights "$PY" benchmarks/bench_block_weights.py
[[ "${1:-}" == "--quick" ]] && exit 0
run bench_buckets "$PY" benchmarks/bench_buckets.py
run bench_train "$PY" benchmarks/bench_train.py --steps 30
run compare_shuffles "$PY" -m dflash.train -m experiment=compare_shuffles seed=0,1,2
