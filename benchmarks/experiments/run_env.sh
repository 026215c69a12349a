# Sourced (not run) by the shell experiment drivers beside it (gsm8k_seeds.sh, continual_cpu.sh; their harness, as harness.py is the Python drivers'):
# the interpreter, the environment, and a check that the code imported is this checkout's.
# In:  REPO     the checkout root (required)
#      THREADS  OMP/MKL threads (default 1)
#      OVERLAY  optional extra PYTHONPATH entry (e.g. if-verifiable for a venv without the [ifeval] extra)
#      PY       interpreter (default $VLLM_VENV/bin/python, else venv-vllm next to the checkout; benchmarks/vllm_env.sh)
# Out: PY, WHERE (the files torchrl_grpo and envs were imported from); cwd is REPO. Exits 1 when GSM8K_DATA_DIR is
#      unset or the code would not come from REPO.
PY="${PY:-${VLLM_VENV:-$(dirname "$REPO")/venv-vllm}/bin/python}"
cd "$REPO" || exit 1
export PYTHONPATH="$REPO${OVERLAY:+:$OVERLAY}${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${THREADS:-1}" MKL_NUM_THREADS="${THREADS:-1}" TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export GSM8K_DATA_DIR="${GSM8K_DATA_DIR:?set GSM8K_DATA_DIR to the GSM8K folder with train.jsonl/test.jsonl}"
WHERE=$("$PY" -c "import torchrl_grpo, envs; print(torchrl_grpo.__file__, envs.__file__)")
case "$WHERE" in
  "$REPO"/*" $REPO"/*) echo "code from: $WHERE (commit $(git -C "$REPO" rev-parse --short HEAD))" ;;
  *) echo "error: torchrl_grpo/envs not imported from $REPO: $WHERE" >&2; exit 1 ;;
esac
