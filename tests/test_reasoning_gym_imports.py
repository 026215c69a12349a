"""A ReasoningGym run loads nothing of tau2 (issue 35: a minimal GPU image runs the arithmetic task without tau2's
import chain). ``config/`` is a leaf: the tau2 reward choices it validates are its own tuple
(:data:`torchrl_grpo.config.choices.TAU2_REWARD_KINDS`), equal to the env's (``envs`` never imports ``torchrl_grpo``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: validates the default (ReasoningGym) config, builds the trainer on the tiny random model, runs 0 steps, then
#: prints the tau2 modules it loaded
_CODE = r"""
import json, sys, tempfile
from hydra import compose, initialize_config_dir
from torchrl_grpo.config import register_configs, validate_config
register_configs()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose(config_name="grpo_reasoning", overrides=[
        "actor.path=tiny-random", "train.device=cpu", "train.steps=1", "econfig.train_size=20",
        "econfig.test_size=8", "eval.at_start=false", "eval.at_end=false", "eval.every=0",
        "checkpoint.every=0", "checkpoint.save_final=false", "stats_logger.console=false",
        "stats_logger.progress_bar=false", "stats_logger.wandb.mode=disabled"])
validate_config(cfg)
after_validate = sorted(m for m in sys.modules if m.startswith(("envs.tau2", "tau2")))
built = []
if sys.argv[2] == "build":
    from torchrl_grpo.assembly import build_trainer
    with tempfile.TemporaryDirectory() as d:
        trainer = build_trainer(cfg, d)
        trainer.close()
    built = sorted(m for m in sys.modules if m.startswith(("envs.tau2", "tau2")))
print(json.dumps({"after_validate": after_validate, "after_build": built}))
"""


def _tau2_modules(stage: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", _CODE, str(REPO / "configs"), stage], capture_output=True, text=True,
                       timeout=300, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_validating_a_reasoning_gym_config_imports_no_tau2():
    assert _tau2_modules("validate")["after_validate"] == []


def test_building_a_reasoning_gym_trainer_imports_no_tau2():
    out = _tau2_modules("build")
    assert out["after_validate"] == [] and out["after_build"] == []


def test_config_tau2_reward_kinds_equal_the_envs_own():
    """The two tuples are separate objects by design (config/ imports nothing of ours, envs nothing of
    torchrl_grpo); this keeps them equal."""
    pytest.importorskip("tau2")
    from envs.tau2.env import REWARD_KINDS
    from torchrl_grpo.config import _choices, choices

    assert choices.TAU2_REWARD_KINDS == REWARD_KINDS
    assert _choices()["econfig.reward"] is choices.TAU2_REWARD_KINDS
