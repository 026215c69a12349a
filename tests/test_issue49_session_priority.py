"""Issue 49, the load target: session work runs below the event loop's CPU priority (``build_app(session_nice=N)``,
``python -m envs.serve --session-nice N``, default :data:`~envs.serving.limits.DEFAULT_SESSION_NICE`).

Each session's thread raises its own niceness by N when it starts, each worker process runs at N above the thread
that made the pool (the server's loop), and the loop's own niceness is left alone; a value outside [0, 19] is refused
with a message naming the option. Niceness is capped at 19, so under a test runner already at ``nice -n 19`` the
expected values are 19 and the checks only say that nothing went wrong; run at niceness 0 they check the offsets.
"""
from __future__ import annotations

import os
import sys
import threading

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx

from envs import serve
from envs.serve import build_app
from envs.serving.limits import DEFAULT_SESSION_NICE
from envs.serving.session_threads import MAX_NICE, SessionThread, SessionThreads, check_nice, lower_priority
from envs.serving.workers import WorkerPool
from tests.served import ToyChatEnv, serve_app

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")

ID = "test/NicenessChat-v0"


def _niceness(tid: int | None = None) -> int:
    """The niceness of thread ``tid`` of this process (default: the calling thread)."""
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def _expect(base: int, n: int) -> int:
    return min(MAX_NICE, base + n)


class NicenessChat(ToyChatEnv):
    """:class:`ToyChatEnv` that records the niceness of the thread it was built on and of each step's."""

    seen: list[int] = []

    def __init__(self, **kwargs):
        type(self).seen.append(_niceness())
        super().__init__(**kwargs)

    def step(self, action):
        type(self).seen.append(_niceness())
        return super().step(action)


if ID not in gym.registry:
    gym.register(id=ID, entry_point=NicenessChat, disable_env_checker=True)


def _in_thread(fn):
    """``fn()`` on a fresh thread (so this thread's niceness is not touched); its result."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    return out[0]


def test_a_session_thread_lowers_its_own_priority_only():
    base = _niceness()
    ex = SessionThread(nice=3)
    assert ex.submit(_niceness).result(10) == _expect(base, 3)
    assert _niceness() == base, "the thread that made the session thread was lowered too"
    ex.shutdown()
    capped = SessionThread(nice=MAX_NICE)
    assert capped.submit(_niceness).result(10) == MAX_NICE
    capped.shutdown()
    plain = SessionThread()
    assert plain.submit(_niceness).result(10) == base
    plain.shutdown()


@pytest.mark.parametrize("bad", [-1, 20, 1.5, True, "3", None])
def test_a_bad_niceness_is_refused_naming_the_option(bad, capsys):
    with pytest.raises(ValueError, match=r"session_nice must be an integer in \[0, 19\]"):
        check_nice(bad)
    with pytest.raises(ValueError, match="session_nice"):
        build_app(ID, max_sessions=2, idle_timeout_s=None, session_nice=bad)
    with pytest.raises(ValueError, match="session_nice"):
        SessionThreads(nice=bad)
    with pytest.raises(ValueError, match="session_nice"):
        WorkerPool(1, nice=bad)
    with pytest.raises(ValueError, match=r"nice must be an integer"):
        SessionThread(nice=bad)


@pytest.mark.parametrize("bad", ["-1", "20"])
def test_the_cli_refuses_a_bad_session_nice(bad, capsys, monkeypatch):
    monkeypatch.setattr(serve._Server, "run", lambda self, *a, **k: pytest.fail("served with a bad --session-nice"))
    with pytest.raises(SystemExit) as e:
        serve.main([ID, "--session-nice", bad])
    assert e.value.code == 2 and "--session-nice must be an integer in [0, 19]" in capsys.readouterr().err


def test_the_cli_passes_session_nice_on_and_defaults_to_the_constant(monkeypatch):
    made = []
    real = serve.build_app
    monkeypatch.setattr(serve, "build_app", lambda *a, **k: made.append(k["session_nice"]) or real(*a, **k))
    monkeypatch.setattr(serve._Server, "run", lambda self, *a, **k: None)
    serve.main([ID])
    serve.main([ID, "--session-nice", "0"])
    assert made == [DEFAULT_SESSION_NICE, 0]
    assert 0 < DEFAULT_SESSION_NICE <= MAX_NICE


@pytest.mark.parametrize("nice", [None, 0, 4])
def test_in_process_sessions_are_built_and_stepped_below_the_loop(nice):
    kwargs = {} if nice is None else {"session_nice": nice}
    n = DEFAULT_SESSION_NICE if nice is None else nice
    app = build_app(ID, max_sessions=4, idle_timeout_s=None, **kwargs)
    loop_niceness: list[int] = []

    async def recording(scope, receive, send):
        loop_niceness.append(_niceness())
        return await app(scope, receive, send)

    NicenessChat.seen = []
    with serve_app(recording) as (url, srv), httpx.Client(base_url=url, timeout=30) as c:
        sid = c.post("/sessions").json()["session_id"]
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "hi"}}).status_code == 200
        assert c.get("/health").status_code == 200
    base = loop_niceness[0]
    assert set(loop_niceness) == {base}, "the event loop's niceness changed"
    assert NicenessChat.seen == [_expect(base, n)] * 2, (base, n, NicenessChat.seen)


def test_worker_processes_and_their_threads_run_below_the_loop():
    app = build_app("DigitSum-v0", max_sessions=4, idle_timeout_s=None, workers=1, session_nice=4)
    base = _niceness()  # the thread that built the app (the pool's maker)
    with serve_app(app, timeout_s=300) as (url, _), httpx.Client(base_url=url, timeout=120) as c:
        sid = c.post("/sessions").json()["session_id"]
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200
        (pid,) = [int(k) for k in c.get("/sessions").json()["workers"]]
        niceness = _worker_niceness(pid)
        assert set(niceness.values()) == {_expect(base, 4)}, (base, niceness)


def _worker_niceness(pid: int) -> dict[int, int]:
    """The niceness of each live thread of process ``pid`` (a thread that ends between the listing and the read is
    left out: a worker starts and ends short-lived threads of its own)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(t)] = os.getpriority(os.PRIO_PROCESS, int(t))
        except ProcessLookupError:
            pass
    return out


def test_a_replacement_worker_started_from_a_lowered_thread_is_not_lowered_twice():
    base = _niceness()
    pool = WorkerPool(1, nice=2)
    assert pool.niceness == _expect(base, 2)

    def start_lowered():  # a replacement worker is started by place(), on a session's (already lowered) thread
        lower_priority(2)
        pool.start()

    _in_thread(start_lowered)
    try:
        assert set(_worker_niceness(pool.pids[0]).values()) == {_expect(base, 2)}
    finally:
        pool.shutdown()
