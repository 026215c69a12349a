#!/usr/bin/env bash
# Issue 37 CPU before/after: quick_guard and train_bench, one process at a time, each side from its own tree.
# BEFORE=86994bd (before issue 37), AFTER=$1 (the commit measured). Trees extracted with git archive.
set -u
AFTER=${1:?after commit}; BEFORE=${BEFORE:-86994bd}
W=${WORK:-$(mktemp -d)}; OUT=${OUT:-$W/logs}; mkdir -p $OUT
[ -n "${VENV:-}" ] && source "$VENV/bin/activate"
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled GSM8K_DATA_DIR=${GSM8K_DATA_DIR:-$(cd "$(dirname "$0")/../../../.." && pwd)/shared/data/gsm8k}
for side in before after; do
  c=$BEFORE; [ $side = after ] && c=$AFTER
  rm -rf $W/$side; mkdir -p $W/$side; (cd "$(dirname "$0")/../../.." && git archive $c | tar -x -C $W/$side)
done
run() { local side=$1; shift; (cd $W/$side && PYTHONPATH=$W/$side "$@"); }
for rep in ${REPS:-1}; do for side in before after; do
  echo "== quick_guard $side rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  run $side python benchmarks/quick_guard.py > $OUT/qg_${side}_$rep.log 2>&1; tail -6 $OUT/qg_${side}_$rep.log
done; done
for side in before after; do
  echo "== train_bench $side $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  run $side python benchmarks/train_bench.py --warmup 1 --steps 3 --out-dir $OUT/tb_$side > $OUT/tb_$side.log 2>&1; grep -E "completions/s|step time|train time|generation time" $OUT/tb_$side/train_bench.md
done
echo "== done $(date -u +%T)"
