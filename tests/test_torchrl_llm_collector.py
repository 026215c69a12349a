"""A TorchRL user's path: torchrl's own ``LLMCollector`` with a ``TransformersWrapper`` (tiny random Llama) drives
``envs.adapters.torchrl_env`` (single-turn GSM8K, multi-turn tau2 mock) with no code of the trainer in between."""
from __future__ import annotations

import pytest
import torch
from torchrl.collectors.llm import LLMCollector
from torchrl.envs import InitTracker
from torchrl.modules.llm import TransformersWrapper

from envs.gsm8k.grading import extract_answer, is_correct
from envs.adapters.torchrl_env import make_torchrl_env
from tests.gsm8k_data import needs_data


@pytest.fixture(scope="module")
def policy():
    """Sampling (greedy decoding of the random model repeats a newline, which the envs read as an empty action)."""
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny-random")  # own copy: the wrapper may touch the tokenizer
    torch.manual_seed(0)
    return TransformersWrapper(model.eval(), tokenizer=tok, input_mode="text", generate=True,
                               generate_kwargs={"max_new_tokens": 8, "do_sample": True})


@needs_data
def test_llm_collector_drives_gsm8k(policy):
    env = make_torchrl_env("GSM8K-v1", batch_size=2, split="train", tokenizer=policy.tokenizer)
    env.set_seed(0)
    collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2  # total_dialog_turns / dialog_turns_per_batch
    tasks = []
    for batch in batches:
        assert batch.batch_size == (2, 2)  # [B envs, T steps]: one-step episodes, auto-reset in between
        assert batch["next", "reward"].shape == (2, 2, 1) and batch["next", "reward"].dtype == torch.float32
        assert batch["next", "done"].all() and batch["next", "terminated"].all()
        for b in range(2):
            for t in range(2):
                step = batch[b][t]
                response, info = step["text", "response"], step["info"]
                assert step["messages"][-1]["content"] in step["text", "prompt"]  # the question
                # the wrapper's text is the env's action, graded by the env's own rule
                assert step["next", "messages"][-1] == {"role": "assistant", "content": response}
                want = float(is_correct(extract_answer(response), info["answer"]))
                assert step["next", "reward"].item() == want
                tasks.append(info["index"])
    assert len(set(tasks)) > 1  # auto-resets drew new problems


@pytest.mark.parametrize("init_tracker", [False, True])
def test_llm_collector_drives_multi_turn_tau2(policy, init_tracker):
    """``init_tracker``: the env as torchrl >= 0.15's collector will run it (InitTracker appended for the policy)."""
    env = make_torchrl_env("tau2/mock-v0", batch_size=2, split="base", tokenizer=policy.tokenizer, max_steps=3)
    if init_tracker:
        env = env.append_transform(InitTracker())
    env.set_seed(0)
    collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=6, yield_completed_trajectories=True)
    batch = next(iter(collector))
    collector.shutdown()
    # two whole episodes of 3 assistant turns, each cut by max_steps
    assert batch.batch_size == (6,)
    assert batch["next", "done"].view(-1).tolist() == [False, False, True] * 2
    assert batch["next", "truncated"].view(-1).tolist() == [False, False, True] * 2
    assert batch["next", "reward"].shape == (6, 1) and (batch["next", "reward"] == 0).all()
    assert batch[2]["next", "info"]["termination_reason"] == "max_steps"
    if init_tracker:
        assert batch["is_init"].view(-1).tolist() == [True, False, False] * 2
    for t in range(6):
        step = batch[t]
        before, after = step["messages"], step["next", "messages"]
        assert after[: len(before)] == before  # the env extends its conversation turn by turn
        said = [m for m in after[len(before):] if m["role"] == "assistant"]
        assert len(said) == 1 and (said[0]["content"] or "") in step["text", "response"]
        if "<tool_call>" not in step["text", "response"]:
            assert said[0]["content"] == step["text", "response"]
        if t % 3 != 2:  # the next turn's prompt is re-rendered with this response in it
            assert said[0]["content"] in batch[t + 1]["text", "prompt"]
