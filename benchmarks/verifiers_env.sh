#!/usr/bin/env bash
# A separate virtual environment for verifiers (prime-rl / Environments Hub), layered over the project's venv.
#
# Usage: [VERIFIERS_VERSION=0.3.1] bash benchmarks/verifiers_env.sh [VENV_DIR] [PROJECT_VENV]
#        (defaults: $VERIFIERS_VENV else venv-verifiers-<version without dots> next to this checkout;
#        $PROJECT_VENV else the active venv)
#
# Which version: 0.3.1, the last release with the classic in-process API (vf.SingleTurnEnv / vf.MultiTurnEnv /
# vf.ToolEnv, vf.Rubric, env.evaluate(client, model, ...)) that envs/adapters/verifiers_env.py implements and
# tests/test_verifiers_env.py drives. VERIFIERS_VERSION=0.4.0: the rewrite (verifiers.v1: Taskset / Harness / Env) that
# envs/adapters/verifiers_v1_env.py implements (plugin package gym_taskset) and tests/test_verifiers_v1_env.py drives
# offline (its built-in harnesses install their agents with `uv` at run time; ours runs in-process).
#
# Why its own venv: verifiers pins mcp (0.3.1: mcp<2; 0.4.0: mcp==2.0.0 exactly) while the project venv resolves
# mcp 2.3.x, and it pulls ~30 more packages (anthropic, prime-*, renderers, gepa, ...); installing it into the
# project venv would downgrade mcp. An extra could not coexist with the project's own resolution of mcp.
# This venv sees the project venv's packages through a .pth (site.addsitedir, processed after its own
# site-packages), so torch/transformers/tau2/our editable install are not installed twice, while whatever
# verifiers needs at another version (mcp==2.0.0) is installed here and shadows the project's copy. pip never
# modifies the project venv from here ("outside environment": it only installs into this one).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${VERIFIERS_VERSION:-0.3.1}"
VENV="${1:-${VERIFIERS_VENV:-$(dirname "$REPO")/venv-verifiers-${VERSION//./}}}"
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

step "installing verifiers==$VERSION"
# Everything the project venv already has stays at its version (constraints), except mcp/mcp-types, which verifiers
# pins: without this, pip would add newer copies here that shadow the project's (e.g. openai 3.x, which breaks
# litellm's openai<3 that tau2's LLM user needs).
"$PY" -m pip list --format=freeze --exclude-editable 2>/dev/null | grep -v -i -E '^(mcp|mcp-types|pip)==' \
    >"$VENV/project-constraints.txt"
# (setuptools too: the venv's bundled copy would shadow the project's, older than torch's requirement)
"$VENV/bin/pip" install --quiet -c "$VENV/project-constraints.txt" "verifiers==$VERSION" setuptools

step "checking"
"$VENV/bin/pip" check 2>&1 | grep -v "is ignored" || true   # reports what this venv breaks in the project's pins
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import verifiers, mcp, litellm, openai, tau2, envs, torch, trl
print("openai", md.version("openai"), "verifiers", md.version("verifiers"), "mcp", md.version("mcp"), "litellm", md.version("litellm"),
      "trl", md.version("trl"), "torch", torch.__version__)
PY
step "done: run the verifiers tests with $VENV/bin/python -m pytest -q tests/test_verifiers_env.py"
