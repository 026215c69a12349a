#!/usr/bin/env bash
# A separate virtual environment for verifiers (prime-rl / Environments Hub), layered over the project's venv.
#
# Usage: bash benchmarks/verifiers_env.sh [VENV_DIR] [PROJECT_VENV]
#        (defaults: $VERIFIERS_VENV else venv-verifiers next to this checkout; $PROJECT_VENV else the active venv)
#
# Why its own venv: verifiers 0.4.0 pins mcp==2.0.0 exactly (the project venv has mcp 2.3.x) and pulls ~30 more
# packages (anthropic, prime-*, renderers, gepa, ...); installing it into the project venv would downgrade mcp.
# This venv sees the project venv's packages through a .pth (site.addsitedir, processed after its own
# site-packages), so torch/transformers/tau2/our editable install are not installed twice, while whatever
# verifiers needs at another version (mcp==2.0.0) is installed here and shadows the project's copy. pip never
# modifies the project venv from here ("outside environment": it only installs into this one).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VERIFIERS_VENV:-$(dirname "$REPO")/venv-verifiers}}"
BASE="${2:-${PROJECT_VENV:-${VIRTUAL_ENV:-}}}"
[ -n "$BASE" ] || { echo "activate the project venv or pass PROJECT_VENV" >&2; exit 2; }
PY="$BASE/bin/python"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

t0=$(date +%s)
step() { echo "[verifiers_env +$(( $(date +%s) - t0 ))s] $*"; }

step "creating venv $VENV over $BASE"
"$("$PY" -c 'import sys; print(sys._base_executable)')" -m venv "$VENV"
OWN="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$SITE')" >"$OWN/zz_project_venv.pth"

step "installing verifiers==0.4.0"
"$VENV/bin/pip" install --quiet "verifiers==0.4.0"

step "checking"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import verifiers, mcp, litellm, tau2, envs, torch, trl
print("verifiers", md.version("verifiers"), "mcp", md.version("mcp"), "litellm", md.version("litellm"),
      "trl", md.version("trl"), "torch", torch.__version__)
PY
step "done: run the verifiers tests with $VENV/bin/python -m pytest -q tests/test_verifiers_env.py"
