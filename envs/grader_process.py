"""Graders we do not own run in killable worker processes, with a CPU-time, an address-space and a wall-clock bound.

Why: the old deadline (a watchdog thread raising an exception into the verifier's thread) cannot interrupt one C call,
and a C call holds the GIL: ``<answer>exp(100000000*log(3))</answer>`` passes countdown's grammar and sympy computes
``3**100000000`` in one call (122 s here, issue 42), ``exp(exp(20))`` in puzzle24 never returns, and
propositional_logic's recursive parser takes 9 s on ``"¬"*4000 + "P"``; meanwhile every other thread of the process
(envs.serve's event loop: every client) stops. A separate process can be killed whatever it runs.

What runs here: every call into a grader whose code we do not own and whose cost we cannot bound from its input:
reasoning-gym's ``score_answer`` (:func:`envs.reasoning_gym.grading.score`: sympy's ``parse_expr`` / ``simplify``,
``eval`` behind grammars, the library's own parsers) and the if-verifiable / IFBench checkers
(:func:`envs.ifeval.grading.score_response`). Our own grading (GSM8K's, DigitSum's: no sympy, no ``eval``) and the
cheap grammars (:mod:`envs.reasoning_gym.answer_formats`, the first filter: they stop payloads, the process bounds
cost) stay in the caller's process.

Bounds of one graded call (:class:`GraderPool`, defaults of :func:`default_pool`):

* CPU time: ``cpu_s`` seconds of the worker's CPU (user + system) per call, enforced by the kernel: a profiling
  timer (``setitimer(ITIMER_PROF)``, armed before the call and disarmed after it) sends ``SIGPROF``, whose default
  action terminates the worker even inside a C call; ``RLIMIT_CPU`` (the CPU used so far + ``cpu_s``, rounded up,
  + 1 s: ``SIGXCPU``) backs it up. CPU time, not wall time, so that a loaded machine does not turn an honest answer
  into a timeout. -> ``grader_timeout``.
* Wall clock: a backstop of ``wall_s`` seconds from the moment a worker takes the call (time queued for a free
  worker does not count), for a grader that waits without using CPU or a worker starved of CPU: pebble kills the
  worker (``SIGTERM``, ``SIGKILL`` 3 s later). A call that ran past ``wall_s`` is retried once in a fresh worker
  (a starved worker is not the answer's fault); a second wall timeout -> ``grader_timeout``.
* Address space: ``RLIMIT_AS`` of each worker = its size after start-up + ``memory_bytes``; an allocation past it
  raises ``MemoryError`` (-> ``grader_memory``) or, in C code that cannot raise, ends the worker (-> ``grader_error``
  naming the signal). ``RLIMIT_CORE`` is 0: a killed worker writes no core file.
* Anything else the grader raises (``BaseException`` included) -> ``grader_error: <type>: <message>``.
* Preparation (``prepare`` of :meth:`GraderPool.call`: the dataset a grade needs, rebuilt in the worker from its
  config and kept there): run in the same worker before the call's CPU clock starts, under a bound of its own
  (``prepare_cpu_s``, default :data:`DEFAULT_PREPARE_CPU_S`: a user-CPU timer, ``ITIMER_VIRTUAL`` / ``SIGVTALRM``, so
  that its kill is told apart from the call's; ``RLIMIT_CPU`` at twice that backs it up for system time), so a build is never charged to a grade (issue 49: a fresh worker built
  arc_agi's dataset in 0.66 s of a grade's 1 s; on a machine 1.5x slower every first grade in a new worker would
  have been killed, and its replacement too). A preparation that fails is the call's failure, its message starting
  ``preparing``. The wall-clock backstop covers both.
* Working directory: each worker runs in a private temporary directory (its ``os.getcwd()``, ``TMPDIR`` and
  ``tempfile.gettempdir()``), made under one directory per pool that :meth:`GraderPool.close` removes, so a grader
  (or a dataset it rebuilds) writing a relative path cannot touch the caller's directory (issue 42: a reasoning-gym
  ``codeio`` snippet wrote ``sailor_performance.csv`` into the checkout). Containment, not a sandbox: an absolute
  path is still reachable. ``sys.path``'s relative entries (``''``) are made absolute first. A worker's directory is
  removed once the worker has ended, however it was replaced (killed at a bound, stopped at the wall clock, killed
  from outside, retired with its pool): looked for after every call whose worker died and after any call once the
  pool's workers have changed (issue 49: each killed worker's directory stayed until the pool closed).

A worker past a bound is killed and replaced by pebble (``pebble.ProcessPool``, the maintained process-pool library:
per-task timeouts, worker replacement); the caller gets a :class:`GraderFailure`, never an exception, and the env
answers reward 0 with ``info["action_error"]`` = :attr:`GraderFailure.action_error` and ``info["grader_timeout"]`` /
``info["grader_memory"]`` / ``info["grader_error"]`` set. :attr:`GraderPool.counts` counts each kind per pool.
pebble gives up on its whole pool when a worker ends while no call runs (killed from outside while idle: the OOM
killer, an operator; every later call raised ``RuntimeError``): the pool is then replaced and the call that met it
runs once more in the new one (:attr:`GraderPool.broken_pools` counts them).

Workers are cheap to reuse: they start from a fork server that imported the grader modules once
(:func:`register_worker_module`; ``reasoning_gym`` and sympy take seconds to import), run each module's
``_worker_setup`` once, and then take calls until killed (a module registered after the pool started: the pool is
replaced, its calls in progress finish in the old workers). Workers come from the ``forkserver`` start method, never
a ``fork`` of the caller (which may hold threads: envs.serve's, torch's), so the caller may be multi-threaded.
Workers never run the caller's main script or ``-m`` module (:func:`_preparation_data`): multiprocessing prepares every
fork-server or spawned process by running it again as ``__mp_main__``, which re-imported ``python -m envs.serve``'s
imports in each new worker (~7 s at load 7) and broke every call of a script without ``if __name__ == "__main__":``
(its body, making an env, ran in each worker while it bootstrapped: ``BrokenProcessPool``).
The default pool is created on first use, again in a forked child (a child never uses its parent's pool; it starts
its workers with ``spawn``, which import the grader modules themselves: Python 3.11's fork server cannot be reached
from a fork of the process that started it), and closed at exit (:func:`close_default_pool`: every worker stopped
and joined; in a process that multiprocessing started, where ``atexit`` does not run, by a multiprocessing finalizer
before multiprocessing joins that process's children: else a child that graded never exited). A daemonic process
(gymnasium's ``AsyncVectorEnv`` workers) starts its own pool too: multiprocessing forbids a daemon children so that a
terminated daemon leaves no orphans, and this module lifts that rule for the daemon it runs in
(:func:`_allow_children`) because its workers cannot outlive it: they exit when the pipe to their pool reads its end
(the daemon died, however), and a call in progress is bounded by its CPU limit. Before, graders in a daemon ran in
place without any bound, and one bomb froze every env of the vector env (75 s for ``exp(100000000*log(3))``).

Cost (``benchmarks/results/grader_isolation.md``, 2 shared cores at load 9-14): a round trip per graded call (a
no-op: 0.11 ms p50; a graded step 0.4-1 ms more than in process: chain_sum 33,000 -> 1,050 steps/s,
intermediate_integration's simplify ~55 steps/s either way); pool start 7.5-9 s once per process (the fork server
imports the grader modules); a killed worker replaced in milliseconds; each worker
~300 MiB RSS, ~200 MiB PSS.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import importlib
import logging
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.spawn
import multiprocessing.util
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from typing import Any, Callable

import pebble

from envs.contract import GRADER_FAILURE_KINDS, grader_flags
from envs.grader_queue import GRADING_CLIENT, FairSlots

__all__ = ["GraderFailure", "GraderPool", "FAILURE_KINDS", "DEFAULT_CPU_S", "DEFAULT_WALL_S", "DEFAULT_MEMORY_BYTES",
           "DEFAULT_PREPARE_CPU_S", "DEFAULT_WORKERS", "SpawnContext", "process_alive", "register_worker_module", "default_pool", "close_default_pool", "grade"]

#: The kinds of failure a graded call can end in (also the ``info`` flags the envs set: :func:`envs.contract.grader_flags`).
FAILURE_KINDS = GRADER_FAILURE_KINDS
#: CPU seconds one graded call may use. The slowest honest grading seen here: intermediate_integration's gold
#: answers, ~0.1 s; IFBench's slowest checkers on 4,096 characters, well under 1 s (tests/test_step_bounds.py).
DEFAULT_CPU_S = 1.0
#: Wall-clock seconds from the moment a worker takes a call to its kill (the backstop; retried once).
DEFAULT_WALL_S = 30.0
#: CPU seconds a call's preparation may use (``prepare`` of :meth:`GraderPool.call`; the slowest cold dataset build
#: seen here, arc_agi's, takes 0.66 s).
DEFAULT_PREPARE_CPU_S = 30.0
#: Address space a worker may add to its size after start-up.
DEFAULT_MEMORY_BYTES = 1 << 30
#: Workers of the default pool: two, or half the CPUs when more (grading is a small part of a step).
DEFAULT_WORKERS = max(2, (os.cpu_count() or 2) // 2)

_log = logging.getLogger(__name__)
_WORKER_MODULES: list[str] = []
_PRELOAD: list[str] = []
_registry_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class GraderFailure:
    """Why a graded call gave no result.

    Attributes:
        kind: one of :data:`FAILURE_KINDS`.
        message: what happened, for a person (the bound and its value, or the exception's type and message).
    """

    kind: str
    message: str

    @property
    def action_error(self) -> str:
        """``"<kind>: <message>"``: the env's ``info["action_error"]``."""
        return f"{self.kind}: {self.message}"

    def flags(self) -> dict[str, bool]:
        """``{kind: kind == self.kind for every kind}``: the env's ``info`` flags (:func:`envs.contract.grader_flags`)."""
        return grader_flags(self.kind)


def register_worker_module(name: str, preload: tuple[str, ...] = ()) -> None:
    """Import module ``name`` in every worker before it takes a call (into the fork server when it has not started
    yet, so that workers inherit it), and run its ``_worker_setup()`` if it defines one. A grading module calls this
    at import for itself; a pool started before replaces its workers at its next call (:class:`GraderPool`).

    ``preload``: more modules for the fork server to import (the heavy imports of ``_worker_setup``, so that a new
    worker, e.g. one replacing a killed one, inherits them instead of importing them: if-verifiable's IFEval
    registry took 4.8 s at load 13 here). Modules that download or write on import do not belong there."""
    with _registry_lock:
        if name not in _WORKER_MODULES:
            _WORKER_MODULES.append(name)
        _PRELOAD.extend(m for m in preload if m not in _PRELOAD)


def _private_cwd(root: str) -> None:
    """Move this worker into a fresh directory under ``root``: its working directory, ``TMPDIR`` and
    ``tempfile.gettempdir()`` (``sys.path``'s relative entries made absolute first: ``''`` meant the old one)."""
    sys.path[:] = [p if os.path.isabs(p) else os.path.abspath(p) for p in sys.path]
    private = tempfile.mkdtemp(prefix=f"worker-{os.getpid()}-", dir=root)
    os.chdir(private)
    os.environ["TMPDIR"] = tempfile.tempdir = private


def _init_worker(modules: tuple[str, ...], memory_bytes: int, root: str) -> None:
    """pebble's worker initializer: a private working directory under ``root`` (:func:`_private_cwd`), import the
    grader modules and run their setup (before any limit), then no core files and the address-space limit (its size
    now + ``memory_bytes``)."""
    _private_cwd(root)
    for name in modules:  # a failure here is logged, not raised: pebble would restart the worker forever, and
        try:              # the calls that need the module fail on their own (grader_error), instead of waiting
            setup = getattr(importlib.import_module(name), "_worker_setup", None)
            if setup is not None:
                setup()
        except Exception:  # noqa: BLE001
            _log.exception("grader worker: importing / setting up %s failed", name)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + memory_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _address_space() -> int:
    """This process's virtual memory size in bytes (``VmSize`` of ``/proc/self/status``; 0 when unreadable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_limit(cpu_s: float) -> None:
    """``RLIMIT_CPU``'s soft limit at the CPU this worker used so far + ``cpu_s``, rounded up, + 1 s (a backstop of
    the timers: ``SIGXCPU``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _prepare_in_worker(prepare: tuple[Callable, tuple], cpu_s: float) -> tuple[str, str] | None:
    """Run ``prepare[0](*prepare[1])`` under a user-CPU timer of ``cpu_s`` (``SIGVTALRM`` terminates the worker);
    ``None``, or ``("memory" | "error", message)`` when it raised."""
    fn, args = prepare
    what = f"preparing the call ({getattr(fn, '__qualname__', fn)})"
    _cpu_limit(2 * cpu_s)  # the backstop well past the timer: a build's kill is the timer's (user CPU), named so
    signal.signal(signal.SIGVTALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_s)
    try:
        fn(*args)
    except MemoryError as e:
        return "memory", f"{what}: MemoryError: {e}"[:500]
    except BaseException as e:  # noqa: BLE001 -- as a grader's own failure
        return "error", f"{what} failed: {type(e).__name__}: {e}"[:500]
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    return None


def _run_in_worker(fn: Callable, args: tuple, cpu_s: float, prepare: tuple[Callable, tuple] | None = None,
                   prepare_cpu_s: float = DEFAULT_PREPARE_CPU_S) -> tuple[str, Any]:
    """In a worker: run ``prepare`` first (if given; :func:`_prepare_in_worker`, not charged to ``cpu_s``), then set
    the CPU limit to this call's budget and run ``fn(*args)``: ``("ok", value)``, ``("memory", message)`` or
    ``("error", "<type>: <message>")``."""
    if prepare is not None:
        failed = _prepare_in_worker(prepare, prepare_cpu_s)
        if failed is not None:
            return failed
    _cpu_limit(cpu_s)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # terminate: no Python handler (it would wait for the C call)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        return "ok", fn(*args)
    except MemoryError as e:
        return "memory", f"MemoryError: {e}"[:500]
    except BaseException as e:  # noqa: BLE001 -- whatever a grader we do not own raises is its failure, not ours
        return "error", f"{type(e).__name__}: {e}"[:500]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _noop() -> None:
    return None


#: The launch of a grader worker in progress on this thread (:class:`_ForkServerWorker`, :class:`_SpawnWorker`).
_launching = threading.local()
_get_preparation_data = multiprocessing.spawn.get_preparation_data


def _preparation_data(name: str) -> dict:
    """multiprocessing's preparation data of a new process (``spawn.get_preparation_data``), without the caller's main
    script / module while a grader worker is launched on this thread: the worker does not run it again (its graders
    are sent by module and name; a function defined in the caller's ``__main__`` cannot be one). Every other process
    multiprocessing starts is prepared as before. Installed once, in place of multiprocessing's, at import."""
    data = _get_preparation_data(name)
    if getattr(_launching, "worker", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


if getattr(multiprocessing.spawn.get_preparation_data, "__qualname__", "") != _preparation_data.__qualname__:
    multiprocessing.spawn.get_preparation_data = _preparation_data


def _launch_worker(base: type, process_obj):
    _launching.worker = True
    try:
        return base._Popen(process_obj)
    finally:
        _launching.worker = False


class _ForkServerWorker(multiprocessing.context.ForkServerProcess):
    """A grader worker from the fork server, prepared without the caller's main (:func:`_preparation_data`)."""

    @staticmethod
    def _Popen(process_obj):
        return _launch_worker(multiprocessing.context.ForkServerProcess, process_obj)


class _SpawnWorker(multiprocessing.context.SpawnProcess):
    """A spawned grader worker (in a forked child), prepared without the caller's main (:func:`_preparation_data`)."""

    @staticmethod
    def _Popen(process_obj):
        return _launch_worker(multiprocessing.context.SpawnProcess, process_obj)


class _ForkServerContext(multiprocessing.context.ForkServerContext):
    Process = _ForkServerWorker


class SpawnContext(multiprocessing.context.SpawnContext):
    """multiprocessing's spawn context whose processes start a fresh interpreter that does not run the caller's
    ``__main__`` script again (the grader workers' way; also :mod:`envs.serving.workers`' session workers)."""

    Process = _SpawnWorker


class GraderPool:
    """A pool of worker processes that run grader calls under the bounds of the module docstring.

    Args:
        workers: worker processes (each one call at a time; more calls wait, and waiting does not count against any
            bound). A freed worker goes to the waiting client served least recently (:mod:`envs.grader_queue`: the
            client named by :data:`envs.grader_queue.GRADING_CLIENT` where the call is made), so one client's queue
            of bombs delays another's grade by at most the calls already running.
        cpu_s: CPU seconds per call (a profiling timer; see the module docstring).
        wall_s: wall-clock seconds per call from the moment a worker takes it (retried once).
        memory_bytes: address space a worker may add to its size after start-up.
        modules: grader modules every worker imports first (default: those given to :func:`register_worker_module`).
        prepare_cpu_s: CPU seconds a call's preparation may use (``prepare`` of :meth:`call`).

    The pool starts on the first :meth:`call` (and again after :meth:`close`). Thread-safe.

    Raises:
        ValueError: a non-positive bound or worker count.
    """

    def __init__(self, workers: int = DEFAULT_WORKERS, cpu_s: float = DEFAULT_CPU_S, wall_s: float = DEFAULT_WALL_S,
                 memory_bytes: int = DEFAULT_MEMORY_BYTES, modules: tuple[str, ...] | None = None,
                 prepare_cpu_s: float = DEFAULT_PREPARE_CPU_S) -> None:
        if workers < 1 or cpu_s <= 0 or wall_s <= 0 or memory_bytes <= 0 or prepare_cpu_s <= 0:
            raise ValueError(f"workers, cpu_s, wall_s, memory_bytes, prepare_cpu_s must be positive, got {workers}, "
                             f"{cpu_s}, {wall_s}, {memory_bytes}, {prepare_cpu_s}")
        self.workers, self.cpu_s, self.wall_s, self.memory_bytes = workers, cpu_s, wall_s, memory_bytes
        self.prepare_cpu_s = prepare_cpu_s
        self._slots = FairSlots(workers)  # calls handed to pebble: at most one per worker, chosen per client
        _pools.add(self)
        self._modules = modules
        self._pool: pebble.ProcessPool | None = None
        self._root: str | None = None  # the workers' private directories are made under it; removed at close
        self._dir_pids: frozenset[int] = frozenset()  # the worker pids when dead workers' directories were last looked for
        self._dirs_pending = False  # a directory whose worker left the pool was kept then (its process still ending)
        self._pool_modules: tuple[str, ...] = ()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: Failed calls by kind (:data:`FAILURE_KINDS`), and ``"wall_retries"``: calls retried after a wall timeout.
        self.counts: dict[str, int] = dict.fromkeys((*FAILURE_KINDS, "wall_retries"), 0)
        #: pebble pools replaced because they broke (a worker ended while no call ran: :meth:`_started`).
        self.broken_pools = 0
        self._finalized_in: int | None = None  # the pid whose multiprocessing finalizer closes this pool

    def _retire(self, stop: bool) -> None:
        """Detach the current pebble pool (the next :meth:`_started` makes a new one) and let it end on a thread of
        its own: ``stop=False`` closes it (its calls in progress finish, then its workers end), ``stop=True`` stops its
        workers at once. Called with ``self._lock`` held."""
        old, self._pool = self._pool, None
        if stop:
            old.stop()
        else:
            old.close()
        threading.Thread(target=old.join, name="grader-pool-retire", daemon=True).start()

    def _started(self) -> pebble.ProcessPool:
        with self._lock:
            modules = tuple(_WORKER_MODULES) if self._modules is None else tuple(self._modules)
            if self._pool is not None and self._pid == os.getpid() and modules != self._pool_modules:
                self._retire(stop=False)  # a grader module registered since: new workers import it
            if self._pool is not None and self._pid == os.getpid() and not self._pool.active:
                # pebble gives up on a whole pool when a worker ends while no call runs (a worker killed from
                # outside while idle: the OOM killer, an operator): "All workers expired", then every schedule
                # raises RuntimeError. Replace it: its calls have failed already (BrokenProcessPool), its other
                # workers are stopped.
                self.broken_pools += 1
                _log.warning("grader pool: pebble's pool broke (a worker ended while idle); starting a new one")
                self._retire(stop=True)
            if self._pool is None or self._pid != os.getpid():
                if self._root is None or self._pid != os.getpid():  # a forked child's own (its parent removes its)
                    self._root = tempfile.mkdtemp(prefix="grader-workers-")
                self._pool_modules = modules
                if _in_forked_child:  # Python 3.11's fork server cannot be reached from a fork of its owner
                    ctx = SpawnContext()
                else:
                    ctx = _ForkServerContext()
                    ctx.set_forkserver_preload([__name__, *_PRELOAD, *modules])
                _allow_children()
                self._pool = pebble.ProcessPool(max_workers=self.workers, initializer=_init_worker,
                                                initargs=(modules, self.memory_bytes, self._root), context=ctx)
                self._pid = os.getpid()
                if multiprocessing.parent_process() is not None and self._finalized_in != self._pid:
                    # atexit does not run in a multiprocessing child, and multiprocessing joins its non-daemonic
                    # children (our workers) when its target returns: close first (exitpriority >= 0 runs before)
                    multiprocessing.util.Finalize(None, _close_if_alive, args=(weakref.ref(self),), exitpriority=100)
                    self._finalized_in = self._pid
            return self._pool

    def start(self) -> None:
        """Start the pool now and wait for a worker to take a call (the fork server imports the grader modules:
        seconds, once per process), so that the first graded step does not wait for it. Envs whose graders run here
        call it when they are made.

        Raises:
            RuntimeError: no worker could run a no-op call (the grader modules fail to import in a worker).
        """
        _, failure = self.call(_noop)
        if failure is not None:
            raise RuntimeError(f"the grader pool could not start: {failure.action_error}")

    def call(self, fn: Callable, *args: Any, cpu_s: float | None = None, wall_s: float | None = None,
             prepare: tuple[Callable, tuple] | None = None) -> tuple[Any, GraderFailure | None]:
        """``(fn(*args), None)`` run in a worker, or ``(None, failure)`` when it ran past a bound or raised.

        ``fn`` must be a module-level function (it is sent by name) and ``args`` picklable. ``cpu_s`` / ``wall_s``:
        this call's bounds instead of the pool's (a longer job than a grade: drawing a task list,
        :func:`envs.reasoning_gym.data.split_items`). ``prepare``: ``(function, args)`` run in the same worker just
        before ``fn``, before ``fn``'s CPU clock starts, under the pool's ``prepare_cpu_s``: what ``fn`` needs built
        (a dataset from its config) and the worker keeps, so it must be cheap once done there (it runs before every
        call); its failure is the call's (a message starting ``preparing``). Blocks the calling thread (not the GIL)
        until the result; at most ``2 * wall_s`` plus the time queued for a worker.
        """
        cpu_s = self.cpu_s if cpu_s is None else cpu_s
        wall_s = self.wall_s if wall_s is None else wall_s
        client = GRADING_CLIENT.get()
        for attempt in (0, 1):
            with self._slots.held(client):  # pebble's own queue is first come, first served: it never holds one
                pool = self._started()
                try:
                    future = pool.schedule(_run_in_worker, args=(fn, args, cpu_s, prepare, self.prepare_cpu_s),
                                           timeout=wall_s)
                    status, value = future.result()
                except concurrent.futures.TimeoutError:
                    self._remove_dead_dirs()  # pebble is stopping this one: removed at a later call's failure
                    if attempt == 0:
                        with self._lock:
                            self.counts["wall_retries"] += 1
                        continue
                    return None, self._failed("grader_timeout", f"the grader ran past {wall_s:g} s of wall-clock "
                                                                f"time twice; scored 0")
                except pebble.ProcessExpired as e:
                    self._remove_dead_dirs(e.pid)
                    return None, self._expired(e.exitcode, cpu_s, prepare is not None)
                except Exception as e:  # noqa: BLE001 -- the pool itself failed (e.g. an unpicklable result)
                    # pebble's pool broke under the call (BrokenProcessPool), or just before it (RuntimeError from
                    # schedule): not the call's fault (a worker killed while idle): once more, in a new pool
                    if attempt == 0 and pool is self._pool and not pool.active:  # (not closed meanwhile)
                        continue  # _started replaces it
                    return None, self._failed("grader_error", f"{type(e).__name__}: {e}"[:500])
            self._tidy_dirs()
            if status == "ok":
                return value, None
            return None, self._failed("grader_memory" if status == "memory" else "grader_error", value)
        raise AssertionError("unreachable")

    def _expired(self, exitcode: int | None, cpu_s: float, prepared: bool) -> GraderFailure:
        if exitcode == -signal.SIGVTALRM:
            return self._failed("grader_timeout", f"preparing the call used more than {self.prepare_cpu_s:g} s of CPU "
                                                  f"time; its worker was killed; scored 0")
        if exitcode in (-signal.SIGPROF, -signal.SIGXCPU):
            also = (f" (or preparing it more than {self.prepare_cpu_s:g} s)"
                    if prepared and exitcode == -signal.SIGXCPU else "")  # the backstop of both timers
            return self._failed("grader_timeout", f"the grader used more than {cpu_s:g} s of CPU time{also}; its "
                                                  f"worker was killed; scored 0")
        name = signal.Signals(-exitcode).name if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
        return self._failed("grader_error", f"the grader's worker died ({name}); scored 0")

    def _failed(self, kind: str, message: str) -> GraderFailure:
        with self._lock:  # callers are threads (envs.serve's sessions)
            self.counts[kind] += 1
        return GraderFailure(kind, message)

    def _tidy_dirs(self) -> None:
        """After a call that returned: look for dead workers' directories (:meth:`_remove_dead_dirs`) when the pool's
        workers changed since the last look, or a directory was kept then because its process was still ending. A
        worker can be replaced without any call of ours seeing it end (killed from outside while idle; stopped by
        pebble after its wall-clock timeout was reported; retired with its pool when a grader module was
        registered). Cost when nothing changed: one comparison of the worker pids."""
        live = frozenset(self.worker_pids())
        if live != self._dir_pids or self._dirs_pending:
            self._remove_dead_dirs()

    def _remove_dead_dirs(self, dead: int | None = None) -> None:
        """Remove the private directory (``worker-<pid>-*``) of the worker ``dead`` (pebble reported it ended) and of
        every other worker of this pool that is dead: neither a live worker nor a live process (one still ending is
        looked at again after a later call: :meth:`_tidy_dirs`). A pid reused meanwhile keeps its old directory until
        :meth:`close`."""
        root = self._root
        if root is None or self._pid != os.getpid():
            return
        live = frozenset(self.worker_pids())
        try:
            names = os.listdir(root)
        except OSError:
            return
        pending = False
        for name in names:
            parts = name.split("-")
            if len(parts) < 3 or parts[0] != "worker" or not parts[1].isdigit():
                continue
            pid = int(parts[1])
            if pid in live and pid != dead:
                continue
            if pid == dead or not process_alive(pid):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            else:  # not a worker of the pool now (retired, being stopped) or not yet listed (starting): look again
                pending = True
        with self._lock:
            self._dir_pids, self._dirs_pending = live, pending

    def worker_pids(self) -> list[int]:
        """The pids of the live workers (empty before the first call and after :meth:`close`)."""
        pool = self._pool
        if pool is None:
            return []
        return list(pool._pool_manager.worker_manager.workers)  # pebble keeps them by pid; no public accessor

    def close(self) -> None:
        """Stop every worker (a call in progress fails), wait for them to end and remove their private directories;
        the next :meth:`call` starts a new pool."""
        with self._lock:
            pool, self._pool = self._pool, None
            root = self._root if self._pid == os.getpid() else None
            self._root = None if root is not None else self._root
        if pool is not None and self._pid == os.getpid():
            pool.stop()
            pool.join()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (``/proc/<pid>/stat`` where there is a ``/proc``). Read
    from the system, not from multiprocessing's bookkeeping: where another part of the process reaps children
    (``waitpid(-1)``), multiprocessing's own poll fails and counts an ended child as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone since the signal; or no /proc here, and it exists
    except (OSError, IndexError):
        return True  # unreadable: assume alive (its directory stays until close)


def _close_if_alive(ref: "weakref.ref[GraderPool]") -> None:
    """The multiprocessing finalizer of a pool started in a multiprocessing child: close it if it still exists."""
    pool = ref()
    if pool is not None:
        pool.close()


def _allow_children() -> None:
    """Let a daemonic process (gymnasium's ``AsyncVectorEnv`` workers) start the pool's workers.

    multiprocessing refuses children to a daemon (``Process.start``: "daemonic processes are not allowed to have
    children") because its parent terminates it at exit and its children would be orphans. Ours are not left running:
    each reads the end of its pipe once this process is gone and exits, and a call it is running ends at its CPU
    limit (``tests/test_grader_in_child_processes.py`` kills an env worker and sees them go). The flag is this
    process's own view of itself: its parent still holds it a daemon and terminates it at exit."""
    process = multiprocessing.current_process()
    if process.daemon:
        process.daemon = False  # allowed: this process's own Process object has no Popen here


_default: GraderPool | None = None
_default_lock = threading.Lock()


def default_pool() -> GraderPool:
    """The process's shared pool (created on first use with the module's defaults; a forked child gets its own). In a
    daemonic process (gymnasium's ``AsyncVectorEnv`` worker: one env, one graded call at a time) it has one worker."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GraderPool(workers=1) if multiprocessing.current_process().daemon else GraderPool()
        return _default


def close_default_pool() -> None:
    """Close the shared pool (registered with ``atexit``); the next :func:`default_pool` makes a new one."""
    global _default
    with _default_lock:
        pool, _default = _default, None
    if pool is not None:
        pool.close()


_in_forked_child = False


#: Every pool of this process: a forked child gets fresh locks and slots for each (:func:`_forget_in_child`).
_pools: "weakref.WeakSet[GraderPool]" = weakref.WeakSet()


def _forget_in_child() -> None:
    global _default, _default_lock, _in_forked_child
    _default, _default_lock = None, threading.Lock()  # the parent's pool and lock are the parent's
    _in_forked_child = True
    for pool in list(_pools):  # a lock or slot held by another thread of the parent would never be released here
        pool._lock, pool._slots = threading.Lock(), FairSlots(pool.workers)


def grade(fn: Callable, *args: Any, prepare: tuple[Callable, tuple] | None = None) -> tuple[Any, GraderFailure | None]:
    """``default_pool().call(fn, *args, prepare=prepare)``."""
    return default_pool().call(fn, *args, prepare=prepare)


atexit.register(close_default_pool)
os.register_at_fork(after_in_child=_forget_in_child)
