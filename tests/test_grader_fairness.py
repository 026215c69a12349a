"""One client's bombs do not starve another client's honest grades (issue 49; envs/grader_queue.py).

The grader pool's workers were handed out first come, first served: a client that queued N cost bombs (each holds a
worker for its 1 s CPU bound) delayed every later grade of every other client by all N of them. Now a freed worker
goes to the waiting client served least recently: B's honest grade behind A's queue of bombs waits for the bombs
already running only.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs.grader_process import GraderPool
from envs.grader_queue import GRADING_CLIENT, FairSlots, bind_client, grading_client

#: Bombs client A queues behind the one running.
A_QUEUED = 3


def _add_one(x):
    return x + 1


def _c_level_bomb():
    return (3 ** 300_000_000).bit_length()  # one C call holding the GIL for minutes: killed at the CPU bound


def _wait_until(predicate, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_honest_grade_waits_for_the_running_bomb_only_not_for_the_queued_ones():
    """Before (first come, first served): B's grade came back after A's bombs queued before it; now after
    the one running when it arrived."""
    pool = GraderPool(workers=1, cpu_s=0.5)
    done: list[str] = []
    lock = threading.Lock()

    def bomb():
        with grading_client("A"):
            _, failure = pool.call(_c_level_bomb)
        with lock:
            done.append("A")
        return failure

    try:
        assert pool.call(_add_one, 1) == (2, None)  # the pool started
        with ThreadPoolExecutor(A_QUEUED + 1) as ex:
            first = ex.submit(bomb)
            _wait_until(lambda: pool._slots._running.get("A") == 1)
            rest = [ex.submit(bomb) for _ in range(A_QUEUED)]
            _wait_until(lambda: pool._slots.waiting().get("A") == A_QUEUED)
            with grading_client("B"):
                result = pool.call(_add_one, 41)
            with lock:
                done.append("B")
            failures = [first.result(timeout=300)] + [f.result(timeout=300) for f in rest]
        assert result == (42, None)
        assert all(f is not None and f.kind == "grader_timeout" for f in failures), failures
        assert done.index("B") <= 1, done  # at most the bomb that was running when B asked
    finally:
        pool.close()


def _hold_then_release(slots: FairSlots, key, order: list, go: threading.Event | None = None):
    slots.acquire(key)
    order.append(key)
    if go is not None:
        go.wait(30)
    slots.release(key)


def test_a_freed_slot_goes_to_the_waiting_client_served_least_recently():
    slots, order, go = FairSlots(1), [], threading.Event()
    holder = threading.Thread(target=_hold_then_release, args=(slots, "A", order, go))
    holder.start()
    _wait_until(lambda: order == ["A"])
    threads = []
    for n, key in enumerate(["A", "A", "A", "B", "C"]):
        t = threading.Thread(target=_hold_then_release, args=(slots, key, order))
        t.start()
        threads.append(t)
        _wait_until(lambda n=n: sum(slots.waiting().values()) == n + 1)
    go.set()
    for t in [holder, *threads]:
        t.join(30)
    assert order == ["A", "B", "C", "A", "A", "A"], order  # first come, first served: A A A A B C


def test_calls_without_a_client_keep_their_order_and_bad_slots_raise():
    slots, order, go = FairSlots(1), [], threading.Event()
    holder = threading.Thread(target=_hold_then_release, args=(slots, None, order, go))
    holder.start()
    _wait_until(lambda: order == [None])
    threads = []
    for n, key in enumerate([None, "x", None]):
        t = threading.Thread(target=_hold_then_release, args=(slots, key, order))
        t.start()
        threads.append(t)
        _wait_until(lambda n=n: sum(slots.waiting().values()) == n + 1)
    go.set()
    for t in [holder, *threads]:
        t.join(30)
    assert order == [None, "x", None, None], order
    assert slots.waiting() == {} and slots._free == 1
    with pytest.raises(ValueError, match="slots must be >= 1"):
        FairSlots(0)


def test_the_client_travels_to_another_thread_only_when_bound():
    with ThreadPoolExecutor(1) as ex, grading_client("10.0.0.7"):
        assert ex.submit(GRADING_CLIENT.get).result() is None  # a thread pool does not carry it
        assert ex.submit(bind_client(GRADING_CLIENT.get)).result() == "10.0.0.7"
    assert GRADING_CLIENT.get() is None
    assert bind_client(_add_one) is _add_one  # no client named: the function itself


def test_a_forked_child_is_not_held_by_slots_its_parent_held_at_the_fork():
    """A slot held by another thread of the parent when it forks would never be released in the child: its calls
    would wait for ever. The child gets fresh slots."""
    import os
    import select

    pool = GraderPool(workers=1, cpu_s=5.0)
    try:
        assert pool.call(_add_one, 1) == (2, None)
        with ThreadPoolExecutor(1) as ex:
            held = ex.submit(pool.call, time.sleep, 3.0)  # holds the one slot for ~3 s
            _wait_until(lambda: pool._slots._running.get(None) == 1)
            r, w = os.pipe()
            child = os.fork()
            if child == 0:  # pragma: no cover -- runs in the child
                try:
                    value, failure = pool.call(_add_one, 9)
                    os.write(w, f"{value} {failure}".encode())
                    pool.close()
                finally:
                    os._exit(0)
            os.close(w)
            ready, _, _ = select.select([r], [], [], 240)
            out = os.read(r, 200).decode() if ready else "no answer"
            if not ready:
                os.kill(child, 9)
            os.waitpid(child, 0)
            os.close(r)
            assert held.result(60) == (None, None)
        assert out == "10 None", out
    finally:
        pool.close()
