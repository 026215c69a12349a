"""Sessions spread over worker processes (``python -m envs.serve ... --workers N``, issue 49).

With ``workers=0`` (the default) every session's env lives in the server's process, on the session's own thread; the
event loop that answers ``/health`` then shares one GIL with every session's env work (at 512 tau2 retail sessions,
641 steps/s on 2 cores, ``/health`` took up to 2.1 s). With ``workers=N`` the envs live in ``N`` worker processes
instead, each a :mod:`multiprocessing.managers` server (the standard library's process-and-proxy mechanism: a spawned
process, an authenticated local socket, one serving thread per connection) hosting a :class:`SessionHost`; the server
process keeps the sockets, the guard, the session registry (cap, idle reaper, unsent bytes), ``/health`` and every
route, and hands each session operation to the session's worker.

How a session sticks to its worker: nothing is balanced per request. A session is placed once, when it is opened, on
the worker with the fewest open sessions; its handle (:class:`WorkerEnvironment`, what the registry holds in place of
the env) names that worker and the session's key there, and every later operation of the session -- over any
protocol, on any connection -- goes through the handle. The server's event loop sends each operation to the worker
itself, over one link per worker (:mod:`envs.serving.worker_link`; the open and close, which OpenEnv runs on the
session's thread, are handed to the loop from there): no thread of the server runs a session's operation, so the loop
shares the server's GIL with no forwarding threads (at 512 sessions those 512 threads were where its stalls were). In
the worker each session has a thread of its own that runs its operations one at a time, in the order sent, so the
sessions of one worker still run concurrently (a session waiting on an LLM user or a grader does not hold up the
others).

Why not uvicorn's ``--workers``: its workers share one listening socket and the kernel hands each *connection* to
whichever worker accepts it, so ``POST /sessions/{id}/step`` on a new connection (and ``/mcp``'s ``session_id``,
``/ws?session_id=``) would reach a worker that does not hold the session; making it reach the owner would take a
balancer in front, which this is not.

Limits: a worker that dies takes its sessions with it (a request of one answers an error -- HTTP 503, WORKER_ERROR --
and closes it); it is replaced by a fresh worker
when the next session is placed (:meth:`WorkerPool.place`), and the dead worker's sessions, when they close, no
longer count against its replacement; each worker has its own grader pool (``envs.grader_process``: per-client fairness holds within a worker, the
request's client carried there); no session holds a socket of its own to its worker (``python -m envs.serve
--workers`` still adds ``max_sessions`` to the descriptor reserve, :func:`envs.serving.descriptors.fit_descriptors`:
a margin); a session's operation costs a round trip to its worker (pickled arguments and reply: tens of microseconds
for a step, pickled on the event loop).

Priority: a worker runs ``nice`` (``python -m envs.serve --session-nice``) above the niceness of the server's thread
that made the pool (its event loop's), set once in the worker before it serves (:func:`_set_niceness`), so every
thread it starts and every grader process it spawns has it too: session work yields the cores to the server's loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import multiprocessing
import os
import sys
import threading
import uuid
from collections.abc import Callable
from multiprocessing.managers import BaseManager
from typing import Any

from envs.serving.environment import ClientError, GymTextEnvironment, SessionClosedError, UnsentReplyCount
from envs.serving.session_threads import MAX_NICE, SessionThread, check_nice
from envs.serving.worker_link import Link, LinkServer, connect

from envs.grader_process import SpawnContext, process_alive
from envs.grader_queue import GRADING_CLIENT, grading_client

__all__ = ["SessionHost", "WorkerEnvironment", "WorkerGoneError", "WorkerPool"]

log = logging.getLogger(__name__)


class WorkerGoneError(ClientError, RuntimeError):
    """The session's worker process has ended (killed, crashed): the session is lost; a new one is placed on a fresh
    worker. HTTP 503."""

    status, code = 503, "WORKER_ERROR"


class SessionHost:
    """In a worker process: the envs of the sessions placed there, by key, each with a thread of its own that runs
    its operations one at a time (:class:`~envs.serving.session_threads.SessionThread`). :meth:`open`, :meth:`close`
    and :meth:`call` are called by the manager's thread serving one connection of the server; the operations of
    :class:`WorkerEnvironment.acall` come over the server loop's link (:meth:`listen`,
    :mod:`envs.serving.worker_link`) and run on the same per-session threads."""

    def __init__(self):
        self._envs: dict[str, GymTextEnvironment] = {}
        self._threads: dict[str, SessionThread] = {}
        self._lock = threading.Lock()
        self._link: LinkServer | None = None

    def pid(self) -> int:
        return os.getpid()

    def listen(self) -> Any:
        """The address of this worker's link listener (started by the first call)."""
        with self._lock:
            if self._link is None:
                self._link = LinkServer({"open": self.submit_open, "call": self.submit, "close": self.submit_close})
            return self._link.address

    def open(self, key: str, env_id: str, env_kwargs: dict, max_session_bytes: int | None) -> None:
        """Build the session's env (``gym.make``) on its new thread, waited for; what the build raises is raised in
        the server."""
        self.submit_open(key, env_id, env_kwargs, max_session_bytes).result()

    def submit_open(self, key: str, env_id: str, env_kwargs: dict, max_session_bytes: int | None):
        """Start session ``key``'s thread and build its env there: the build's future (calls submitted meanwhile
        run after it)."""
        thread = SessionThread(name=f"envs-worker-session-{key[:8]}")
        with self._lock:
            self._threads[key] = thread
        return thread.submit(self._build, key, thread, env_id, env_kwargs, max_session_bytes)

    def _build(self, key: str, thread: SessionThread, env_id: str, env_kwargs: dict, max_session_bytes: int | None):
        try:
            env = GymTextEnvironment(env_id, env_kwargs, max_session_bytes)
        except BaseException:
            with self._lock:
                if self._threads.get(key) is thread:
                    del self._threads[key]
            thread.shutdown(wait=False)
            raise
        with self._lock:
            self._envs[key] = env

    def submit(self, key: str, fn: Callable, args: tuple, unsent: int, client: Any = None):
        """:meth:`run` of the call on session ``key``'s thread, after the calls submitted before: its future.

        Raises:
            SessionClosedError: the session is not here (closed).
        """
        with self._lock:
            thread = self._threads.get(key)
        try:
            if thread is not None:
                return thread.submit(self.run, key, fn, args, unsent, client)
        except RuntimeError:  # shut down by a close meanwhile
            pass
        raise SessionClosedError("session closed (idle timeout or server shutdown); open a new session")

    def run(self, key: str, fn: Callable, args: tuple, unsent: int, client: Any = None) -> tuple[Any, int, int]:
        """``fn(env, *args)`` on the session's env with ``unsent`` (the bytes of its replies the server has not sent
        yet) counted as the env's own: ``(result, bytes of replies the call counted as unsent, session bytes)``.

        Raises:
            SessionClosedError: the session is not here (closed).
        """
        env = self._envs.get(key)
        if env is None:
            raise SessionClosedError("session closed (idle timeout or server shutdown); open a new session")
        env.unsent_bytes = unsent
        with grading_client(client):  # the request's client, for the graders' per-client fairness (envs.grader_queue)
            out = fn(env, *args)
        return out, env.unsent_bytes - unsent, env.session_bytes

    def call(self, key: str, fn: Callable, args: tuple, unsent: int, client: Any = None) -> tuple[Any, int, int]:
        """:meth:`run` on the session's thread, waited for. Raises: what it raises."""
        return self.submit(key, fn, args, unsent, client).result()

    def close(self, key: str) -> None:
        """:meth:`submit_close`, waited for."""
        self.submit_close(key).result()

    def submit_close(self, key: str):
        """Close the session's env on its thread, after the calls submitted before (a step running meanwhile
        finishes first), then end the thread: the close's future (done at once for a session not here)."""
        with self._lock:
            thread = self._threads.pop(key, None)
        if thread is None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(None)
            return done
        try:
            return thread.submit(self._close_env, key)
        finally:
            thread.shutdown(wait=False)  # after the close: the calls already submitted run first

    def _close_env(self, key: str) -> None:
        with self._lock:
            env = self._envs.pop(key, None)
        if env is not None:
            env.close()

    def count(self) -> int:
        return len(self._envs)


