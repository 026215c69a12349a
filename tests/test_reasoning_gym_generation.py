"""Drawing reasoning-gym items runs library code that runs code (issue 42): contained, not trusted.

codeio's generator ``exec()``s a snippet of its data file for every item it draws, and snippet 1148 (drawn by
``Random(448)``: item 0 of seed 448) writes ``sailor_performance.csv`` into the working directory: it appeared in
our checkout's root during a test run. Before the fix the draw ran in the caller's process and left the file in its
working directory; now the items of a task whose generator runs code
(:func:`envs.reasoning_gym.verifier_audit.executing_generation`) are drawn in a grader worker, inside a temporary
directory removed after, and a draw past its bounds is a ``RuntimeError`` naming the task at construction. The pure
tasks are drawn in process, as before.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from envs.reasoning_gym import data as rg_data
from envs.reasoning_gym.verifier_audit import executing_generation

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]
#: codeio's item 0 with this generator seed is snippet 1148, which writes ``sailor_performance.csv`` in the cwd.
WRITING_SEED = 448


def _spec(task: str = "codeio", tasks: dict | None = None):
    return rg_data.resolve_spec(None if tasks else task, tasks, None, None)


def test_the_audit_reports_the_generators_that_run_code():
    assert "exec" in executing_generation("codeio")
    assert "eval" in executing_generation("basic_arithmetic") and "eval" in executing_generation("bitwise_arithmetic")
    for pure in ("chain_sum", "products", "spell_backward", "word_ladder", "intermediate_integration"):
        assert executing_generation(pure) == (), pure  # data files read with open / importlib.resources: not runs
    assert rg_data.contained_tasks(_spec(tasks={"chain_sum": 1.0, "codeio": 1.0})) == ("codeio",)
    assert rg_data.contained_tasks(_spec("chain_sum")) == ()


@pytest.mark.parametrize("tasks", [None, {"chain_sum": 1.0, "codeio": 1.0}], ids=["codeio", "mix"])
def test_drawing_codeio_leaves_no_file_in_the_working_directory(tmp_path, monkeypatch, tasks):
    """Failed before the fix: ``sailor_performance.csv`` in the cwd (the draw ran the snippet in this process)."""
    monkeypatch.chdir(tmp_path)
    items = rg_data._draw_split(_spec(tasks=tasks), "train", WRITING_SEED, 2)
    assert len(items) == 2 and all(isinstance(p["question"], str) for p in items)
    assert sorted(os.listdir(tmp_path)) == []


def test_the_pure_tasks_are_drawn_in_this_process(monkeypatch):
    class NoPool:
        def call(self, *a, **k):
            raise AssertionError("a pure task's draw went to a worker")

    monkeypatch.setattr(rg_data, "default_pool", lambda: NoPool())
    items = rg_data._draw_split(_spec("chain_sum"), "test", 22, 3)
    assert len(items) == 3


def test_a_draw_past_its_bound_is_an_error_naming_the_task_at_construction(monkeypatch):
    monkeypatch.setattr(rg_data, "GENERATION_BASE_CPU_S", 0.01)
    monkeypatch.setattr(rg_data, "GENERATION_CPU_S_PER_ITEM", 0.0)
    with pytest.raises(RuntimeError, match=r"\['codeio'\].*exec.*grader_timeout"):
        gym.make("ReasoningGym-v1", task="codeio", train_seed=90_417, train_size=3, test_size=1)


_CHILD = """
import json, os, gymnasium as gym, envs
gym.register_envs(envs)
out = {}
for split in ("train", "test"):
    env = gym.make("ReasoningGym-v1", task="codeio", split=split, train_seed=%d, train_size=2, test_size=1)
    env.reset(options={"index": 0})
    gold = env.unwrapped.demonstration({"index": 0})[0]["content"]
    _, reward, _, _, info = env.step(gold)
    env.reset(options={"index": 0})
    _, wrong, _, _, _ = env.step("<answer>{\\"x\\": 1}</answer>")
    out[split] = [reward, wrong, info.get("action_error")]
print(json.dumps(out))
""" % WRITING_SEED


@pytest.mark.slow
def test_a_process_building_and_grading_codeio_leaves_its_cwd_empty(tmp_path):
    """The whole path in a fresh process whose cwd is an empty directory (its grader pool started there): building
    both splits, grading a gold and a wrong answer. Failed before the fix: ``sailor_performance.csv``."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", _CHILD], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["train"][0] == 1.0 and out["test"][0] == 1.0 and out["train"][2] is None, out
    assert sorted(os.listdir(cwd)) == []
