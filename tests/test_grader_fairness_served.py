"""Through ``envs.serve``: a client's graded steps are keyed by its address, and another client's bombs do not
starve its grade (issue 49; envs/grader_queue.py, the key set in envs/serving/guard.py and carried to the session's
thread by envs/serving/sessions.py).

Client A (127.0.0.1) steps 4 sessions at once, each a C-level CPU bomb in the grader pool (1 worker, 0.5 s CPU);
client B (127.0.0.2, another loopback address) then steps one honest grade. B's reply comes before all but at most
one of A's (the one running when it asked); first come, first served it came after every bomb queued before it.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

from envs import grader_process
from envs.grader_process import GraderPool
from envs.grader_queue import GRADING_CLIENT
from tests.served import ToyChatEnv, serve_app

A_SESSIONS = 4
T = 300


def _add_one(x):
    return x + 1


def _c_level_bomb():
    return (3 ** 300_000_000).bit_length()


class GradingToyEnv(ToyChatEnv):
    """The toy chat whose every step is graded in the grader pool: ``"bomb"`` a CPU bomb, anything else a no-op;
    ``info["client"]`` the grading client the step ran as, ``info["graded"]`` whether the grade returned."""

    def step(self, action):
        text = action if isinstance(action, str) else (action.get("content") or "")
        value, failure = grader_process.grade(_c_level_bomb) if text == "bomb" else grader_process.grade(_add_one, 1)
        obs, reward, terminated, truncated, info = super().step(text)
        return obs, reward, terminated, truncated, {**info, "client": GRADING_CLIENT.get(), "graded": failure is None}


gym.register("GraderFairness/Toy-v0", entry_point=GradingToyEnv, disable_env_checker=True)


def _post(port: int, path: str, body: dict | None, source: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=T, source_address=(source, 0))
    try:
        conn.request("POST", path, body=json.dumps(body or {}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        assert r.status in (200, 201), (r.status, data[:500])
        return json.loads(data)
    finally:
        conn.close()


def _session(port: int, source: str) -> str:
    sid = _post(port, "/sessions", None, source)["session_id"]
    _post(port, f"/sessions/{sid}/reset", {}, source)
    return sid


@pytest.fixture
def one_worker_pool(monkeypatch):
    p = GraderPool(workers=1, cpu_s=0.5)
    monkeypatch.setattr(grader_process, "_default", p)
    yield p
    p.close()


@pytest.mark.slow  # a served pool with 4 bombing sessions: ~8 min at load 12 on 2 cores (issue 49); CI runs the slow stage
def test_another_clients_bombs_delay_an_honest_grade_by_the_running_one_only(one_worker_pool):
    from envs.serve import build_app

    pool = one_worker_pool
    assert pool.call(_add_one, 1) == (2, None)  # started before the clock of anything below
    app = build_app("GraderFairness/Toy-v0", max_sessions=16, idle_timeout_s=600)
    done: list[str] = []
    lock = threading.Lock()
    with serve_app(app, timeout_s=60) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        a_sessions = [_session(port, "127.0.0.1") for _ in range(A_SESSIONS)]
        b_session = _session(port, "127.0.0.2")

        def a_step(sid):
            out = _post(port, f"/sessions/{sid}/step", {"action": {"content": "bomb"}}, "127.0.0.1")
            with lock:
                done.append("A")
            return out

        with ThreadPoolExecutor(A_SESSIONS) as ex:
            first = ex.submit(a_step, a_sessions[0])
            deadline = time.monotonic() + T
            while pool._slots._running.get("127.0.0.1") != 1:
                assert time.monotonic() < deadline and not first.done(), first
                time.sleep(0.01)
            rest = [ex.submit(a_step, sid) for sid in a_sessions[1:]]
            while pool._slots.waiting().get("127.0.0.1") != A_SESSIONS - 1:
                assert time.monotonic() < deadline, pool._slots.waiting()
                time.sleep(0.01)
            b = _post(port, f"/sessions/{b_session}/step", {"action": {"content": "honest"}}, "127.0.0.2")
            with lock:
                done.append("B")
            a = [first.result(T)] + [f.result(T) for f in rest]
    assert b["observation"]["info"]["client"] == "127.0.0.2" and b["observation"]["info"]["graded"] is True, b
    assert all(o["observation"]["info"]["client"] == "127.0.0.1" for o in a), a
    assert not any(o["observation"]["info"]["graded"] for o in a), a  # every bomb killed at its CPU bound
    assert done.index("B") <= 1, done
