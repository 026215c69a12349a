#!/usr/bin/env bash
# Issue 27 before/after: quick_guard twice per side, then train_bench per side, one process at a time (idle machine).
#   before = c1a3b07 (the last commit before issue 27's layout work), after = c9e8c8a (HEAD at that session's start)
#
# Usage (from anywhere; the commits are read from the checkout this script lives in):
#   bash benchmarks/results/layout_refactor_ratios/run.sh
# Env:  BEFORE, AFTER   commits to compare (defaults above)
#       WORK            where the two trees are extracted (default: a new temp dir)
#       OUT             where the logs and train_bench results go (default: $WORK/measure)
#       PY              interpreter with torchrl-grpo's dependencies (default: python)
#       GSM8K_DATA_DIR  GSM8K folder (default: unset, the copy shipped in envs/gsm8k/data)
#       MEASURING_FLAG  a file that exists while this runs, to tell others sharing the machine (default: none)
set -uo pipefail   # a failed measurement is logged and the next one runs

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BEFORE="${BEFORE:-c1a3b07}"
AFTER="${AFTER:-c9e8c8a}"
WORK="${WORK:-$(mktemp -d)}"
OUT="${OUT:-$WORK/measure}"
PY="${PY:-python}"
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
mkdir -p "$OUT" || exit 1
if [ -n "${MEASURING_FLAG:-}" ]; then touch "$MEASURING_FLAG"; trap 'rm -f "$MEASURING_FLAG"' EXIT; fi

# each side: the committed tree of its commit, extracted (no worktree metadata added to the checkout)
for side in before after; do
  commit="$BEFORE"; [ "$side" = after ] && commit="$AFTER"
  mkdir -p "$WORK/${side}_tree"
  git -C "$REPO" archive "$commit" | tar -x -C "$WORK/${side}_tree" || exit 1
done
echo "trees in $WORK, logs in $OUT"

for rep in 1 2; do
  for side in before after; do
    echo "== quick_guard $side rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "$WORK/${side}_tree" && PYTHONPATH="$WORK/${side}_tree" "$PY" benchmarks/quick_guard.py) \
      > "$OUT/qg_${side}_$rep.log" 2>&1
    tail -8 "$OUT/qg_${side}_$rep.log"
  done
done
for side in before after; do
  echo "== train_bench $side $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$WORK/${side}_tree" && PYTHONPATH="$WORK/${side}_tree" "$PY" benchmarks/train_bench.py --warmup 1 --steps 3 \
    --out-dir "$OUT/tb_$side") > "$OUT/tb_${side}.log" 2>&1
  grep -E "completions/s|step time|train time|generation time" "$OUT/tb_${side}.log" | head -8
done
echo "== done $(date -u +%T)"
