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
protocol, on any connection -- goes through the handle. Each session's operations are still run one at a time on the
session's own thread of the server (OpenEnv's executor); that thread's connection to the worker is served by a
thread of its own there, so the sessions of one worker still run concurrently (a session waiting on an LLM user or a
grader does not hold up the others).

Why not uvicorn's ``--workers``: its workers share one listening socket and the kernel hands each *connection* to
whichever worker accepts it, so ``POST /sessions/{id}/step`` on a new connection (and ``/mcp``'s ``session_id``,
``/ws?session_id=``) would reach a worker that does not hold the session; making it reach the owner would take a
balancer in front, which this is not.

Limits: a worker that dies takes its sessions with it (a request of one answers an error -- HTTP 503, WORKER_ERROR --
and closes it); it is replaced by a fresh worker
when the next session is placed (:meth:`WorkerPool.place`), and the dead worker's sessions, when they close, no
longer count against its replacement; each worker has its own grader pool (``envs.grader_process``: per-client fairness holds within a worker, the
request's client carried there); each session holds one local socket to its worker while it is open (``python -m
envs.serve --workers`` adds ``max_sessions`` to the descriptor reserve, :func:`envs.serving.descriptors.fit_descriptors`);
a session's operation costs a round trip to its worker (pickled arguments and reply: tens of microseconds for a step).
"""
from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable
from multiprocessing.managers import BaseManager
from typing import Any

from envs.serving.environment import ClientError, GymTextEnvironment, SessionClosedError, UnsentReplyCount

from envs.grader_process import SpawnContext, process_alive
from envs.grader_queue import GRADING_CLIENT, grading_client

__all__ = ["SessionHost", "WorkerEnvironment", "WorkerGoneError", "WorkerPool"]

log = logging.getLogger(__name__)


class WorkerGoneError(ClientError, RuntimeError):
    """The session's worker process has ended (killed, crashed): the session is lost; a new one is placed on a fresh
    worker. HTTP 503."""

    status, code = 503, "WORKER_ERROR"


class SessionHost:
    """In a worker process: the envs of the sessions placed there, by key. Each method is called by the manager's
    thread serving one connection of the server (one per session thread there)."""

    def __init__(self):
        self._envs: dict[str, GymTextEnvironment] = {}
        self._lock = threading.Lock()

    def pid(self) -> int:
        return os.getpid()

    def open(self, key: str, env_id: str, env_kwargs: dict, max_session_bytes: int | None) -> None:
        """Build the session's env (``gym.make``); what the build raises is raised in the server."""
        env = GymTextEnvironment(env_id, env_kwargs, max_session_bytes)
        with self._lock:
            self._envs[key] = env

    def call(self, key: str, fn: Callable, args: tuple, unsent: int, client: Any = None) -> tuple[Any, int, int]:
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

    def close(self, key: str) -> None:
        with self._lock:
            env = self._envs.pop(key, None)
        if env is not None:
            env.close()

    def count(self) -> int:
        return len(self._envs)


class _Manager(BaseManager):
    pass


_Manager.register("SessionHost", SessionHost)


