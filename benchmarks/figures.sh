#!/usr/bin/env bash
# Re-runs the commands behind every measured figure in the docs (docs/benchmarks.md lists
# each with its page), one after another: they time themselves, so run nothing else on
# the machine meanwhile. Each output lands in $OUT/NAME.txt (default figures/) under a
# header naming the machine, the date and the command.
#
#   bash benchmarks/figures.sh            # the quick set: minutes on 2 CPU cores
#   bash benchmarks/figures.sh --all      # + the sweeps and the real model: hours
#   bash benchmarks/figures.sh NAME ...   # the named figures only (`--list` names them)
#
# tests/unit/test_docs.py fails when a page cites a benchmark script this file never runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-figures}
REAL=${REAL:-.cache/dflash/end_to_end/smollm2}  # `make train-real`'s workdir
SMOLLM2=${SMOLLM2:-.cache/dflash/smollm2-135m-instruct}

QUICK=(default_run bench_loss bench_plan bench_block_weights bench_block_mask tp_memory
       bench_preflight_memory preflight_docs derived_drafters tested_models code_shape)
SLOW=(bench_buckets bench_train bench_pipeline bench_objectives bench_layouts bench_step_cost
      bench_cpu_speed bench_gloo_exit bench_regenerate compare_shuffles compare_objectives
      compare_layouts train_real bench_first_loss bench_regenerate_real bench_real_step
      norm_init llama_cpp_check dspark_world dspark_serving dspark_real)

command_of() {  # the command behind one named figure
    case $1 in
        default_run) echo "$PY examples/train_tiny_drafter.py" ;;
        bench_train) echo "$PY benchmarks/bench_train.py --steps 30" ;;
        bench_gloo_exit) echo "$PY benchmarks/bench_gloo_exit.py --runs 30" ;;
        bench_cpu_speed) echo "$PY benchmarks/bench_cpu_speed.py --seconds 120" ;;
        bench_step_cost) echo "$PY benchmarks/bench_step_cost.py --threads 1 --buckets 6" ;;
        compare_shuffles) echo "$PY -m dflash.train -m experiment=compare_shuffles seed=0,1,2" ;;
        compare_objectives) echo "$PY -m dflash.train -m experiment=compare_objectives" ;;
        compare_layouts) echo "$PY -m dflash.train -m experiment=compare_layouts" ;;
        dspark_world) echo "$PY -m dflash.train -m experiment=compare_dspark hydra.sweep.dir=$OUT/compare_dspark >/dev/null && $PY benchmarks/dspark_world.py $OUT/compare_dspark" ;;
        dspark_real) echo "$PY benchmarks/dspark_real.py --workdir $REAL --dflash \$DFLASH_RUN --dspark \$DSPARK_RUN" ;;
        dspark_serving) echo "make llama-cpp && $PY benchmarks/dspark_serving.py --stop 0.73" ;;
        train_real) echo "make train-real" ;;
        llama_cpp_check) echo "make llama-cpp && $PY benchmarks/llama_cpp_check.py --llama-cpp .cache/llama.cpp --workdir $REAL" ;;
        bench_real_step) echo "$PY benchmarks/bench_real_step.py $REAL/data" ;;
        norm_init) echo "for XS in 1,1 0.05,1 0.02,1 0.01,1 0,1 0,10 0,30; do X=\${XS%,*} S=\${XS#*,};" \
            "HF_HUB_OFFLINE=1 $PY -m dflash.train model=hf" \
            "model.target.path=$SMOLLM2 data=tokenized data.path=$REAL/data eval.enabled=false" \
            "optim.max_steps=24 batching.token_budget=1024 batching.max_batch_size=4" \
            "model.drafter.num_anchors=32 model.drafter.block_size=8 optim.lr=3e-3" \
            "logger.log_every=1 logger.progress=false model.drafter.norm_init=\$X" \
            "model.drafter.norm_lr_scale=\$S hydra.run.dir=$OUT/norm_init-\$X-\$S >/dev/null;" \
            "echo \$X \$S \$(grep -o '\"loss\": [0-9.]*' $OUT/norm_init-\$X-\$S/metrics.jsonl |" \
            "sed -n '1p;\$p' | cut -d' ' -f2); done" ;;
        bench_*|tp_memory|preflight_docs|derived_drafters|tested_models|code_shape) echo "$PY benchmarks/$1.py" ;;
        *) echo "unknown figure $1 (bash benchmarks/figures.sh --list)" >&2; return 1 ;;
    esac
}

case "${1:-}" in
    --list) printf '%s\n' "${QUICK[@]}" "${SLOW[@]}"; exit 0 ;;
    --all) names=("${QUICK[@]}" "${SLOW[@]}") ;;
    ""|--quick) names=("${QUICK[@]}") ;;
    *) names=("$@") ;;
esac
mkdir -p "$OUT"
machine="$(nproc) cores, $(uname -m), $(free -g | awk '/Mem:/ {print $2}') GiB"
if command -v nvidia-smi >/dev/null; then
    machine="$machine, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
fi
for name in "${names[@]}"; do
    cmd=$(command_of "$name")
    echo "== $name: $cmd"
    t0=$SECONDS
    status=0
    bash -c "$cmd" > "$OUT/$name.raw" 2>&1 || status=$?
    # progress bars' carriage-return frames and blank lines are not figures
    { echo "# $name | $(date -u +%Y-%m-%d) | $machine | exit $status"; echo "# $cmd"
      tr '\r' '\n' < "$OUT/$name.raw" | sed -e '/^\s*$/d' -e '/[0-9]%|/d'
    } > "$OUT/$name.txt"
    rm -f "$OUT/$name.raw"
    echo "   $((SECONDS - t0)) s, exit $status -> $OUT/$name.txt"
done
