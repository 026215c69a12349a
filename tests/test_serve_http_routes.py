"""envs.serve over plain HTTP, OpenEnv's stateless routes (issue 38, item 3).

openenv-core 0.3.0's ``HTTPEnvServer.register_routes`` serves ``POST /reset``, ``POST /step`` and ``GET /state``
(besides ``/health``, ``/schema``, ``/metadata``, ``/ws``, ``/mcp``); our server answered the first three 404, so an
HTTP-only client could not use it. openenv-core 0.3.0 ships no HTTP *env* client (its ``EnvClient`` and
``GenericEnvClient`` speak WebSocket only): what of it speaks HTTP is its runtime validator
(``openenv.cli._validation.validate_running_environment``, ``openenv validate --url``, over ``requests``) and its wire
models (``ResetRequest``, ``StepRequest``, ``ResetResponse``, ``StepResponse``, ``SchemaResponse``, ``State``;
the responses forbid extra keys). These tests drive a real ``python -m envs.serve`` subprocess on 127.0.0.1 with
``requests`` (openenv-core's own HTTP dependency), bodies built and replies validated by those models, and run the
validator against it.

Semantics (OpenEnv's: every stateless request gets a fresh env, closed after it): ``/reset`` answers a task's
opening; ``/step`` plays a one-step episode on a fresh env reset to the task the body names beside the action (the
whole episode for GSM8K, ReasoningGym, IFEval); ``/state`` is a fresh env's empty state. Each request's env counts
against the session cap until its reply has been handed over, and nothing outlives the request.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import requests
from openenv.cli._validation import validate_running_environment
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    HealthResponse,
    ResetRequest,
    ResetResponse,
    SchemaResponse,
    State,
    StepRequest,
    StepResponse,
)
from openenv.core.generic_client import GenericEnvClient

import envs
from tests.served import serve_process
from envs import serve
from envs.serve import GymTextEnvironment, TextAction, build_app

gym.register_envs(envs)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ID = "GSM8K-v1"
T = 30  # seconds per request (loaded machine)


class BigOpeningEnv(gym.Env):
    """Toy chat whose reset opening is ``index`` bytes long (a big reply on demand); any action ends the episode."""

    def __init__(self):
        self.observation_space = gym.spaces.Text(100)
        self.action_space = gym.spaces.Text(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        n = int((options or {}).get("index", 10))
        m = [{"role": "user", "content": "b" * n}]
        return m, {"messages": m, "task_id": str(n), "index": n}

    def step(self, action):
        return [], 1.0, True, False, {"messages": [], "task_id": "0", "index": 0}


if "ServeHTTP/BigOpening-v0" not in gym.registry:
    gym.register("ServeHTTP/BigOpening-v0", entry_point=BigOpeningEnv, disable_env_checker=True)


@pytest.fixture(scope="module")
def url():
    """``python -m envs.serve GSM8K-v1 --port 0 --max-sessions 2``: its URL, from the line it prints."""
    with serve_process(ENV_ID, "--max-sessions", "2") as base:
        assert base.startswith("http://127.0.0.1:"), base
        yield base


def _in_process(index: int, answer: str) -> tuple[list, float, bool, dict]:
    """``gym.make``'s own episode: (opening messages, reward of ``answer``, terminated, step info)."""
    env = gym.make(ENV_ID)
    try:
        opening, _ = env.reset(options={"index": index})
        _, reward, terminated, _, info = env.step(answer)
        return opening, float(reward), bool(terminated), info
    finally:
        env.close()


def _gold(index: int) -> str:
    env = gym.make(ENV_ID)
    try:
        return env.unwrapped.demonstration({"index": index})[0]["content"]
    finally:
        env.close()


def _active(url: str) -> int:
    return requests.get(url + "/sessions", timeout=T).json()["active"]


