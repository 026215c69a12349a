#!/bin/bash
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled GSM8K_DATA_DIR=/work/shared/data/gsm8k
out=/work/runs/s32/measure
for rep in 1 2; do
  echo "== quick_guard final rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /work/final_tree && PYTHONPATH=/work/final_tree python benchmarks/quick_guard.py) > $out/qg_final_$rep.log 2>&1
  grep "quick_guard " $out/qg_final_$rep.log
done
echo "== train_bench final $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
(cd /work/final_tree && PYTHONPATH=/work/final_tree python benchmarks/train_bench.py --warmup 1 --steps 3 --out-dir $out/tb_final) > $out/tb_final.log 2>&1
tail -1 $out/tb_final.log; grep "ours/TRL" $out/tb_final.log
echo "== done $(date -u +%T)"