class _Manager(BaseManager):
    pass


def _set_niceness(niceness: int) -> None:
    """A worker's initializer: its niceness set to ``niceness`` (absolute, never below what it inherited: the thread
    that starts a replacement worker may be a session's, already lowered). On Linux niceness is per thread, and a
    worker has threads before its initializer runs (started by what the spawned interpreter imported), so each of
    its threads is set; threads started later inherit the main thread's."""
    if sys.platform != "linux":  # pragma: no cover - per-process niceness
        os.nice(max(0, niceness - os.nice(0)))
        return
    # A thread started while the others are being set may inherit its maker's old niceness: list again until a
    # listing shows no thread not yet set.
    done: set[str] = set()
    while True:
        tids = set(os.listdir("/proc/self/task")) - done
        if not tids:
            return
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), max(niceness, os.getpriority(os.PRIO_PROCESS, int(tid))))
            except ProcessLookupError:  # that thread has ended meanwhile
                pass
        done |= tids


_Manager.register("SessionHost", SessionHost)


class WorkerPool:
    """``n`` worker processes (:class:`SessionHost` each, in a spawned :mod:`multiprocessing.managers` server), started
    by :meth:`start`, stopped by :meth:`shutdown`; :meth:`place` picks the worker with the fewest open sessions.

    ``nice``: each worker's niceness above that of the thread making the pool (capped at 19; 0: the same). Raises:
    ValueError for ``n`` < 1 or a ``nice`` outside ``[0, 19]``."""

    def __init__(self, n: int, nice: int = 0):
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        self.n = n
        self.nice = check_nice(nice)
        #: The workers' niceness (absolute), from the making thread's.
        self.niceness = min(MAX_NICE, os.nice(0) + self.nice)
        self._managers: list[_Manager] = []
        self._hosts: list[Any] = []
        self._addresses: list[Any] = []  # each worker's link listener (envs.serving.worker_link)
        self._links: dict[tuple[asyncio.AbstractEventLoop, Any], asyncio.Task] = {}
        # taken only on event loops, never held across a wait: a loop must not wait for a lock a session's thread
        # holds (the 512-session run's most frequent loop stall was `_lock` here, held by place() on a session thread)
        self._links_lock = threading.Lock()
        self.pids: list[int] = []
        #: The server's event loop (set by the app's startup): sessions' threads hand their worker operations to it.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._open = [0] * n
        self._generation = [0] * n
        #: Workers replaced after their process ended.
        self.replaced = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers (each imports the env families: seconds). Raises: what a worker's start raises."""
        for _ in range(self.n):
            m, host, pid, address = self._start_one()
            self._managers.append(m)
            self._hosts.append(host)
            self.pids.append(pid)
            self._addresses.append(address)

    def _start_one(self) -> tuple[_Manager, Any, int, Any]:
        # a fresh interpreter (the server has threads by now) that does not run the caller's main script again
        m = _Manager(ctx=SpawnContext())
        m.start(_set_niceness, (self.niceness,))
        host = m.SessionHost()
        return m, host, host.pid(), host.listen()

    def _replace_dead(self) -> None:
        """Under ``_lock``: start a fresh worker in the place of each one whose process has ended (killed, crashed;
        :func:`envs.grader_process.process_alive`), after reaping what multiprocessing can (no zombie is left)."""
        multiprocessing.active_children()
        for i, pid in enumerate(self.pids):
            if process_alive(pid):
                continue
            m, host, new_pid, address = self._start_one()
            old = self._managers[i]
            self._managers[i], self._hosts[i], self.pids[i], self._addresses[i] = m, host, new_pid, address
            self._open[i] = 0  # the dead worker's sessions are gone; their release() no longer counts here
            self._generation[i] += 1
            self.replaced += 1
            log.warning("session worker %d (pid %d) had ended; replaced by pid %d", i, pid, new_pid)
            try:
                old.shutdown()
            except Exception:  # noqa: BLE001, S110 - its process is already gone
                pass

    def place(self) -> tuple[int, int, Any, int, Any]:
        """``(index, generation, host, pid, link address)`` of the worker with the fewest open sessions, counted as
        holding one more; a worker whose process has ended is replaced first."""
        with self._lock:
            self._replace_dead()
            i = min(range(self.n), key=self._open.__getitem__)
            self._open[i] += 1
            return i, self._generation[i], self._hosts[i], self.pids[i], self._addresses[i]

    async def link(self, address: Any) -> Link:
        """The running loop's link to the worker listening at ``address``, connected by the first call (one per loop
        and worker, shared by its sessions) and again after it broke. Raises: what connecting raises (the next call
        tries again; a worker that has ended refuses)."""
        key = (asyncio.get_running_loop(), address)
        with self._links_lock:
            made = self._links.get(key)
            if made is None or (made.done() and (made.cancelled() or made.exception() is not None
                                                 or made.result().broken is not None)):
                made = self._links[key] = asyncio.get_running_loop().create_task(connect(address))
        return await asyncio.shield(made)

    async def call(self, address: Any, op: str, *args: Any) -> Any:
        """``op(*args)`` in the worker listening at ``address``, over the running loop's link to it. Raises: what it
        raised there; ``EOFError`` / ``OSError`` when the link broke or could not be made."""
        return await (await self.link(address)).call(op, *args)

    def close_links(self) -> None:
        """Close the running loop's links (its shutdown; a link of another loop ends when its worker does)."""
        loop = asyncio.get_running_loop()
        with self._links_lock:
            mine = [k for k in self._links if k[0] is loop]
            made = [self._links.pop(k) for k in mine]
        for task in made:
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result().close()
            else:
                task.cancel()

    def release(self, i: int, generation: int) -> None:
        """A session placed on worker ``i`` (of ``generation``) has closed; a replaced worker's sessions count no more."""
        with self._lock:
            if self._generation[i] == generation:
                self._open[i] -= 1

    def alive(self, i: int, generation: int) -> bool:
        """Whether worker ``i`` of ``generation`` is still the one running (not replaced, its process not ended)."""
        with self._lock:
            pid = self.pids[i] if self._generation[i] == generation else None
        multiprocessing.active_children()
        return pid is not None and process_alive(pid)

    def open_sessions(self) -> dict[int, int]:
        """Open sessions per worker pid."""
        with self._lock:
            return dict(zip(self.pids, self._open))

    def shutdown(self) -> None:
        for m in self._managers:
            try:
                m.shutdown()
            except Exception:  # noqa: BLE001, S110 - shutting down: a worker already gone is fine
                pass
        self._managers.clear()
        self._hosts.clear()
        self._addresses.clear()


