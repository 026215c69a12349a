"""GSM8K reward design under the SHIPPED defaults: a short well-formed guess must not out-score reasoning.

Regression for issue 14 section 0: with a 0.1 format credit, the shipped Qwen2.5-Coder-0.5B recipe (seed 3) went
from 0.193 to 0.013 greedy accuracy while responses shrank 236 -> 52 tokens to ``#### 450<|im_end|>``: inside a group,
a well-formed wrong guess (0.1) out-scored reasoning cut off at ``max_new_tokens`` (0.0), so GRPO's group-relative
advantage pushed the policy to stop reasoning. The tests below grade scripted responses with the real env built from
the shipped config (``configs/grpo_gsm8k.yaml``), so changing a default back breaks them.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from envs.gsm8k.env import GSM8KEnv
from envs.gsm8k.grading import gsm8k_reward
from torchrl_grpo.objectives.advantage import group_advantages
from torchrl_grpo.config import EnvConfig, register_configs

REPO = Path(__file__).resolve().parents[1]

# (question, gold, full correct reasoning, reasoning cut off mid-way at the token limit, well-formed wrong guess)
PROBLEMS = [
    ("Tom has 12 apples and buys 7 more, then gives away 4. How many apples does he have?", 15,
     "Tom starts with 12 apples. He buys 7 more: 12 + 7 = 19. He gives away 4: 19 - 4 = 15.\n#### 15",
     "Tom starts with 12 apples. He buys 7 more, so we add: 12 + 7 = 19. Next we need to consider the",
     "#### 450"),
    ("A box holds 6 rows of 8 eggs. 5 eggs break. How many eggs are left?", 43,
     "There are 6 * 8 = 48 eggs. After 5 break: 48 - 5 = 43.\n#### 43",
     "Each row has 8 eggs and there are 6 rows, so the total is 6 * 8 = 48 eggs. Some of them, namely",
     "#### 48"),
    ("Sara reads 20 pages a day for 3 days and 15 pages on day 4. How many pages in total?", 75,
     "Days 1-3: 20 * 3 = 60 pages. Day 4: 15 pages. Total 60 + 15 = 75.\n#### 75",
     "For the first three days she reads 20 pages each day: 20 * 3 = 60. On the fourth day she",
     "The answer is 80"),
]


def _shipped_format_reward() -> float:
    """``econfig.format_reward`` of the shipped GSM8K config (Hydra compose of ``configs/grpo_gsm8k.yaml``)."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_gsm8k")
    return float(cfg.econfig.format_reward)


@pytest.fixture(scope="module")
def env():
    data = [{"question": q, "answer": gold} for q, gold, *_ in PROBLEMS]
    return GSM8KEnv(data=data, format_reward=_shipped_format_reward())


def _grade(env: GSM8KEnv, index: int, text: str) -> float:
    env.reset(options={"index": index})
    return env.step(text)[1]


def test_scripted_responses_are_what_they_claim(env):
    # guard against a vacuous test: the truncated attempts and guesses are wrong, the reasoning is right
    for _, gold, reasoning, cut, guess in PROBLEMS:
        assert gsm8k_reward(reasoning, gold, format_reward=0.0)[1]["correct"]
        r_cut, g_cut = gsm8k_reward(cut, gold, format_reward=0.1)
        r_guess, g_guess = gsm8k_reward(guess, gold, format_reward=0.1)
        assert not g_cut["correct"] and not g_cut["formatted"] and r_cut == 0.0
        assert not g_guess["correct"] and g_guess["formatted"] and r_guess == pytest.approx(0.1)


def test_shipped_default_is_correctness_only_everywhere():
    # the yaml, the config schema, the env and the grading function agree
    assert _shipped_format_reward() == 0.0
    assert EnvConfig().format_reward == 0.0
    assert GSM8KEnv(data=[{"question": "1+1?", "answer": 2}]).format_reward == 0.0
    assert gsm8k_reward("#### 3", "4")[0] == 0.0


@pytest.mark.parametrize("p_solve", [0.02, 0.05, 0.1, 0.2, 0.5])
@pytest.mark.parametrize("guess_hit_ratio", [0.0, 0.5, 1.0])
def test_short_guess_does_not_out_score_reasoning_in_expectation(env, p_solve, guess_hit_ratio):
    """Policy A reasons: it solves a problem with probability p, otherwise it is cut off at the token limit.
    Policy B answers ``#### N`` at once and is right with probability q <= p. A must score >= B in expectation
    (exact expectation over the two outcomes, rewards from the env): a policy that is at least as accurate is
    never out-scored by a guessing one. With a 0.1 format credit, B = q + 0.1 (1 - q) beats A = p for p < 0.1."""
    q = guess_hit_ratio * p_solve
    for i, (_, gold, reasoning, cut, guess) in enumerate(PROBLEMS):
        correct_guess = f"#### {gold}"
        e_reason = p_solve * _grade(env, i, reasoning) + (1 - p_solve) * _grade(env, i, cut)
        e_guess = q * _grade(env, i, correct_guess) + (1 - q) * _grade(env, i, guess)
        assert e_reason >= e_guess - 1e-12, (i, p_solve, q, e_reason, e_guess)
        # stronger: the expected reward is the accuracy (the evaluation metric), for both policies
        assert e_reason == pytest.approx(p_solve) and e_guess == pytest.approx(q)


def test_guess_gets_no_positive_advantage_against_truncated_reasoning(env):
    """The collapsed run's groups: reasoning cut off at the limit vs a short well-formed wrong guess."""
    for i, (_, _, _, cut, guess) in enumerate(PROBLEMS):
        # a pair, and a group of 8 like the recipe's (6 truncated attempts, 2 guesses)
        for n_cut, n_guess in ((1, 1), (6, 2)):
            texts = [cut] * n_cut + [guess] * n_guess
            reward = torch.tensor([_grade(env, i, t) for t in texts])
            adv = group_advantages(reward, torch.zeros(len(texts), dtype=torch.long))
            assert (adv[n_cut:] <= 0).all(), (i, reward.tolist(), adv.tolist())
            assert (adv[:n_cut] >= 0).all(), (i, reward.tolist(), adv.tolist())


def test_correct_reasoning_still_gets_the_positive_advantage(env):
    # the fix must not remove the learning signal: in {correct, truncated, guess} only the correct one is pushed up
    for i, (_, _, reasoning, cut, guess) in enumerate(PROBLEMS):
        reward = torch.tensor([_grade(env, i, t) for t in (reasoning, cut, guess)])
        adv = group_advantages(reward, torch.zeros(3, dtype=torch.long))
        assert adv[0] > 0 and adv[2] <= adv[1], (reward.tolist(), adv.tolist())


def test_format_credit_is_still_available_as_an_option():
    # tiny models that never produce the format (SmolLM2) can opt in; the failure mode is documented
    env = GSM8KEnv(data=[{"question": "1+1?", "answer": 2}], format_reward=0.1)
    env.reset(options={"index": 0})
    assert env.step("#### 3")[1] == pytest.approx(0.1)
