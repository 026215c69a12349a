#!/usr/bin/env bash
# On-policy clip fraction of the vLLM bf16 rollout path against the fp32 trainer, with the sampler's log-probs as the
# PPO anchor (loss.anchor=behaviour: the behaviour before issue 8) and with the trainer's own no-grad recompute
# (loss.anchor=auto, the default). SmolLM2-135M-Instruct, GSM8K, 3 steps x 2 prompts x 8 samples, 128 new tokens.
#
#   GSM8K_DATA_DIR=... bash benchmarks/anchor_vllm_bf16.sh [OUT_DIR]     (needs the vLLM venv: benchmarks/vllm_env.sh)
# Prints ratio_mean / ratio_max / clip_fraction / ESS / behaviour weight per step for both settings.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$(dirname "$REPO")/venv-vllm}"
OUT="${1:-$(mktemp -d)}"
: "${GSM8K_DATA_DIR:?set GSM8K_DATA_DIR}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
for anchor in behaviour auto; do
  "$VENV/bin/python" "$REPO/grpo.py" --config-name grpo_gsm8k actor.path=smollm2-135m-instruct rollout.backend=vllm \
    rollout.vllm.max_model_len=1024 rollout.max_context_tokens=1024 train.steps=3 train.batch_size=2 gconfig.n_samples=8 \
    gconfig.max_new_tokens=128 optimizer.lr=1e-6 eval.n_problems=0 checkpoint.every=0 checkpoint.save_final=false \
    stats_logger.progress_bar=false loss.anchor=$anchor seed=1 hydra.run.dir="$OUT/$anchor" > "$OUT/$anchor.log" 2>&1
  "$VENV/bin/python" - "$OUT/$anchor/metrics.jsonl" "$anchor" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(sys.argv[2], {k: round(r[k], 5) if isinstance(r.get(k), float) else r.get(k) for k in
          ("step", "ratio_mean", "ratio_max", "clip_fraction", "ess", "behaviour_weight_mean", "train/anchor_recomputed")})
PY
done
