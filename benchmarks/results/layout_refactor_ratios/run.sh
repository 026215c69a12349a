#!/bin/bash
# Issue 27 before/after: quick_guard and train_bench, one process at a time, idle machine.
# before = c1a3b07 (the last commit before issue 27's layout work), after = c9e8c8a (HEAD at session start)
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled GSM8K_DATA_DIR=/work/shared/data/gsm8k
touch /work/notes/MEASURING
out=/work/runs/s32/measure
for rep in 1 2; do
  for side in before after; do
    echo "== quick_guard $side rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd /work/${side}_tree && PYTHONPATH=/work/${side}_tree python benchmarks/quick_guard.py) > $out/qg_${side}_$rep.log 2>&1
    tail -8 $out/qg_${side}_$rep.log
  done
done
for side in before after; do
  echo "== train_bench $side $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /work/${side}_tree && PYTHONPATH=/work/${side}_tree python benchmarks/train_bench.py --warmup 1 --steps 3 --out-dir $out/tb_$side) > $out/tb_${side}.log 2>&1
  grep -E "completions/s|step time|train time|generation time" $out/tb_${side}.log | head -8
done
echo "== done $(date -u +%T)"
rm -f /work/notes/MEASURING
