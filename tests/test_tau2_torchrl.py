"""tau2 envs through the TorchRL adapter (envs.adapters.torchrl_env.TextEnv): specs and batched multi-turn rollouts."""
import warnings

import gymnasium as gym
import pytest
import torch
from tensordict import NonTensorStack, TensorDict
from torchrl.envs.utils import check_env_specs

import envs
from envs.tau2.oracle import oracle_actions
from envs.adapters.torchrl_env import TextEnv, make_torchrl_env

gym.register_envs(envs)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("env_id,kwargs", [("tau2/mock-v0", {}), ("tau2/telecom-v0", {"split": "small"}), ("tau2/retail-v0", {})])
def test_check_env_specs_tau2(env_id, kwargs):
    env = make_torchrl_env(env_id, batch_size=2, **kwargs)
    check_env_specs(env, seed=0)
    env.close()


@pytest.mark.parametrize("domain,user", [("airline", "scripted"), ("telecom", "solo")])
def test_batched_gold_rollout(domain, user):
    """Three tasks in one batch, episodes of different lengths, multi-turn: all score 1.0."""
    gyms = [gym.make(f"tau2/{domain}-v0", user=user, disable_env_checker=True) for _ in range(3)]
    env = TextEnv(gyms)
    td = env.reset(TensorDict({"task_index": torch.tensor([0, 1, 2])}, batch_size=[3]))
    assert [g.unwrapped.task.id for g in gyms] == [g.unwrapped.tasks[i].id for i, g in enumerate(gyms)]
    plans = [oracle_actions(g.unwrapped.task, g.unwrapped.solo) for g in gyms]
    assert len({len(p) for p in plans}) > 1 or domain == "telecom"
    horizon = max(len(p) for p in plans)
    step = {"t": 0}

    def policy(td):
        t = step["t"]
        step["t"] += 1
        td["action"] = NonTensorStack(*[p[t] if t < len(p) else "###STOP###" for p in plans])
        return td

    data = env.rollout(horizon, policy, auto_reset=False, tensordict=td, break_when_any_done=False)
    assert data.batch_size == torch.Size([3, horizon])
    rewards = data["next", "reward"].squeeze(-1)
    done = data["next", "done"].squeeze(-1)
    for b, plan in enumerate(plans):
        assert done[b, len(plan) - 1] and not done[b, : len(plan) - 1].any()
        # (after its end torchrl's rollout resets the env on a new task: only the first episode counts)
        assert rewards[b, len(plan) - 1] == 1.0 and rewards[b, : len(plan)].sum() == 1.0
        last = data[b, len(plan) - 1]
        info = last["next", "info"]
        assert info["termination_reason"] == "agent_stop" and info["reward_binary"] == 1.0
        # the conversation grows turn after turn and the tools are reported
        msgs = last["next", "messages"]
        n_calls = sum(1 for a in plan if a.get("tool_calls") and a["tool_calls"][0]["function"]["name"] != "done")
        assert msgs[0]["role"] == "system" and sum(m["role"] == "tool" for m in msgs) == n_calls
        assert data[b, 0]["next", "tools"] == gyms[b].unwrapped.tools
    env.close()


def test_partial_reset_starts_a_new_tau2_task():
    env = make_torchrl_env("tau2/mock-v0", batch_size=2)
    env.reset(TensorDict({"task_index": torch.tensor([0, 1])}, batch_size=[2]))
    td = env.step(TensorDict({"action": NonTensorStack("###STOP###", "Hello?")}, batch_size=[2]))
    assert td["next", "done"].squeeze(-1).tolist() == [True, False]
    before = td["next", "messages"][1]
    reset_td = TensorDict(
        {"_reset": torch.tensor([[True], [False]]), "task_index": torch.tensor([3, -1])}, batch_size=[2]
    )
    out = env.reset(reset_td)
    assert env.envs[0].unwrapped.task.id == env.envs[0].unwrapped.tasks[3].id
    assert out["messages"][1] == before and not out["done"].any()
    env.close()