class WorkerEnvironment(UnsentReplyCount):
    """The server's handle of a session whose env lives in a worker process: built (on the session's thread) by
    asking the emptiest worker to build the env; :meth:`acall` (from an event loop) and :meth:`call` (from a thread)
    run a session operation there; the unsent-bytes accounting of :class:`GymTextEnvironment` (``hold_unsent``,
    ``release_unsent``, ``unsent_bytes``) is kept here, where the replies are sent.

    Every operation -- the build, each call, the close -- goes over the server loop's link to the worker
    (:mod:`envs.serving.worker_link`, :meth:`WorkerPool.call`): from a thread it is handed to the loop and waited for,
    so no session holds a connection to its worker; without the pool's loop (a pool driven outside an app) the
    worker's manager proxy is called instead.

    Raises (building): whatever the worker's ``gym.make`` raised.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # OpenEnv's registry checks it on the factory's class

    def __init__(self, pool: WorkerPool, env_id: str, env_kwargs: dict | None = None,
                 max_session_bytes: int | None = None):
        self._pool = pool
        self._index, self._generation, self._host, self.worker_pid, self._address = pool.place()
        self._key = uuid.uuid4().hex
        self.env_id, self.max_session_bytes = env_id, max_session_bytes
        self.session_bytes = 0
        self._init_unsent()
        self._closed = False
        try:
            self._remote("open", env_id, dict(env_kwargs or {}), max_session_bytes)
        except BaseException:
            pool.release(self._index, self._generation)
            raise

    def _gone(self, e: BaseException) -> BaseException:
        """``e`` (the link or connection to the worker broke) as :class:`WorkerGoneError` when the worker has ended,
        else ``e`` itself."""
        if self._pool.alive(self._index, self._generation):
            return e
        gone = WorkerGoneError(f"the session's worker process (pid {self.worker_pid}) has ended, and the session "
                               "with it; open a new session")
        gone.__cause__ = e
        return gone

    def _remote(self, op: str, *args: Any) -> Any:
        """The worker's ``op`` (``open``, ``call``, ``close``) on this session, from a thread that is not the loop's.
        Raises: what it raised there; ``EOFError`` / ``OSError`` when the link broke."""
        loop = self._pool.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if loop is None or on_loop or loop.is_closed():
            return getattr(self._host, op)(self._key, *args)
        return asyncio.run_coroutine_threadsafe(self._pool.call(self._address, op, self._key, *args), loop).result()

    def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(env, *args)`` in the worker, on the session's env (``fn`` a module-level function: it is sent by
        name), from a thread. Raises: what ``fn`` raises there (pickled back); :class:`WorkerGoneError` when the
        worker has ended."""
        try:
            reply = self._remote("call", fn, args, self._unsent_now(), GRADING_CLIENT.get())
        except (EOFError, OSError) as e:  # the link to the worker broke; fn's own errors come back as raised
            raise self._gone(e) from e
        return self._settle(reply)

    async def acall(self, fn: Callable, *args: Any) -> Any:
        """:meth:`call` from an event loop, over that loop's link to the worker: no thread of this process runs for
        it. Raises: as :meth:`call`."""
        try:
            reply = await self._pool.call(self._address, "call", self._key, fn, args, self._unsent_now(),
                                          GRADING_CLIENT.get())
        except (EOFError, OSError) as e:
            raise self._gone(e) from e
        return self._settle(reply)

    def _unsent_now(self) -> int:
        """The bytes of this session's replies not sent yet, sent with a call (:meth:`SessionHost.run`)."""
        with self._unsent_lock:
            return self.unsent_bytes

    def _settle(self, reply: tuple[Any, int, int]) -> Any:
        """A call's ``(result, bytes it counted as unsent, session bytes)``: the counts kept here, the result returned."""
        out, held, self.session_bytes = reply
        if held:
            self.hold_unsent(held)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._remote("close")
        except (EOFError, OSError):
            if self._pool.alive(self._index, self._generation):
                raise  # else the worker has ended and its env with it: nothing is left to close
        finally:
            self._pool.release(self._index, self._generation)


def worker_factory(pool: WorkerPool, env_id: str, env_kwargs: dict, max_session_bytes: int | None) -> Callable:
    """The session factory of :func:`envs.serve.build_app` with ``workers``: a :class:`WorkerEnvironment` per
    session."""
    return functools.partial(WorkerEnvironment, pool, env_id, env_kwargs, max_session_bytes)
