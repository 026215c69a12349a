"""envs.adapters.torchrl_openenv: a TorchRL EnvBase driving ``python -m envs.serve <id>`` (a real server process on
127.0.0.1) end to end -- reset, step, reward, done -- for a tau2 domain and GSM8K, equal to the in-process env.

torchrl 0.14.1 has no OpenEnv env class (see the module docstring); this tests our adapter over openenv-core's own
WebSocket client, wrapped by the same TextEnv as in-process envs.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("openenv", reason="needs the optional extra [serve] (openenv-core)")

import gymnasium as gym
import httpx
import torch
from tensordict import NonTensorStack, TensorDict

import envs
from envs.adapters.torchrl_env import make_torchrl_env
from envs.adapters.torchrl_openenv import OpenEnvTextEnv, make_openenv_torchrl_env

gym.register_envs(envs)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(env_id: str, *args: str):
    port = _free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    p = subprocess.Popen([sys.executable, "-m", "envs.serve", env_id, "--port", str(port), "--max-sessions", "4", *args],
                         cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while True:
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            assert time.time() - t0 < 120, "server did not start"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def gsm8k_url():
    with _server("GSM8K-v1", "--env-kwargs", '{"split": "test"}') as url:
        yield url


def _tasks(indices):
    return TensorDict({"task_index": torch.tensor(indices)}, batch_size=[len(indices)])


def _actions(td, actions):
    td["action"] = NonTensorStack(*actions)
    return td


def test_torchrl_env_over_served_tau2_equals_in_process():
    """tau2/mock-v0 served; a TorchRL TextEnv of 2 sessions plays each task's gold actions (one task gold, the other
    the do-nothing ``done``), step by step equal to the in-process TextEnv: observations, rewards, done flags."""
    with _server("tau2/mock-v0") as url:
        remote = make_openenv_torchrl_env(url, batch_size=2)
        local = make_torchrl_env("tau2/mock-v0", batch_size=2)
        try:
            demo = gym.make("tau2/mock-v0").unwrapped.demonstration({"index": 0})
            stop = gym.make("tau2/mock-v0").unwrapped.do_nothing_action
            plans = [demo, [stop]]
            outs = []
            for env in (remote, local):
                td = env.reset(_tasks([0, 1]))
                trace = [(list(td["messages"]), td["info"][0]["task_id"], td["info"][1]["task_id"])]
                for t in range(max(map(len, plans))):
                    acts = [p[min(t, len(p) - 1)] for p in plans]
                    td = env.step(_actions(td, acts))["next"]
                    trace.append((td["reward"].view(-1).tolist(), td["done"].view(-1).tolist(),
                                  td["terminated"].view(-1).tolist(), list(td["observation"])))
                outs.append(trace)
            assert outs[0] == outs[1]
            final_rewards, final_done = outs[0][-1][0], outs[0][-1][1]
            assert final_done == [True, True] and final_rewards[0] == 1.0
            assert outs[0][0][1] == "create_task_1"
        finally:
            remote.close()
            local.close()


def test_torchrl_env_over_served_gsm8k(gsm8k_url):
    env = make_openenv_torchrl_env(gsm8k_url, batch_size=2)
    try:
        td = env.reset(_tasks([3, 5]))
        assert [m[-1]["role"] for m in td["messages"]] == ["user", "user"]
        local = gym.make("GSM8K-v1", split="test")
        answers = [local.reset(options={"index": i})[1]["answer"] for i in (3, 5)]
        td = env.step(_actions(td, [f"#### {answers[0]}", "#### -12345"]))["next"]
        assert td["reward"].view(-1).tolist() == [1.0, 0.0]
        assert td["done"].view(-1).tolist() == [True, True]
        assert td["info"][0]["extracted"] == answers[0] and td["info"][0]["task_id"] == "3"
    finally:
        env.close()


def test_openenv_text_env_errors(gsm8k_url):
    """Bad reset options -> ValueError; an action outside the action space -> TypeError (nothing sent); a step
    after the end -> RuntimeError from the server; the session keeps serving after each; the conversation in
    ``info["messages"]`` (accumulated, or the server's with exact_messages)."""
    env = OpenEnvTextEnv(gsm8k_url)
    try:
        with pytest.raises(ValueError):
            env.reset(options={"index": 10 ** 9})
        with pytest.raises(ValueError):
            env.reset(options={"bogus": 1})
        obs, info = env.reset(options={"task_id": "0"})
        assert obs == info["messages"] and info["task_id"] == "0"
        with pytest.raises(TypeError):
            env.step(12345)
        _, r, term, trunc, info = env.step("#### " + info["answer"])
        assert (r, term, trunc) == (1.0, True, False) and env.state()["done"]
        assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant"]
        with pytest.raises(RuntimeError, match="episode has ended"):
            env.step("#### 1")
        assert env.reset(options={"index": 1})[1]["index"] == 1
    finally:
        env.close()
    exact = OpenEnvTextEnv(gsm8k_url, exact_messages=True)
    try:
        obs, info = exact.reset(options={"index": 2})
        _, _, _, _, info = exact.step("#### 7")
        assert info["messages"] == exact.state()["messages"] and info["messages"][:2] == obs
    finally:
        exact.close()
