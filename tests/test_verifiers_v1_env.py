"""Our envs as verifiers 0.4 (``verifiers.v1``) environments (envs/adapters/verifiers_v1_env.py, plugin id
``gym-taskset``), driven by verifiers' own episode machinery: ``vf.load_environment``, ``Env.serving()`` (its
interception server), ``Env.run_episode`` and the task's ``@vf.reward``.

verifiers 0.4 is not installed in the project venv (it pins mcp==2.0.0): build its venv and run this file with it::

    VERIFIERS_VERSION=0.4.0 bash benchmarks/verifiers_env.sh ../venv-verifiers-040
    ../venv-verifiers-040/bin/python -m pytest -q tests/test_verifiers_v1_env.py

Elsewhere the whole file skips. The model is scripted: :class:`ScriptedModel` is an OpenAI-compatible
``POST /v1/chat/completions`` on a loopback socket that replays given assistant messages (the env's
``demonstration``), reached through verifiers' interception server exactly as a real endpoint would be. Every reward
verifiers reports is checked against ``gym.make`` replaying the same messages. Nothing is fetched: the default
harness (``GymChatHarness``) runs in-process.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

vf = pytest.importorskip("verifiers.v1", reason="needs verifiers 0.4 (verifiers.v1) in its own venv")

import gymnasium as gym  # noqa: E402

import envs  # noqa: E402
from envs.adapters.verifiers_v1_env import GymEnv, GymEnvConfig, GymTasksetConfig  # noqa: E402

gym.register_envs(envs)
KEY_VAR = "SCRIPTED_MODEL_KEY"


class ScriptedModel:
    """Answers the n-th chat completion of the current episode with ``script[n]`` (OpenAI wire format); records
    every request body."""

    def __init__(self):
        self.script: list[dict] = []
        self.requests: list[dict] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model.requests.append(body)
                out = json.dumps(model.reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def play(self, script: list[dict]) -> None:
        self.script, self.requests = list(script), []

    def reply(self, body: dict) -> dict:
        n = len(self.requests) - 1
        reply = self.script[n] if n < len(self.script) else {"content": "(the script has ended)"}
        message = {"role": "assistant", "content": reply.get("content")}
        calls = reply.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [{"id": c.get("id") or f"call_{n}_{i}", "type": "function", "function": {
                "name": c["function"]["name"], "arguments": c["function"]["arguments"]
                if isinstance(c["function"]["arguments"], str) else json.dumps(c["function"]["arguments"])}}
                for i, c in enumerate(calls)]
        return {"id": f"scripted-{n}", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture(scope="module")
def model():
    os.environ.setdefault(KEY_VAR, "scripted")
    m = ScriptedModel()
    yield m
    m.server.shutdown()


def _env(gym_id: str, **taskset) -> GymEnv:
    env = vf.load_environment(GymEnvConfig(taskset=GymTasksetConfig(id="gym-taskset", gym_id=gym_id, **taskset)))
    assert isinstance(env, GymEnv)
    return env


def _run(env: GymEnv, model: ScriptedModel, scripts: dict[str, list[dict]]) -> dict[str, tuple]:
    """Every task of ``env``'s taskset, one episode each with its script: task_id -> (trace, requests)."""
    ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=model.base_url, api_key_var=KEY_VAR))

    async def main():
        out = {}
        async with env.serving():
            for task in env.taskset.load():
                model.play(scripts[task.data.task_id])
                episode = await env.run_episode(task, ctx)
                assert episode.errors == [], episode.errors
                out[task.data.task_id] = (episode.traces[0], list(model.requests))
        return out

    return asyncio.run(main())


def _demos(gym_id: str, make_kwargs: dict, task_ids) -> dict[str, list[dict]]:
    env = gym.make(gym_id, **make_kwargs)
    try:
        return {t: env.unwrapped.demonstration({"task_id": t}) for t in task_ids}
    finally:
        env.close()


def _gym_replay(gym_id: str, make_kwargs: dict, task_id: str, actions: list) -> float:
    env = gym.make(gym_id, **make_kwargs)
    try:
        env.reset(options={"task_id": task_id})
        for a in actions:
            _, reward, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                return float(reward)
        return 0.0
    finally:
        env.close()