class WorkerPool:
    """``n`` worker processes (:class:`SessionHost` each, in a spawned :mod:`multiprocessing.managers` server), started
    by :meth:`start`, stopped by :meth:`shutdown`; :meth:`place` picks the worker with the fewest open sessions."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        self.n = n
        self._managers: list[_Manager] = []
        self._hosts: list[Any] = []
        self.pids: list[int] = []
        self._open = [0] * n
        self._generation = [0] * n
        #: Workers replaced after their process ended.
        self.replaced = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers (each imports the env families: seconds). Raises: what a worker's start raises."""
        for _ in range(self.n):
            m, host, pid = self._start_one()
            self._managers.append(m)
            self._hosts.append(host)
            self.pids.append(pid)

    @staticmethod
    def _start_one() -> tuple[_Manager, Any, int]:
        # a fresh interpreter (the server has threads by now) that does not run the caller's main script again
        m = _Manager(ctx=SpawnContext())
        m.start()
        host = m.SessionHost()
        return m, host, host.pid()

    def _replace_dead(self) -> None:
        """Under ``_lock``: start a fresh worker in the place of each one whose process has ended (killed, crashed;
        :func:`envs.grader_process.process_alive`), after reaping what multiprocessing can (no zombie is left)."""
        multiprocessing.active_children()
        for i, pid in enumerate(self.pids):
            if process_alive(pid):
                continue
            m, host, new_pid = self._start_one()
            old = self._managers[i]
            self._managers[i], self._hosts[i], self.pids[i] = m, host, new_pid
            self._open[i] = 0  # the dead worker's sessions are gone; their release() no longer counts here
            self._generation[i] += 1
            self.replaced += 1
            log.warning("session worker %d (pid %d) had ended; replaced by pid %d", i, pid, new_pid)
            try:
                old.shutdown()
            except Exception:  # noqa: BLE001, S110 - its process is already gone
                pass

    def place(self) -> tuple[int, int, Any, int]:
        """``(index, generation, host, pid)`` of the worker with the fewest open sessions, counted as holding one
        more; a worker whose process has ended is replaced first."""
        with self._lock:
            self._replace_dead()
            i = min(range(self.n), key=self._open.__getitem__)
            self._open[i] += 1
            return i, self._generation[i], self._hosts[i], self.pids[i]

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


class WorkerEnvironment(UnsentReplyCount):
    """The server's handle of a session whose env lives in a worker process: built (on the session's thread) by
    asking the emptiest worker to build the env; :meth:`call` runs a session operation there; the unsent-bytes
    accounting of :class:`GymTextEnvironment` (``hold_unsent``, ``release_unsent``, ``unsent_bytes``) is kept here,
    where the replies are sent.

    Raises (building): whatever the worker's ``gym.make`` raised.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # OpenEnv's registry checks it on the factory's class

    def __init__(self, pool: WorkerPool, env_id: str, env_kwargs: dict | None = None,
                 max_session_bytes: int | None = None):
        self._pool = pool
        self._index, self._generation, self._host, self.worker_pid = pool.place()
        self._key = uuid.uuid4().hex
        self.env_id, self.max_session_bytes = env_id, max_session_bytes
        self.session_bytes = 0
        self._init_unsent()
        self._closed = False
        try:
            self._host.open(self._key, env_id, dict(env_kwargs or {}), max_session_bytes)
        except BaseException:
            pool.release(self._index, self._generation)
            raise

    def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(env, *args)`` in the worker, on the session's env (``fn`` a module-level function: it is sent by
        name). Raises: what ``fn`` raises there (pickled back); :class:`WorkerGoneError` when the worker has ended."""
        with self._unsent_lock:
            unsent = self.unsent_bytes
        try:
            out, held, self.session_bytes = self._host.call(self._key, fn, args, unsent, GRADING_CLIENT.get())
        except (EOFError, OSError) as e:  # the connection to the worker broke; fn's own errors come back as raised
            if self._pool.alive(self._index, self._generation):
                raise
            raise WorkerGoneError(f"the session's worker process (pid {self.worker_pid}) has ended, and the "
                                  "session with it; open a new session") from e
        if held:
            self.hold_unsent(held)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._host.close(self._key)
        except (EOFError, OSError):
            if self._pool.alive(self._index, self._generation):
                raise  # else the worker has ended and its env with it: nothing is left to close
        finally:
            self._pool.release(self._index, self._generation)


def worker_factory(pool: WorkerPool, env_id: str, env_kwargs: dict, max_session_bytes: int | None) -> Callable:
    """The session factory of :func:`envs.serve.build_app` with ``workers``: a :class:`WorkerEnvironment` per
    session."""
    return functools.partial(WorkerEnvironment, pool, env_id, env_kwargs, max_session_bytes)
