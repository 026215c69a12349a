#!/usr/bin/env bash
# Issue 27, the final tree measured the same way as run.sh: quick_guard twice, then train_bench.
#   final = d230b6f (build/ phases, one loop shell, SFT by composition, continual on the shell, cli.py)
#
# Usage: bash benchmarks/results/layout_refactor_ratios/run_final.sh
# Env:   FINAL (commit, default above); WORK, OUT, PY, GSM8K_DATA_DIR, MEASURING_FLAG as in run.sh
set -uo pipefail   # a failed measurement is logged and the next one runs

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
FINAL="${FINAL:-d230b6f}"
WORK="${WORK:-$(mktemp -d)}"
OUT="${OUT:-$WORK/measure}"
PY="${PY:-python}"
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
mkdir -p "$OUT" "$WORK/final_tree" || exit 1
if [ -n "${MEASURING_FLAG:-}" ]; then touch "$MEASURING_FLAG"; trap 'rm -f "$MEASURING_FLAG"' EXIT; fi
git -C "$REPO" archive "$FINAL" | tar -x -C "$WORK/final_tree" || exit 1
echo "tree in $WORK/final_tree, logs in $OUT"

for rep in 1 2; do
  echo "== quick_guard final rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$WORK/final_tree" && PYTHONPATH="$WORK/final_tree" "$PY" benchmarks/quick_guard.py) > "$OUT/qg_final_$rep.log" 2>&1
  grep "quick_guard " "$OUT/qg_final_$rep.log"
done
echo "== train_bench final $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$WORK/final_tree" && PYTHONPATH="$WORK/final_tree" "$PY" benchmarks/train_bench.py --warmup 1 --steps 3 \
  --out-dir "$OUT/tb_final") > "$OUT/tb_final.log" 2>&1
tail -1 "$OUT/tb_final.log"; grep "ours/TRL" "$OUT/tb_final.log"
echo "== done $(date -u +%T)"