def test_reset_step_state_over_http_reward_equals_gym_make(url):
    """Before: 404 on all three routes."""
    opening, _, _, _ = _in_process(3, "")
    r = requests.post(url + "/reset", json=ResetRequest(index=3).model_dump(exclude_unset=True), timeout=T)
    assert r.status_code == 200, r.text
    reset = ResetResponse.model_validate(r.json())  # OpenEnv's wire model (extra keys forbidden)
    assert reset.done is False and reset.reward is None
    assert reset.observation["messages"] == opening
    assert reset.observation["info"]["index"] == 3 and "messages" not in reset.observation["info"]

    for index, answer in ((3, _gold(3)), (4, "I think it is\n#### 123456789")):  # the gold answer, and a wrong one
        _, reward, terminated, info = _in_process(index, answer)
        body = StepRequest(action=TextAction(content=answer).model_dump(exclude_unset=True), index=index)
        r = requests.post(url + "/step", json=body.model_dump(exclude_unset=True), timeout=T)
        assert r.status_code == 200, r.text
        step = StepResponse.model_validate(r.json())
        assert step.reward == reward and step.done is terminated is True
        assert step.observation["info"]["correct"] == info["correct"]
    assert _gold(3) and _in_process(3, _gold(3))[1] == 1.0  # the gold answer scored, not only equally

    r = requests.get(url + "/state", timeout=T)  # no episode outlives its request: a fresh env's state
    assert r.status_code == 200, r.text
    state = State.model_validate(r.json())
    fresh = GymTextEnvironment(ENV_ID)
    try:
        assert r.json() == fresh.state.model_dump()
    finally:
        fresh.close()
    assert state.step_count == 0 and r.json()["messages"] == [] and r.json()["env_id"] == ENV_ID
    assert _active(url) == 0  # every request's env was closed


def test_openenv_validator_passes_health_metadata_schema(url):
    report = validate_running_environment(url, timeout_s=T)
    passed = {c["id"]: c["passed"] for c in report["criteria"]}
    assert passed["health_endpoint"] and passed["metadata_endpoint"] and passed["schema_endpoint"], report
    HealthResponse.model_validate(requests.get(url + "/health", timeout=T).json())
    EnvironmentMetadata.model_validate(requests.get(url + "/metadata", timeout=T).json())


def test_schema_documents_the_action_shape_and_a_raw_string_is_refused_naming_it(url):
    schema = SchemaResponse.model_validate(requests.get(url + "/schema", timeout=T).json())
    action = schema.action
    assert action["type"] == "object" and set(action["properties"]) >= {"content", "tool_calls"}
    assert '{"content"' in action["description"] and "string" in action["description"]
    assert action["examples"] and all(TextAction.model_validate(x) for x in action["examples"])

    r = requests.post(url + "/step", json={"action": "#### 72", "index": 0}, timeout=T)  # a bare string over HTTP
    assert r.status_code == 422 and '{"content"' in r.json()["detail"], r.text
    # OpenEnv's own client fails on a bare string before sending anything (dict("...")): the documented shape is the fix
    with GenericEnvClient(base_url=url).sync() as env:
        env.reset(index=0)
        with pytest.raises(ValueError):
            env.step("#### 72")
        assert env.step({"content": "#### 72"}).reward == 1.0


@pytest.mark.parametrize("method,path,body,status,words", [
    ("post", "/reset", b"{not json", 422, ["invalid JSON"]),
    ("post", "/reset", b"[1, 2]", 422, ["JSON object"]),
    ("post", "/reset", b'{"bogus": 1}', 400, ["bogus", "task_id"]),
    ("post", "/reset", b'{"task_id": "no-such-task"}', 400, ["reset rejected"]),
    ("post", "/reset", b'{"seed": ' + b"9" * 500 + b"}", 422, ["digits"]),
    ("post", "/reset", b"[" * 5000 + b"]" * 5000, 422, ["nested"]),
    ("post", "/step", b"", 422, ['"action"']),
    ("post", "/step", b'{"index": 0}', 422, ['"action"']),
    ("post", "/step", b'{"action": {"content": "#### 72"}}', 422, ["index", "task_id", "/sessions", "/ws"]),
    ("post", "/step", b'{"action": {"text": "#### 72"}, "index": 0}', 422, ["text", '{"content"']),
    ("post", "/step", b'{"action": {"content": 72}, "index": 0}', 422, ["content"]),
    ("post", "/step", b'{"action": {"content": "#### 72"}, "index": 0, "bogus": 1}', 422, ["bogus", "request_id"]),
    ("post", "/step", b'{"action": {"content": "#### 72"}, "index": "zero"}', 400, ["index"]),
    ("post", "/step", b'{"action": {"content": "#### 72"}, "index": 0, "timeout_s": -1}', 422, ["timeout_s"]),
    ("get", "/docs", None, 404, ["/reset", "/sessions", "/ws"]),
    ("post", "/mcp/x", b"{}", 404, ["/ws", "/step"]),
])
def test_malformed_requests_are_4xx_naming_the_problem(url, method, path, body, status, words):
    r = requests.request(method, url + path, data=body, headers={"content-type": "application/json"}, timeout=T)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    for w in words:
        assert w in detail, (w, detail)
    assert _active(url) == 0  # no env left behind


