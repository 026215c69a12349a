"""Each session's own thread, started off the server's event loop (issue 49, the load figure).

OpenEnv's registry (openenv-core 0.3.0, ``HTTPEnvServer._create_session``) gives each session a
``ThreadPoolExecutor(max_workers=1)`` made on the event loop, whose thread the first ``run_in_executor`` (the env's
build) starts there. ``Thread.start()`` returns only once the new thread has run, and ``ThreadPoolExecutor.submit``
holds ``concurrent.futures``' global lock meanwhile, so the loop -- every connection, ``/health`` included -- waited
for the new thread to be scheduled: at 512 sessions on 2 busy cores the loop's stalls over 50 ms were mostly there
(59 of 122 stack samples; ``benchmarks/results/openenv_serve_load_issue49.md``). Here a session's thread is a
:class:`SessionThread`, made (and so started) on a starter thread of :class:`SessionThreads`; the loop only awaits it.

:class:`SessionThread` is an ``Executor`` of one thread of its own rather than a ``ThreadPoolExecutor`` started
elsewhere: ``ThreadPoolExecutor.submit`` starts its thread under the same global lock that every other pool's
``submit`` takes, so a starter thread waiting for a new pool thread to be scheduled would still hold up the loop's
next ``submit`` (any session's step). A :class:`SessionThread` starts its thread in its constructor, without that lock,
and its ``submit`` takes only its own lock.

Session work runs below the event loop's CPU priority (``nice``, ``python -m envs.serve --session-nice``): each
:class:`SessionThread` raises its own thread's niceness by ``nice`` when it starts (:func:`lower_priority`; Linux lets
an unprivileged process raise a single thread's niceness), so that when the cores are busy the scheduler runs the
loop -- ``/health``, admission, every socket's bytes -- before the sessions' work.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_NICE", "SessionThread", "SessionThreads", "check_nice", "lower_priority"]

_names = itertools.count()

#: Highest niceness Linux gives a thread or process (the lowest CPU priority).
MAX_NICE = 19


def check_nice(nice: int, name: str = "session_nice") -> int:
    """``nice`` if it is an integer in ``[0, MAX_NICE]``. Raises: ValueError (naming ``name``) otherwise -- a negative
    value would raise the sessions' priority above the event loop's (and needs privileges)."""
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= MAX_NICE:
        raise ValueError(f"{name} must be an integer in [0, {MAX_NICE}] (niceness added to the session work's, "
                         f"relative to the event loop's), got {nice!r}")
    return nice


def lower_priority(nice: int) -> None:
    """Add ``nice`` to the calling thread's niceness (capped at :data:`MAX_NICE`); only this thread's (and the threads
    it starts later: Linux gives a new thread its creator's niceness). A no-op for ``nice == 0`` and off Linux, where
    niceness is per process, not per thread."""
    if nice and sys.platform == "linux":
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def _serve(calls: queue.SimpleQueue, nice: int = 0) -> None:
    """A :class:`SessionThread`'s loop: lower its thread's priority by ``nice``, then run each ``(future, fn, args,
    kwargs)`` in order until ``None``."""
    lower_priority(nice)
    while (item := calls.get()) is not None:
        future, fn, args, kwargs = item
        del item
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, as ThreadPoolExecutor does
                future.set_exception(e)
                del e
            else:
                future.set_result(result)
                del result
        del future, fn, args, kwargs


class SessionThread(concurrent.futures.Executor):
    """An executor of exactly one thread (``name``, a daemon), started by the constructor -- so on whichever thread
    makes it -- that runs the calls submitted to it one at a time, in order: a session's work serialised on its own
    thread, as OpenEnv's one-thread executors do.

    ``shutdown`` lets the calls already submitted run (``cancel_futures``: cancels those not started), then the thread
    ends; ``wait`` joins it (not from the thread itself). The thread is a daemon so that a session nobody closed does
    not keep the process alive (the server closes every session on shutdown); dropping the executor unclosed ends
    its thread too, like a ``ThreadPoolExecutor``'s.

    ``nice``: niceness the thread adds to its own before it runs any call (:func:`lower_priority`; 0: none). Raises:
    ValueError for a ``nice`` outside ``[0, MAX_NICE]``.
    """

    def __init__(self, name: str | None = None, nice: int = 0):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._shut = False
        self.thread = threading.Thread(target=_serve, args=(self._calls, check_nice(nice, "nice")), daemon=True,
                                       name=name or f"envs-serve-session-{next(_names)}")
        self.thread.start()
        weakref.finalize(self, self._calls.put, None)

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """``fn(*args, **kwargs)`` on the thread, after every call submitted before. Raises: ``RuntimeError`` after
        :meth:`shutdown`."""
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._calls.put((future, fn, args, kwargs))
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if not self._shut:
                self._shut = True
                if cancel_futures:
                    self._cancel_pending()
                self._calls.put(None)
        if wait and threading.current_thread() is not self.thread:
            self.thread.join()

    def _cancel_pending(self) -> None:
        """Cancel the calls not started yet (under ``_lock``; one the thread takes meanwhile runs)."""
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].cancel()


class SessionThreads:
    """Makes :class:`SessionThread` s on a starter thread of its own, so that the event loop never waits for a new
    thread to be scheduled: :meth:`start` (at the app's startup, before any request: the starter's own thread
    starts there), ``await`` :meth:`new` per session, :meth:`close` at shutdown (a later :meth:`start` makes a fresh
    starter: an app may be served again). Without :meth:`start` (an app driven without its lifespan, as some tests
    do) the starter's thread starts at the first :meth:`new`, on the loop, once.

    No reserve of threads made ahead: a session's open already awaits its env's build on the new thread (and, with
    ``--workers``, a worker process), so one more hop to the starter (~0.1 ms on an idle machine) is not where its
    time goes, and no idle threads wait for sessions that may never come.

    ``nice``: each session thread's niceness above the server's (:class:`SessionThread`). Raises: ValueError for a
    ``nice`` outside ``[0, MAX_NICE]``."""

    def __init__(self, name: str = "envs-serve-thread-starter", nice: int = 0):
        self.name = name
        self.nice = check_nice(nice)
        self._starter: concurrent.futures.ThreadPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._starter is None:
            self._starter = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return self._starter

    def start(self) -> None:
        """Start the starter's thread now (returns once it runs)."""
        self._pool().submit(int).result()

    async def new(self) -> SessionThread:
        """A new :class:`SessionThread`, its thread started on the starter. A cancelled wait shuts down the thread
        made for it."""
        made = self._pool().submit(SessionThread, nice=self.nice)
        try:
            return await asyncio.wrap_future(made)
        except asyncio.CancelledError:
            made.add_done_callback(_shut_down_unused)
            raise

    def close(self) -> None:
        """Stop the starter (a thread being made still is; the threads made are their sessions')."""
        starter, self._starter = self._starter, None
        if starter is not None:
            starter.shutdown(wait=False)


def _shut_down_unused(made: concurrent.futures.Future) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().shutdown(wait=False)