def _task_ids(env: GymEnv) -> list[str]:
    return [t.data.task_id for t in env.taskset.load()]


def test_tau2_mock_gold_through_verifiers_v1_equals_gym_make(model):
    """Every task of tau2 mock: the scripted model plays the gold tool calls through verifiers 0.4's interception,
    it is offered the domain's tools natively, and the reward verifiers records is gym.make's on the same actions
    (1.0 except where tau2's own evaluator scores a gold 0: tests/test_tau2_gold.py)."""
    env = _env("tau2/mock-v0")
    ids = _task_ids(env)
    demos = _demos("tau2/mock-v0", {}, ids)
    results = _run(env, model, demos)
    assert len(results) == len(ids) == 9
    tools = gym.make("tau2/mock-v0").reset(options={"task_id": ids[0]})[1]["tools"]
    ones = 0
    for task_id, (trace, requests) in results.items():
        expected = _gym_replay("tau2/mock-v0", {}, task_id, demos[task_id])
        assert trace.reward == expected
        assert trace.info["gym"]["terminated"] and trace.info["gym"]["steps"] == len(demos[task_id])
        assert all(r["tools"] == tools for r in requests)
        ones += expected == 1.0
    assert ones >= len(ids) - 2  # the gold of at most two mock tasks scores 0 with tau2 itself


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_other_tau2_domains_gold_scores_one(model, domain):
    gym_id = f"tau2/{domain}-v0"
    env = _env(gym_id, limit=2)
    ids = _task_ids(env)
    demos = _demos(gym_id, {}, ids)
    for task_id, (trace, _) in _run(env, model, demos).items():
        assert trace.reward == _gym_replay(gym_id, {}, task_id, demos[task_id]) == 1.0


def test_one_turn_envs_gold_and_wrong_answers_score_as_gym_make(model):
    """GSM8K: the gold solution scores 1, the gold answer plus one scores 0, as through gym.make."""
    env = _env("GSM8K-v1", split="test", limit=4)
    ids = _task_ids(env)
    demos = _demos("GSM8K-v1", {"split": "test"}, ids)
    answers = {t.data.task_id: t.data.answer for t in env.taskset.load()}
    scripts = {t: demos[t] if i % 2 == 0 else [{"content": f"#### {int(answers[t]) + 1}"}] for i, t in enumerate(ids)}
    results = _run(env, model, scripts)
    for i, task_id in enumerate(ids):
        trace, requests = results[task_id]
        assert trace.reward == _gym_replay("GSM8K-v1", {"split": "test"}, task_id,
                                           [scripts[task_id][0]["content"]]) == (1.0 if i % 2 == 0 else 0.0)
        assert "tools" not in requests[0]


def test_reasoning_gym_gold_scores_one(model):
    kwargs = {"task": "chain_sum", "split": "test"}
    env = _env("ReasoningGym-v1", split="test", limit=3, make_kwargs={"task": "chain_sum"})
    ids = _task_ids(env)
    demos = _demos("ReasoningGym-v1", kwargs, ids)
    for task_id, (trace, _) in _run(env, model, {t: demos[t][-1:] for t in ids}).items():
        assert trace.reward == _gym_replay("ReasoningGym-v1", kwargs, task_id, [demos[task_id][-1]["content"]]) == 1.0


def test_an_agent_that_never_ends_the_episode_scores_zero(model):
    """verifiers' turn limit cuts the episode before the env ends it: reward 0, as our collector scores a truncation."""
    config = GymEnvConfig(taskset=GymTasksetConfig(id="gym-taskset", gym_id="tau2/mock-v0", limit=1),
                          agent=vf.AgentConfig(runtime=vf.SubprocessConfig(), max_turns=2))
    env = vf.load_environment(config)
    task_id = _task_ids(env)[0]
    talk = [{"content": "Let me think about that."}] * 5
    trace, _ = _run(env, model, {task_id: talk})[task_id]
    assert trace.reward == 0.0 and trace.info["gym"]["reward"] is None


@pytest.mark.parametrize("gym_id", ["tau2/agent-gym-v0", "NoSuchEnv-v0"])
def test_bad_ids_are_refused(gym_id):
    env = _env(gym_id)
    with pytest.raises((ValueError, gym.error.Error)):
        list(env.taskset.load())
