#!/usr/bin/env bash
# Issue 42: the default `python grpo.py` step (ReasoningGym chain_sum, SmolLM2-135M) before the graders moved into
# worker processes (BEFORE, default dd15673) and after (AFTER=$1). Each side from its own `git archive` tree, one
# process at a time, sides alternating; 4 GRPO steps per run without the evaluations; time/step_s and
# time/rollout_wall_s read from each run's metrics.jsonl (step 1 is the warm-up and is reported apart).
set -u
AFTER=${1:?after commit}; BEFORE=${BEFORE:-dd15673}; REPS=${REPS:-2}; STEPS=${STEPS:-4}
W=${WORK:-$(mktemp -d)}; OUT=${OUT:-$W/logs}; mkdir -p "$OUT"
[ -n "${VENV:-}" ] && source "$VENV/bin/activate"
export LITELLM_LOCAL_MODEL_COST_MAP=True TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
for side in before after; do
  c=$BEFORE; [ $side = after ] && c=$AFTER
  rm -rf "$W/$side"; mkdir -p "$W/$side"; (cd "$(dirname "$0")/../../.." && git archive "$c" | tar -x -C "$W/$side")
done
for rep in $(seq 1 "$REPS"); do for side in before after; do
  echo "== $side rep $rep $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  ( cd "$W/$side" && PYTHONPATH="$W/$side" python grpo.py train.steps="$STEPS" eval.at_start=false eval.at_end=false \
      hydra.run.dir="$OUT/${side}_$rep" > "$OUT/${side}_$rep.log" 2>&1 )
  python - "$OUT/${side}_$rep/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if "time/step_s" in r]
print("  step_s:", [round(r["time/step_s"], 2) for r in steps], " rollout_wall_s:",
      [round(r.get("time/rollout_wall_s", float("nan")), 2) for r in steps])
PY
done; done
echo "== done $(date -u +%T)"
