"""Our envs as verifiers environments (envs/adapters/verifiers_env.py), driven by verifiers' own evaluation loop.

verifiers is not installed in the project venv (it pins mcp<2): build its venv and run this file with it::

    bash benchmarks/verifiers_env.sh            # /work/venv-verifiers-031 (verifiers 0.3.1 over the project venv)
    ../venv-verifiers-031/bin/python -m pytest -q tests/test_verifiers_env.py

Elsewhere the whole file skips (no verifiers, or verifiers 0.4.x without the classic API).

The model is scripted: :class:`ScriptedModel` is an OpenAI-compatible chat-completions endpoint on an httpx transport
(no socket) that replays given assistant messages (the env's ``demonstration``: gold tool calls and the stop, gold
worked solutions), called through verifiers' own ``OpenAIChatCompletionsClient`` over a real ``openai.AsyncOpenAI``.
Every reward verifiers reports is checked against ``gym.make`` replaying the same messages.
"""
from __future__ import annotations

import asyncio
import json
import types

import pytest

vf = pytest.importorskip("verifiers")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip(f"verifiers {vf.__version__} has no classic in-process API (needs 0.3.x)", allow_module_level=True)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import gymnasium as gym  # noqa: E402

import envs  # noqa: E402
from envs.adapters.verifiers_env import GYM_STATE_KEY, assistant_action, load_environment, to_vf_messages  # noqa: E402
from tests.toy_envs import SlowStepEnv  # noqa: E402

gym.register_envs(envs)

#: Request header naming the rollout's task (the model itself only sees the conversation; tau2 mock has tasks with
#: the same opening and different gold actions, so the script is chosen by task).
TASK_HEADER = "X-Task-Id"


