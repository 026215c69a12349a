"""A replaced grader worker's private directory goes with it (issue 49, a "lower" item), however the worker ended.

Each grader worker runs in a private directory under its pool's root (:mod:`envs.grader_process`); a worker killed
by a bomb used to leave it, and whatever the grader wrote there, until the pool closed (6 bombs: 6 directories,
6 MiB, growing for a server's life). ``tests/test_grader_process.py`` covers a worker killed at the CPU bound (pebble
reports it ended: its directory goes at once); here the other ways a worker is replaced:

* past the wall-clock backstop (pebble stops it, SIGTERM then SIGKILL, *after* the call has returned its failure);
* killed from outside while idle (the OOM killer, an operator): no call of ours sees it end;
* retired with its pool when a grader module is registered after the pool started.

After each, the next calls must find the dead workers' directories gone, within a few seconds (a kill is
asynchronous), with only live workers' directories left.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from envs import grader_process
from envs.grader_process import GraderPool, process_alive

#: How long the pool may take to notice a replaced worker (a kill and pebble's replacement are asynchronous).
NOTICE_S = 20.0


def _add_one(x):
    return x + 1


def _pid():
    return os.getpid()


def _write_then_sleep(nbytes, seconds, pids_file):  # waits without using CPU: only the wall-clock backstop stops it
    with open("left-behind.bin", "wb") as f:
        f.write(b"x" * nbytes)
    with open(pids_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)


def _write(nbytes):
    with open("left-behind.bin", "wb") as f:
        f.write(b"x" * nbytes)
    return os.getpid()


def _dirs(pool: GraderPool) -> dict[int, str]:
    return {int(p.name.split("-")[1]): p.name for p in Path(pool._root).iterdir() if p.name.startswith("worker-")}


def _only_live_dirs_within(pool: GraderPool, dead: set[int]) -> None:
    """Make honest calls until no directory of a ``dead`` worker is left and every directory is a live worker's
    (fails after :data:`NOTICE_S`)."""
    deadline = time.monotonic() + NOTICE_S
    while True:
        assert pool.call(_add_one, 1) == (2, None)
        dirs = _dirs(pool)
        live = set(pool.worker_pids())
        if not (set(dirs) & dead) and set(dirs) <= live:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"after {NOTICE_S} s: directories {sorted(dirs.values())}, live workers {sorted(live)}, "
                        f"dead {sorted(dead)}")
        time.sleep(0.2)
    assert not list(Path(pool._root).rglob("left-behind.bin"))


def test_a_worker_stopped_at_the_wall_clock_bound_leaves_no_directory(tmp_path):
    pool = GraderPool(workers=1, cpu_s=5.0, wall_s=1.0)
    pids_file = tmp_path / "pids"
    try:
        _, failure = pool.call(_write_then_sleep, 1 << 20, 60, str(pids_file))  # stopped at 1 s, retried once
        assert failure is not None and failure.kind == "grader_timeout", failure
        assert pool.counts["wall_retries"] == 1
        stopped = {int(x) for x in pids_file.read_text().split()}
        assert len(stopped) == 2, stopped  # the call's worker and the retry's
        _only_live_dirs_within(pool, stopped)
        assert not stopped & set(pool.worker_pids())
    finally:
        pool.close()


def test_an_idle_worker_killed_from_outside_leaves_no_directory():
    pool = GraderPool(workers=2, cpu_s=5.0)
    try:
        pids = {pool.call(_write, 1 << 20)[0] for _ in range(4)}
        victims = set(pool.worker_pids())
        assert pids <= victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + NOTICE_S
        while any(process_alive(p) for p in victims) and time.monotonic() < deadline:
            time.sleep(0.05)
        _only_live_dirs_within(pool, victims)
    finally:
        pool.close()


def test_the_workers_of_a_retired_pool_leave_no_directory(monkeypatch):
    """A grader module registered after the pool started: the pool is replaced (its calls in progress finish in the
    old workers, which then end); their directories must not wait for :meth:`GraderPool.close`."""
    pool = GraderPool(workers=2, cpu_s=5.0)
    try:
        old = {pool.call(_write, 1 << 20)[0] for _ in range(4)} | set(pool.worker_pids())
        monkeypatch.setattr(grader_process, "_WORKER_MODULES", [*grader_process._WORKER_MODULES, "json"])
        _only_live_dirs_within(pool, old)
        assert not set(pool.worker_pids()) & old
    finally:
        pool.close()


def test_grades_go_on_after_every_idle_worker_was_killed_from_outside():
    """pebble gives up on a pool whose worker ends while no call runs ("All workers expired"; every later schedule
    raised ``RuntimeError``: no grade ever again, and an exception where a :class:`GraderFailure` is promised). The
    pool is replaced and the call that met the broken pool runs in the new one."""
    pool = GraderPool(workers=2, cpu_s=5.0)
    try:
        assert pool.call(_add_one, 1) == (2, None)
        for round_ in range(2):
            victims = set(pool.worker_pids())
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + NOTICE_S
            while any(process_alive(p) for p in victims) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # pebble's manager has seen them end
            for _ in range(3):
                assert pool.call(_add_one, 1) == (2, None), round_
            assert not victims & set(pool.worker_pids())
        assert pool.broken_pools >= 1
    finally:
        pool.close()