def test_stateless_requests_count_against_the_session_cap_and_never_touch_a_session(url):
    """--max-sessions 2: two open sessions leave no room for a stateless request (429), one freed leaves room again;
    a stateless episode on the same task leaves a session's episode as it was."""
    a = requests.post(url + "/sessions", timeout=T).json()["session_id"]
    b = requests.post(url + "/sessions", timeout=T).json()["session_id"]
    try:
        assert requests.post(f"{url}/sessions/{a}/reset", json={"index": 0}, timeout=T).status_code == 200
        before = requests.get(f"{url}/sessions/{a}/state", timeout=T).json()
        for path, body in (("/reset", {"index": 0}), ("/step", {"action": {"content": "#### 72"}, "index": 0})):
            r = requests.post(url + path, json=body, timeout=T)
            assert r.status_code == 429 and "session cap" in r.json()["detail"], r.text
        requests.delete(f"{url}/sessions/{b}", timeout=T)
        r = requests.post(url + "/step", json={"action": {"content": _gold(0)}, "index": 0}, timeout=T)
        assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
        assert requests.get(f"{url}/sessions/{a}/state", timeout=T).json() == before  # untouched
        r = requests.post(f"{url}/sessions/{a}/step", json={"action": {"content": "#### 1"}}, timeout=T)
        assert r.status_code == 200 and r.json()["reward"] == 0.0  # its own episode, its own answer
        assert _active(url) == 1
    finally:
        for sid in (a, b):
            requests.delete(f"{url}/sessions/{sid}", timeout=T)


def test_an_unread_stateless_reply_holds_its_cap_slot_until_the_send_timeout():
    """The slow-reader rules of the session routes hold here too: the request's env stays counted (cap and
    ``unsent_bytes``) while its reply is unread, and the connection is dropped after the send timeout."""
    import uvicorn

    app = build_app("ServeHTTP/BigOpening-v0", max_sessions=1, idle_timeout_s=600)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)  # accepted sockets inherit it: the reply stalls
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(serve.uvicorn_config(app, host="127.0.0.1", port=port, log_level="error", send_timeout_s=1.5))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while not srv.started:
            assert th.is_alive() and time.time() - t0 < 20
            time.sleep(0.01)
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        body = json.dumps({"index": 2_000_000}).encode()
        slow.sendall(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        slow.settimeout(20)
        assert slow.recv(12).startswith(b"HTTP/1.1 200")
        held = requests.get(base + "/sessions", timeout=T).json()
        assert held["active"] == 1 and held["unsent_bytes"] > 1_000_000, held
        r = requests.post(base + "/reset", json={"index": 5}, timeout=T)
        assert r.status_code == 429, r.text  # its slot is still taken
        t0 = time.time()
        while requests.get(base + "/sessions", timeout=T).json()["active"]:  # dropped after the send timeout
            assert time.time() - t0 < 20, requests.get(base + "/sessions", timeout=T).json()
            time.sleep(0.1)
        assert requests.get(base + "/sessions", timeout=T).json()["unsent_bytes"] == 0
        r = requests.post(base + "/reset", json={"index": 5}, timeout=T)
        assert r.status_code == 200 and r.json()["observation"]["messages"][0]["content"] == "bbbbb", r.text
        slow.close()
    finally:
        srv.should_exit = True
        th.join(15)
        sock.close()
