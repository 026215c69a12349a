"""Which client a graded call is for, and the grader workers shared fairly among clients.

:class:`envs.grader_process.GraderPool` runs graded calls on a few worker processes; a call waits for a free worker,
and a cost bomb holds one for up to its CPU bound (1 s). First come, first served, one client's bombs queued ahead
of another client's honest grade made that grade wait for all of them (issue 49: the known limit docs/security.md
named). Here the workers are handed out per client instead (:class:`FairSlots`): when a worker frees, it goes to the
waiting client served least recently, so a client arriving behind another's queue of bombs waits for at most the
calls already running (one bomb's CPU bound when every worker holds one), however many the other has queued; a
client's own calls keep their order.

Who the client is: the context variable :data:`GRADING_CLIENT`, set around the work (:func:`grading_client`) and
carried to the thread that grades (:func:`bind_client`). ``python -m envs.serve`` keys each request by its peer's
address (``envs/serving/guard.py`` sets it; ``envs/serving/sessions.py`` carries it to the session's thread): a
client's sessions, connections and stateless requests are one client, whatever their number. Calls without a key
(trainers, vector envs, an env used directly) share one key: first come, first served among them, as before.

Limits: a client is an address, so clients behind one proxy or NAT share one share of the workers, and a client that
can send from many addresses gets one share per address; within a share, calls wait in arrival order.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any

__all__ = ["GRADING_CLIENT", "grading_client", "bind_client", "carrying_client", "peer_key", "FairSlots"]

#: The client a graded call is for (``None``: none named; such calls share one key).
GRADING_CLIENT: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("grading_client", default=None)


@contextlib.contextmanager
def grading_client(key: Hashable | None) -> Iterator[None]:
    """Graded calls made inside this block (in this thread or task) are ``key``'s."""
    token = GRADING_CLIENT.set(key)
    try:
        yield
    finally:
        GRADING_CLIENT.reset(token)


def bind_client(fn: Callable) -> Callable:
    """``fn`` to be run on another thread as the current client's (a thread pool does not carry context variables):
    ``fn`` itself when no client is named."""
    key = GRADING_CLIENT.get()
    return fn if key is None else functools.partial(_run_as, key, fn)


def _run_as(key: Hashable, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    with grading_client(key):
        return fn(*args, **kwargs)


def carrying_client(run: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
    """``run(session_id, func, *args, **kwargs)``, an async hand-off of ``func`` to another thread (OpenEnv's
    ``HTTPEnvServer._run_in_session_executor``), with ``func`` run there as the caller's client (:func:`bind_client`)."""

    @functools.wraps(run)
    async def carried(session_id: Any, func: Callable, *args: Any, **kwargs: Any) -> Any:
        return await run(session_id, bind_client(func), *args, **kwargs)

    return carried


def peer_key(scope: dict) -> str | None:
    """An ASGI connection's client key: its peer's host (``scope["client"][0]``); ``None`` when the server does not
    know it (a Unix socket)."""
    client = scope.get("client")
    return str(client[0]) if client else None


class FairSlots:
    """``slots`` slots (a pool's workers) handed to waiting callers per client: a freed slot goes to the waiting
    client whose last slot was handed out longest ago (a client never served, or gone idle and forgotten, first),
    and within a client to its oldest waiting call. Thread-safe; a waiter sleeps on an event of its own (a release
    wakes one thread).

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self._lock = threading.Lock()
        self._free = slots
        self._waiting: dict[Hashable | None, collections.deque[threading.Event]] = {}
        self._served: dict[Hashable | None, int] = {}  # client -> the hand-out count at its last slot
        self._running: collections.Counter = collections.Counter()  # client -> slots it holds
        self._count = 0

    @contextlib.contextmanager
    def held(self, key: Hashable | None) -> Iterator[None]:
        """Hold a slot for ``key`` for the block (waiting for one first)."""
        self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def acquire(self, key: Hashable | None) -> None:
        """Wait for a slot for client ``key``."""
        with self._lock:
            if self._free > 0 and not self._waiting:
                self._free -= 1
                self._grant(key)
                return
            event = threading.Event()
            self._waiting.setdefault(key, collections.deque()).append(event)
        try:
            event.wait()
        except BaseException:  # interrupted: give back the slot if it was handed over meanwhile, else stop waiting
            with self._lock:
                granted = event.is_set()
                if not granted:
                    queue = self._waiting.get(key)
                    if queue is not None and event in queue:
                        queue.remove(event)
                        if not queue:
                            del self._waiting[key]
            if granted:
                self.release(key)
            raise

    def release(self, key: Hashable | None) -> None:
        """Give back ``key``'s slot: to the next waiting client (module docstring), else to the free ones."""
        with self._lock:
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]
            self._forget_idle()
            if not self._waiting:
                self._free += 1
                return
            nxt = min(self._waiting, key=lambda k: self._served.get(k, -1))
            queue = self._waiting[nxt]
            event = queue.popleft()
            if not queue:
                del self._waiting[nxt]
            self._grant(nxt)
            event.set()  # the slot passes to that waiter directly

    def _grant(self, key: Hashable | None) -> None:
        self._count += 1
        self._served[key] = self._count
        self._running[key] += 1

    def _forget_idle(self) -> None:
        """Drop the record of clients with nothing running or waiting (it would grow with every client seen)."""
        if len(self._served) > 2 * (len(self._running) + len(self._waiting)) + 64:
            self._served = {k: v for k, v in self._served.items() if k in self._running or k in self._waiting}

    def waiting(self) -> dict[Hashable | None, int]:
        """Calls waiting per client (a snapshot)."""
        with self._lock:
            return {k: len(q) for k, q in self._waiting.items()}
