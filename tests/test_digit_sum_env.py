"""DigitSum-v0 (envs/digit_sum): the env family added through the registry alone (its folder and its config).

The contract itself is checked by tests/test_env_contract.py (the id is picked up from the registry); here: the
registry picked the family up, gold demonstrations score 1.0, the splits are seeded and disjoint, hostile answers are
graded in bounded time, the family's config keys, and (slow) ``grpo.py --config-name grpo_digit_sum`` trains.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from envs.contract import STEP_TIME_BOUND_S
from envs.families import families
from envs.digit_sum.env import (MALFORMED, MAX_ANSWER_DIGITS, OUT_OF_RANGE, UNREADABLE, DigitSumEnv, extract_answer,
                                generate_numbers)

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]


def test_the_registry_picked_the_family_up():
    assert "DigitSum-v0" in envs.ENV_IDS and "digit_sum" in families()
    assert gym.registry["DigitSum-v0"].entry_point == "envs.digit_sum.env:DigitSumEnv"


def test_gold_demonstration_scores_one_on_every_test_problem():
    env = gym.make("DigitSum-v0", split="test")
    for i in env.unwrapped.usable_task_indices():
        _, info = env.reset(options={"index": i})
        number = int(info["messages"][-1]["content"].rsplit(" ", 1)[1].rstrip("?"))
        assert info["answer"] == sum(int(d) for d in str(number))
        demo = env.unwrapped.demonstration({"index": i})
        _, reward, terminated, _, info = env.step(demo[0])
        assert (reward, terminated, info["correct"]) == (1.0, True, True) and "action_error" not in info


def test_wrong_and_malformed_answers_score_zero():
    env = DigitSumEnv(split="test", test_size=3)
    _, info = env.reset(options={"index": 0})
    gold = info["answer"]
    _, reward, _, _, info = env.step(f"I think <answer>{gold + 1}</answer>")
    assert reward == 0.0 and info["extracted"] == gold + 1 and "action_error" not in info
    env.reset(options={"index": 0})
    _, reward, _, _, info = env.step(f"<answer>{gold} apples</answer>")
    assert reward == 0.0 and info["action_error"] == MALFORMED
    env.reset(options={"index": 0})
    _, reward, _, _, info = env.step(f"the sum is {gold}")
    assert reward == 1.0 and info["extracted"] == gold


def test_splits_are_seeded_distinct_and_disjoint():
    train = generate_numbers("train", 11, 500, 2, 4)
    test = generate_numbers("test", 22, 200, 2, 4)
    assert train == generate_numbers("train", 11, 500, 2, 4) and len(set(train)) == 500 and len(set(test)) == 200
    assert not set(train) & set(test)
    assert all(10 <= n < 10_000 for n in train + test)
    assert generate_numbers("train", 12, 500, 2, 4) != train
    with pytest.raises(ValueError, match="fewer than"):
        generate_numbers("test", 0, 100, 1, 1)
    with pytest.raises(ValueError, match="split"):
        generate_numbers("valid", 0, 1, 1, 2)
    with pytest.raises(ValueError, match="min_digits"):
        DigitSumEnv(min_digits=5, max_digits=3)


@pytest.mark.parametrize("text, want", [
    ("<answer> 18 </answer>", (18, None)),
    ("<answer>1</answer> then <answer>+7", (7, None)),
    ("<answer><answer>3</answer></answer>", (3, None)),
    ("<answer>" * 100_000, (None, MALFORMED)),
    ("<answer>" + "9" * 1_000_000, (None, OUT_OF_RANGE)),
    ("1" * 1_000_000, (None, OUT_OF_RANGE)),
    ("x" * 1_000_000, (None, UNREADABLE)),
    ("\u0663\u0664", (None, UNREADABLE)),  # Arabic-Indic digits: not ASCII, not read
    ("<answer>\u0663</answer>", (None, MALFORMED)),
    ("\ud800 7 \udfff", (7, None)),
    ("9" * MAX_ANSWER_DIGITS, (int("9" * MAX_ANSWER_DIGITS), None)),
    ("[" * 50_000 + "5" + "]" * 1_000, (5, None)),
    ("5" + "]" * 50_000, (None, UNREADABLE)),  # only the last MAX_GRADED_CHARS characters are graded
])
def test_hostile_answers_are_graded_in_bounded_time(text, want):
    t0 = time.perf_counter()
    assert extract_answer(text) == want
    env = DigitSumEnv(split="test", test_size=2)
    env.reset(options={"index": 0})
    _, reward, terminated, _, info = env.step(text)
    assert time.perf_counter() - t0 < STEP_TIME_BOUND_S
    assert reward in (0.0, 1.0) and terminated
    json.dumps(info).encode("utf-8")  # lone surrogates were replaced: the info encodes


def test_the_family_config_keys():
    fam = families()["digit_sum"]
    section = fam.section({"env_id": "DigitSum-v0", "train_seed": 5, "params": {"max_digits": 6}})
    assert (section["max_digits"], section["min_digits"], section["train_seed"]) == (6, 2, 5)
    env_id, kw = fam.make_kwargs(section, "train", None, {})
    assert env_id == "DigitSum-v0" and kw["max_digits"] == 6 and kw["train_seed"] == 5
    with pytest.raises(ValueError, match="max_digit"):
        fam.section({"env_id": "DigitSum-v0", "params": {"max_digit": 6}})
    with pytest.raises(ValueError, match="not used"):
        fam.make_kwargs(section, "train", "/some/path", {})
    assert "seed=22 problems=200" in fam.check_data(section, {"valid_dataset": ("test", None)})["valid_dataset"]


@pytest.mark.slow
def test_grpo_py_trains_on_the_new_family(tmp_path):
    """``grpo.py --config-name grpo_digit_sum``, 2 steps with the tiny random model (~35 s on the loaded machine)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    args = ["actor.path=tiny-random", "train.steps=2", "train.batch_size=1", "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8", "eval.n_problems=2", "checkpoint.every=0", "checkpoint.final_model=false",
            "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false", "econfig.params.max_digits=3",
            "econfig.train_size=200"]
    p = subprocess.run([sys.executable, str(REPO / "grpo.py"), "--config-name=grpo_digit_sum", *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {0, 1, 2}
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert any("eval/accuracy" in r for r in rows)
    sources = json.loads((run / "data_sources.json").read_text())
    assert sources["train_dataset"].startswith("digit_sum 2-3 digits split=train")
