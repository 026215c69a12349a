"""envs.serve driven by openenv-core's own HTTP env client (issue 38, item 3).

openenv-core 0.2.x and 0.3.0 ship no HTTP env client (their ``EnvClient`` / ``GenericEnvClient`` speak WebSocket only);
0.1.1 is the last with one: ``openenv_core.http_env_client.HTTPEnvClient`` (``requests``; ``reset()`` POSTs ``{base}/reset``
with ``{}``, ``step(a)`` POSTs ``{base}/step`` with ``{"action": _step_payload(a), "timeout_s": int}``, ``state()`` GETs
``{base}/state``; errors surface as ``requests.HTTPError`` from ``raise_for_status``). Its top-level package is
``openenv_core``, not 0.3.0's ``openenv`` (0.3.0 ships an ``openenv_core`` too: a deprecated alias package without
``http_env_client``, which 0.1.1 on ``PYTHONPATH`` shadows), so it sits beside the project's openenv-core 0.3.0 on a path:
``.ci/openenv-http-stage`` installs it with ``pip install --no-deps --target <dir> openenv-core==0.1.1`` and runs this file
with ``PYTHONPATH=<dir>`` (in the project venv, without it, the file skips).

A real ``python -m envs.serve`` subprocess on 127.0.0.1 is driven by an ``HTTPEnvClient`` subclass, as a user of that
client writes one per env:

* OpenEnv's stateless routes (``base_url=<server>``): a GSM8K one-step episode, the task named in the action's
  ``metadata`` (OpenEnv's ``Action`` field; the client sends nothing beside the action but ``timeout_s``), scores
  the gold answer 1.0 and a wrong one 0.0, as ``gym.make`` does;
* our sessions (``base_url=<server>/sessions/<id>``: the same three routes per session, the stateful server 0.1.1's
  client was written for): tau2 mock gold episodes of several steps score what ``gym.make``'s replay scores;
* errors: 4xx that the client raises as ``requests.HTTPError``, whose ``detail`` names the problem.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("openenv_core.http_env_client", reason="openenv-core 0.1.1's HTTPEnvClient (the last openenv-core with "
                    "an HTTP env client) is not importable: .ci/openenv-http-stage installs it with pip install --no-deps "
                    "--target <dir> openenv-core==0.1.1 and runs this file with PYTHONPATH=<dir>")
pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]')")

import gymnasium as gym
import requests
from openenv_core.client_types import StepResult
from openenv_core.http_env_client import HTTPEnvClient

import envs
from tests.served import serve_process

gym.register_envs(envs)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = 30.0  # seconds per request (loaded machine)


class TextEnvClient(HTTPEnvClient[dict, dict]):
    """``HTTPEnvClient`` for ``envs.serve``: an action is a ``TextAction`` dict ``{"content", "tool_calls"}``; ``task``
    (reset options such as ``{"index": 3}``) rides in every action's ``metadata``, which the stateless ``/step`` reads to
    pick the task of its one-step episode."""

    def __init__(self, base_url: str, task: dict | None = None):
        super().__init__(base_url, request_timeout_s=T)
        self.task = task

    def _step_payload(self, action: dict) -> dict:
        payload = {k: action.get(k) for k in ("content", "tool_calls")}
        return {**payload, "metadata": dict(self.task)} if self.task else payload

    def _parse_result(self, payload: dict) -> StepResult[dict]:
        return StepResult(observation=payload["observation"], reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload: dict) -> dict:
        return payload


def _serve(env_id: str):
    """``python -m envs.serve <env_id> --port 0 --max-sessions 4``: its URL, from the line it prints."""
    return serve_process(env_id, "--max-sessions", "4")


@pytest.fixture(scope="module")
def gsm8k_url():
    with _serve("GSM8K-v1") as url:
        yield url


@pytest.fixture(scope="module")
def mock_url():
    with _serve("tau2/mock-v0") as url:
        yield url


def _gym_episode(env_id: str, index: int, actions: list) -> float:
    """``gym.make``'s reward for ``actions`` played on task ``index``."""
    env = gym.make(env_id)
    try:
        env.reset(options={"index": index})
        reward = 0.0
        for a in actions:
            _, reward, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                break
        return float(reward)
    finally:
        env.close()


def _gold(env_id: str, index: int) -> list[dict]:
    env = gym.make(env_id)
    try:
        return env.unwrapped.demonstration({"index": index})
    finally:
        env.close()


def _active(url: str) -> int:
    return requests.get(url + "/sessions", timeout=T).json()["active"]


def _http_error(call) -> tuple[int, str]:
    with pytest.raises(requests.HTTPError) as e:
        call()
    return e.value.response.status_code, e.value.response.json()["detail"]