class ScriptedModel:
    """An OpenAI-compatible ``POST /chat/completions`` that answers a conversation of task ``t`` with
    ``scripts[t][n]``, ``n`` the number of assistant messages the conversation holds past the task's opening."""

    def __init__(self, scripts: dict[str, list[dict]], opening_turns: dict[str, int]):
        self.scripts, self.opening_turns, self.requests = scripts, opening_turns, []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        task_id = request.headers[TASK_HEADER]
        self.requests.append((task_id, body))
        n = sum(m["role"] == "assistant" for m in body["messages"]) - self.opening_turns[task_id]
        script = self.scripts[task_id]
        if not 0 <= n < len(script):
            return httpx.Response(400, json={"error": {"message": f"script of {task_id} has no turn {n}"}})
        reply = script[n]
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):  # OpenAI's wire format (a script may hold our env's shorthand, e.g. do-nothing)
            message["tool_calls"] = []
            for i, c in enumerate(reply["tool_calls"]):
                args = c["function"]["arguments"]
                message["tool_calls"].append({
                    "id": c.get("id") or f"scripted_{n}_{i}", "type": "function",
                    "function": {"name": c["function"]["name"],
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return httpx.Response(200, json={
            "id": f"scripted-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def client(self):
        """verifiers' chat-completions client over ``openai.AsyncOpenAI`` on this endpoint; it sends the rollout's
        task id in :data:`TASK_HEADER` (as verifiers' ``ClientConfig.extra_headers_from_state`` routes by state)."""

        class TaskRoutedClient(vf.OpenAIChatCompletionsClient):
            async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
                kwargs["extra_headers"] = {TASK_HEADER: str(kwargs["state"]["info"]["task_id"])}
                return await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)

        return TaskRoutedClient(openai.AsyncOpenAI(
            base_url="http://scripted.invalid/v1", api_key="scripted", max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handle))))


def _rows(env) -> list[dict]:
    return env.get_eval_dataset().to_list()


def _evaluate(env, scripts: dict[str, list[dict]]) -> tuple[list[dict], ScriptedModel]:
    """verifiers' ``env.evaluate`` over every row with the scripted model: its outputs, in row order."""
    rows = _rows(env)
    model = ScriptedModel(scripts, {r["info"]["task_id"]: sum(m["role"] == "assistant" for m in r["prompt"])
                                    for r in rows})
    results = asyncio.run(env.evaluate(model.client(), "scripted", state_columns=[GYM_STATE_KEY],
                                       on_progress=lambda *a: None))
    outputs = sorted(results["outputs"], key=lambda o: o["example_id"])
    assert [o["info"]["task_id"] for o in outputs] == [r["info"]["task_id"] for r in rows]
    return outputs, model


def _gym_replay(env_id: str, make_kwargs: dict, task_id: str, actions: list) -> tuple[float, dict]:
    """``gym.make``'s reward for ``actions`` played in order on ``task_id`` (stopping where the episode ends)."""
    env = gym.make(env_id, **make_kwargs)
    try:
        env.reset(options={"task_id": task_id})
        reward, info = 0.0, {}
        for a in actions:
            _, reward, terminated, truncated, info = env.step(a)
            if terminated or truncated:
                break
        else:
            raise AssertionError(f"{task_id}: the episode did not end")
        return float(reward), info
    finally:
        env.close()


def _demos(env_id: str, make_kwargs: dict, task_ids: list[str]) -> dict[str, list[dict]]:
    env = gym.make(env_id, **make_kwargs)
    try:
        return {t: env.unwrapped.demonstration({"task_id": t}) for t in task_ids}
    finally:
        env.close()


def _plain(message) -> dict:
    """A message of a verifiers output as a dict (outputs hold message models, or dicts whose tool calls are JSON
    strings)."""
    m = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    calls = [json.loads(c) if isinstance(c, str) else c.model_dump() if hasattr(c, "model_dump") else c
             for c in m.get("tool_calls") or []]
    return {**m, "tool_calls": calls}


def _assistant_turns(completion: list) -> list[dict]:
    """The model's messages of a verifiers output's completion, as our env actions."""
    return [assistant_action(_plain(m)) for m in completion if _plain(m)["role"] == "assistant"]


def _calls(action: dict) -> list:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in action.get("tool_calls") or []]


def _same_action(a: dict, b: dict) -> bool:
    return (a.get("content") or "") == (b.get("content") or "") and _calls(a) == _calls(b)


# ---------------------------------------------------------------------------------------------------------------
# tau2 mock: multi-turn with the domain's tools
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mock_env():
    env = load_environment("tau2/mock-v0")
    yield env
    asyncio.run(env._teardown())


def test_tau2_mock_gold_scores_one_through_verifiers_evaluate(mock_env):
    """Every task of tau2 mock (9, scripted customer): verifiers' loop plays the gold tool calls and stop, the model
    is offered the domain's tools, and the reward is gym.make's on the same messages: 1.0, except on the one task
    whose gold tau2 itself scores 0 (update_task_with_history_and_env_assertions lists no gold action but asserts
    task_2 completed; gym.make agrees)."""
    assert isinstance(mock_env, vf.MultiTurnEnv) and mock_env.env_id == "tau2/mock-v0"
    task_ids = [r["info"]["task_id"] for r in _rows(mock_env)]
    assert len(task_ids) == 9
    demos = _demos("tau2/mock-v0", {}, task_ids)
    outputs, model = _evaluate(mock_env, demos)
    probe = gym.make("tau2/mock-v0")
    _, info = probe.reset(options={"index": 0})
    tool_names = sorted(t["function"]["name"] for t in info["tools"])
    assert all(sorted(t["function"]["name"] for t in body["tools"]) == tool_names for _, body in model.requests)
    below_one = set()
    for o in outputs:
        task_id = o["info"]["task_id"]
        assert o["error"] is None and o["stop_condition"] == "has_final_env_response", (task_id, o["error"])
        turns = _assistant_turns(o["completion"])
        assert len(turns) == len(demos[task_id]) and all(map(_same_action, turns, demos[task_id])), task_id
        reward, info = _gym_replay("tau2/mock-v0", {}, task_id, demos[task_id])
        assert o["reward"] == o["metrics"]["env_reward"] == reward, task_id
        assert o[GYM_STATE_KEY]["termination_reason"] == info["termination_reason"] == "agent_stop"
        assert o[GYM_STATE_KEY]["steps"] == len(demos[task_id])
        if reward < 1.0:
            below_one.add(task_id)
    assert below_one == {"update_task_with_history_and_env_assertions"}


def test_tau2_mock_imperfect_agents_score_as_gym_make(mock_env):
    """Two imperfect agents per task -- a call to an unknown tool then the gold, and the env's do-nothing action
    alone -- score through verifiers exactly as gym.make scores the same messages (not all 1.0)."""
    task_ids = [r["info"]["task_id"] for r in _rows(mock_env)]
    demos = _demos("tau2/mock-v0", {}, task_ids)
    bad_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "bad_0", "type": "function", "function": {"name": "no_such_tool", "arguments": "{}"}}]}
    probe = gym.make("tau2/mock-v0")
    do_nothing = probe.unwrapped.do_nothing_action
    for scripts in ({t: [bad_call] + demos[t] for t in task_ids}, {t: [do_nothing] for t in task_ids}):
        outputs, _ = _evaluate(mock_env, scripts)
        rewards = []
        for o in outputs:
            task_id = o["info"]["task_id"]
            reward, info = _gym_replay("tau2/mock-v0", {}, task_id, scripts[task_id])
            assert o["error"] is None and o["reward"] == reward, task_id
            assert o[GYM_STATE_KEY]["termination_reason"] == info["termination_reason"]
            rewards.append(reward)
        if scripts[task_ids[0]][0] is bad_call:  # the unknown tool is answered with an error message, then gold plays
            tool_replies = [m for o in outputs for m in map(_plain, o["completion"]) if m["role"] == "tool"
                            and m["tool_call_id"] == "bad_0"]
            assert len(tool_replies) == len(outputs) and all(m["content"].startswith("Error") for m in tool_replies)
    assert 0.0 in rewards and 1.0 in rewards  # the do-nothing agent: some tasks need no change, most do


