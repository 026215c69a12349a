"""Work kept off the server's event loop (issue 49): :func:`off_loop` runs a function -- parsing a request body,
encoding a reply -- on a small bounded thread pool, and :class:`LoopThread` runs a second event loop in a thread of
its own, for a library whose request handling parses bodies inside its coroutines (the ``mcp`` SDK's transport).

The event loop answers every connection (``/health`` included); whatever it runs for one request delays all the
others. Parsing 1 MiB of ``[0,0,...]`` within the server's JSON limits costs ~0.6 s of CPU, so a body is never parsed
there: on a session's own thread (the session routes, ``/ws``) or here. The GIL is still shared, but a thread hands
it back every switch interval (5 ms), so the loop waits for it at most a few intervals instead of a whole parse.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from envs.serving.limits import PARSE_THREADS

T = TypeVar("T")

__all__ = ["LoopThread", "off_loop"]


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=PARSE_THREADS, thread_name_prefix="envs-serve-parse")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the server's parse pool (:data:`PARSE_THREADS` threads, one queue shared by every request);
    what it raises is raised here. The queue holds at most the bodies in flight, which the guard bounds
    (``max_inflight_body_bytes``, the connection cap)."""
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args))


class LoopThread:
    """An event loop running in a daemon thread of its own (``name``), from :meth:`start` to :meth:`stop`.

    :meth:`run` awaits a coroutine on it from another loop (cancelling the awaiting task cancels it there);
    :meth:`on` wraps an awaitable factory of the *calling* loop so that code running on this loop can await it (an
    ASGI ``send`` / ``receive``, an ``asyncio.Lock`` of the server's registry). :meth:`start` takes an optional
    ``serve`` coroutine function, run on this loop until :meth:`stop` (a library's lifespan context entered and left
    in one task)."""

    def __init__(self, name: str):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._served: concurrent.futures.Future | None = None

    async def start(self, serve: Callable[[Awaitable[None]], Coroutine[Any, Any, None]] | None = None) -> None:
        """Start the thread; with ``serve``, run ``serve(until)`` on it, ``until`` an awaitable that completes at
        :meth:`stop`, and return once ``serve`` has started (it must await ``until``). Raises: what ``serve`` raises
        before it awaits ``until``."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop, self._stopped = loop, asyncio.Event()
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, ready.wait)
        if serve is not None:
            started = asyncio.get_running_loop().create_future()
            main_loop = asyncio.get_running_loop()

            async def until() -> None:
                main_loop.call_soon_threadsafe(lambda: started.done() or started.set_result(None))
                await self._stopped.wait()

            self._served = asyncio.run_coroutine_threadsafe(serve(until()), self.loop)
            self._served.add_done_callback(lambda f: main_loop.call_soon_threadsafe(
                lambda: started.done() or (started.set_exception(f.exception()) if f.exception() else
                                           started.set_result(None))))
            await started

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Let ``serve`` return, stop the loop, join the thread (at most ``timeout_s`` seconds each)."""
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(self._stopped.set)
        if self._served is not None:
            try:
                await asyncio.wait_for(asyncio.wrap_future(self._served), timeout_s)
            except Exception:  # noqa: BLE001, S110 - shutting down: what serve raised was its own business
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout_s)
        self.loop = None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop (from another loop), with the caller's context variables (e.g. which client a
        request is from, :mod:`envs.grader_queue`) set in its task."""
        carried = contextvars.copy_context()

        async def in_context() -> T:
            for var, value in carried.items():
                var.set(value)
            return await coro

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(in_context(), self.loop))

    @staticmethod
    def on(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        """``fn`` (an async callable of the loop running now) made awaitable from any other loop: each call runs
        ``fn(*args)`` on this, the calling loop."""
        home = asyncio.get_running_loop()

        async def call(*args: Any) -> T:
            if asyncio.get_running_loop() is home:
                return await fn(*args)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), home))

        return call