def test_stateless_routes_gsm8k_gold_scores_one_and_a_wrong_answer_zero_as_gym_make(gsm8k_url):
    """Before: 422 on every step (the task is named nowhere in the client's body: {"action", "timeout_s"})."""
    gold = _gold("GSM8K-v1", 3)[0]["content"]
    for index, answer, expected in ((3, gold, 1.0), (4, "I think it is\n#### 123456789", 0.0)):
        reward = _gym_episode("GSM8K-v1", index, [answer])
        assert reward == expected
        result = TextEnvClient(gsm8k_url, task={"index": index}).step({"content": answer})
        assert (result.reward, result.done) == (reward, True)
        assert result.observation["info"]["index"] == index

    client = TextEnvClient(gsm8k_url)
    opening = client.reset()  # {}: a fresh env's opening, on a task it draws
    assert opening.done is False and opening.reward is None
    assert opening.observation["messages"] and 0 <= opening.observation["info"]["index"]
    state = client.state()  # a fresh env's state: no episode outlives its request
    assert state["step_count"] == 0 and state["messages"] == [] and state["env_id"] == "GSM8K-v1"
    assert _active(gsm8k_url) == 0


def test_session_routes_tau2_mock_gold_episodes_score_as_gym_make(mock_url):
    """Before: 422 on the first step (a session step's body had to be exactly {"action"}; the client adds "timeout_s").
    ``reset()`` sends ``{}``, so the session draws the task; ``state()`` names it and the gold of that task is played."""
    sid = requests.post(mock_url + "/sessions", timeout=T).json()["session_id"]
    client = TextEnvClient(f"{mock_url}/sessions/{sid}")
    seen: dict[int, tuple[float, float]] = {}
    longest = 0
    try:
        for _ in range(20):  # at least 3 episodes, one of several steps (2 of the 9 tasks' gold is the stop alone)
            if len(seen) >= 3 and longest >= 2:
                break
            opening = client.reset()
            index = client.state()["index"]
            assert opening.observation["info"]["index"] == index and opening.observation["info"]["tools"]
            gold = _gold("tau2/mock-v0", index)  # tool calls (and a message), then the stop
            longest = max(longest, len(gold))
            result = None
            for n, action in enumerate(gold, 1):  # noqa: B007 (n is read after the loop)
                result = client.step(action)
                if result.done:
                    break
            assert result.done and n == len(gold)
            state = client.state()
            assert state["done"] and state["step_count"] == len(gold) and state["reward"] == result.reward
            seen[index] = (result.reward, _gym_episode("tau2/mock-v0", index, gold))
    finally:
        client.close()
        requests.delete(f"{mock_url}/sessions/{sid}", timeout=T)
    assert len(seen) >= 3 and longest >= 2, seen
    assert all(ours == theirs for ours, theirs in seen.values()), seen
    # gold = 1.0 except update_task_with_history_and_env_assertions (index 7), whose gold tau2 itself scores 0
    assert all(r == (0.0 if i == 7 else 1.0) for i, (r, _) in seen.items()), seen


def test_errors_are_4xx_the_client_raises_naming_the_problem(gsm8k_url, mock_url):
    # the stateless /step needs a task: beside the action or in its metadata
    status, detail = _http_error(lambda: TextEnvClient(gsm8k_url).step({"content": "#### 72"}))
    assert status == 422 and "metadata" in detail and "index" in detail and "/sessions" in detail, detail
    status, detail = _http_error(lambda: TextEnvClient(gsm8k_url, task={"index": "zero"}).step({"content": "#### 72"}))
    assert status == 400 and "index" in detail, detail
    status, detail = _http_error(lambda: TextEnvClient(gsm8k_url, task={"index": 10**6}).step({"content": "#### 72"}))
    assert status == 400 and "out of range" in detail, detail

    sid = requests.post(mock_url + "/sessions", timeout=T).json()["session_id"]
    client = TextEnvClient(f"{mock_url}/sessions/{sid}")
    try:
        status, detail = _http_error(lambda: client.step({"content": "hello"}))  # before reset
        assert status == 409 and "reset" in detail, detail
        client.reset()
        status, detail = _http_error(lambda: client.step({"content": 72}))  # not an action
        assert status == 422 and "content" in detail and '{"content"' in detail, detail
        # a session acts on its own episode: a task named in a session step's metadata is refused, not ignored
        status, detail = _http_error(lambda: TextEnvClient(f"{mock_url}/sessions/{sid}", task={"index": 3}).step(
            {"content": "hello"}))
        assert status == 422 and "reset" in detail and "index" in detail, detail
        assert client.step({"content": "Hello, how can I help?"}).done is False  # the episode went on unharmed
    finally:
        requests.delete(f"{mock_url}/sessions/{sid}", timeout=T)
    status, detail = _http_error(TextEnvClient(f"{mock_url}/sessions/{sid}").state)  # deleted
    assert status == 404 and "unknown session" in detail, detail
    assert _active(mock_url) == 0 and _active(gsm8k_url) == 0