def test_a_rollout_verifiers_cuts_scores_zero(mock_env):
    """A rollout cut by verifiers' max_turns before the env ended scores 0 (our collector's truncation). verifiers
    checks max_turns before it hands the last reply to the env: with max_turns=2 the env sees one message, so only a
    one-message gold (the stop alone) ends the episode."""
    task_ids = [r["info"]["task_id"] for r in _rows(mock_env)]
    demos = _demos("tau2/mock-v0", {}, task_ids)
    mock_env.max_turns = 2
    try:
        outputs, _ = _evaluate(mock_env, demos)
    finally:
        mock_env.max_turns = -1
    assert {len(d) for d in demos.values()} >= {1, 2}
    for o in outputs:
        task_id = o["info"]["task_id"]
        assert o[GYM_STATE_KEY]["steps"] == 1
        if len(demos[task_id]) > 1:
            assert o["reward"] == 0.0 and o["stop_condition"] == "max_turns_reached"
            assert o[GYM_STATE_KEY]["reward"] is None
        else:
            assert o["stop_condition"] == "has_final_env_response"
            assert o["reward"] == _gym_replay("tau2/mock-v0", {}, task_id, demos[task_id])[0]


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_other_tau2_domains_gold_scores_one_as_gym_make(domain):
    """The first 3 usable tasks of every other tau2 domain (default customer: scripted; telecom: solo): gold = 1.0
    through verifiers, as through gym.make."""
    env_id = f"tau2/{domain}-v0"
    env = load_environment(env_id, limit=3)
    task_ids = [r["info"]["task_id"] for r in _rows(env)]
    demos = _demos(env_id, {}, task_ids)
    outputs, _ = _evaluate(env, demos)
    for o in outputs:
        task_id = o["info"]["task_id"]
        assert o["error"] is None and o["reward"] == _gym_replay(env_id, {}, task_id, demos[task_id])[0] == 1.0
    asyncio.run(env._teardown())


# ---------------------------------------------------------------------------------------------------------------
# one-turn envs: our grader as the rubric
# ---------------------------------------------------------------------------------------------------------------
def test_gsm8k_gold_scores_one_and_wrong_answers_zero_as_gym_make():
    env = load_environment("GSM8K-v1", split="test", limit=6)
    assert isinstance(env, vf.SingleTurnEnv)
    rows = _rows(env)
    task_ids = [r["info"]["task_id"] for r in rows]
    demos = _demos("GSM8K-v1", {"split": "test"}, task_ids)
    # odd rows: the gold worked solution with its final answer plus one
    scripts = {t: demos[t] if i % 2 == 0 else
               [{"role": "assistant", "content": f"The answer is\n#### {int(rows[i]['answer']) + 1}"}]
               for i, t in enumerate(task_ids)}
    outputs, _ = _evaluate(env, scripts)
    for i, o in enumerate(outputs):
        task_id = o["info"]["task_id"]
        reward, info = _gym_replay("GSM8K-v1", {"split": "test"}, task_id, [scripts[task_id][0]["content"]])
        assert o["error"] is None and o["reward"] == o["metrics"]["env_reward"] == reward
        assert reward == (1.0 if i % 2 == 0 else 0.0)
        assert o[GYM_STATE_KEY]["termination_reason"] == info["termination_reason"] == "answered"
    asyncio.run(env._teardown())


def test_reasoning_gym_chain_sum_gold_scores_one_as_gym_make():
    kwargs = {"task": "chain_sum", "split": "test"}
    env = load_environment("ReasoningGym-v1", limit=5, **kwargs)
    task_ids = [r["info"]["task_id"] for r in _rows(env)]
    demos = _demos("ReasoningGym-v1", kwargs, task_ids)
    outputs, _ = _evaluate(env, demos)
    for o in outputs:
        task_id = o["info"]["task_id"]
        reward, _ = _gym_replay("ReasoningGym-v1", kwargs, task_id, [demos[task_id][-1]["content"]])
        assert o["error"] is None and o["reward"] == reward == 1.0
    asyncio.run(env._teardown())


def test_ifeval_reward_is_gym_makes():
    """IFEval-v0 (no demonstrations): a fixed reply scores through verifiers as gym.make scores it."""
    try:
        env = load_environment("IFEval-v0", limit=3)
    except (ImportError, ModuleNotFoundError) as e:
        pytest.skip(f"IFEval-v0 needs the extra [ifeval]: {e}")
    task_ids = [r["info"]["task_id"] for r in _rows(env)]
    text = "Hello. This is a short reply, written in English, with a few words; it ends here."
    outputs, _ = _evaluate(env, {t: [{"role": "assistant", "content": text}] for t in task_ids})
    for o in outputs:
        reward, _ = _gym_replay("IFEval-v0", {}, o["info"]["task_id"], [text])
        assert o["error"] is None and o["reward"] == reward and 0.0 <= reward <= 1.0
    asyncio.run(env._teardown())


# ---------------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------------
def test_verifiers_own_loader_finds_the_module():
    env = vf.load_environment("envs.adapters.verifiers_env", gym_id="ReasoningGym-v1", task="chain_sum", split="test", limit=2)
    assert isinstance(env, vf.SingleTurnEnv) and env.env_id == "ReasoningGym-v1" and len(env.get_eval_dataset()) == 2
    assert env.env_args["task"] == "chain_sum"
    asyncio.run(env._teardown())


@pytest.mark.parametrize("args,kwargs", [((), {}), (("GSM8K-v1",), {"gym_id": "GSM8K-v1"}),
                                         (("tau2/agent-gym-v0",), {}), (("GSM8K-v1",), {"limit": 0}),
                                         (("GSM8K-v1",), {"limit": "3"})])
def test_load_environment_refuses_bad_arguments(args, kwargs):
    with pytest.raises(ValueError):
        load_environment(*args, **kwargs)


def test_message_conversions():
    msgs = to_vf_messages([{"role": "system", "content": "s"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                           {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "ok"}])
    assert msgs[1]["tool_calls"] == [{"id": "c1", "name": "f", "arguments": '{"a": 1}'}]
    assert msgs[2] == {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    with pytest.raises(ValueError):
        to_vf_messages([{"role": "narrator", "content": "x"}])
    action = assistant_action(vf.AssistantMessage(content=[{"type": "text", "text": "hi"}],
                                                  tool_calls=[vf.ToolCall(id="c", name="f", arguments="{}")]))
    assert action == {"role": "assistant", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(TypeError):
        assistant_action({"role": "user", "content": "x"})


# --- a rollout cancelled during its env's step (issue 49, the 0.3 adapter's twin of tests/test_verifiers_v1_cancel.py)
SLOW_ID = "SlowStep-v0"  # tests.toy_envs.SlowStepEnv


def test_a_rollout_cancelled_during_a_step_returns_its_env_only_after_the_step():
    """verifiers 0.3's ``MultiTurnEnv.rollout`` runs the turn loop under ``asyncio.wait_for(..., timeout_seconds)`` and
    its cleanup handlers in ``finally``: a timeout cancels ``env_response`` while ``env.step`` goes on in its thread,
    then ``release_env`` runs. The env must not go back to the pool (where the next rollout's ``setup_state`` would
    reset it) before that step has finished."""
    from envs.adapters.env_pool import EnvPool
    from envs.adapters.verifiers_env import _classes

    GymToolEnv = _classes()[0]
    SlowStepEnv.rearm()
    pool = EnvPool(lambda: gym.make(SLOW_ID))
    rollouts = types.SimpleNamespace(_pool=pool, _episodes={})  # what the hooks use of the env (self)
    state = {"trajectory_id": "t1", "info": {"task_id": "0"}}

    async def main():
        await GymToolEnv.setup_state(rollouts, state)
        turn = asyncio.create_task(GymToolEnv.env_response(rollouts, [{"role": "assistant", "content": "x"}], state))
        assert await asyncio.to_thread(SlowStepEnv.step_started.wait, 60)
        turn.cancel()  # verifiers' timeout
        with pytest.raises(asyncio.CancelledError):
            await turn
        await GymToolEnv.release_env(rollouts, state)  # verifiers' cleanup, in rollout's finally
        stepping = [e.unwrapped for e in pool._all if e.unwrapped.busy]
        assert len(stepping) == 1 and stepping[0] not in [e.unwrapped for e in pool._idle], \
            "the env of a running step went back to the pool"
        SlowStepEnv.let_steps_end.set()
        for _ in range(1000):
            if stepping[0] in [e.unwrapped for e in pool._idle]:
                break
            await asyncio.sleep(0.01)
        assert stepping[0] in [e.unwrapped for e in pool._idle] and not stepping[0].busy
        assert stepping[0].overlaps == 0 and not rollouts._episodes

    try:
        asyncio.run(main())
    finally:
        SlowStepEnv.let_steps_end.set()
        pool.close()
