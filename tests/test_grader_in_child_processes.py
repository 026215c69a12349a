"""Graders in processes that multiprocessing started (envs/grader_process.py): gymnasium's ``AsyncVectorEnv``
workers (daemonic) and a user's own ``multiprocessing.Process``.

* A daemonic process may not start children (multiprocessing's rule, so that a terminated daemon leaves no orphans),
  so the graders of an ``AsyncVectorEnv`` worker ran in that worker without any bound: a sympy bomb in one env froze
  ``step_wait`` for every env (~120 s for ``exp(100000000*log(3))``, forever for ``exp(exp(20))``). Now they run in
  that worker's own pool with the same bounds: the bomb answers ``grader_timeout`` and the other env's gold scores 1.0.
* A child that graded never exited: multiprocessing joins a child's non-daemonic children when its target returns,
  and the pool's workers (pebble's) waited for calls for ever (``atexit``, which closes the pool, does not run in a
  multiprocessing child). Now the pool is also closed by a multiprocessing finalizer.
* No grader worker outlives its env worker: a normal ``close()`` stops them, and so does the env worker's death
  (SIGKILL: the workers read the end of their pipe and exit).

Each check runs in a child interpreter with a timeout: on the code before, the first froze (the test failed at
``step_wait``'s timeout) and the second hung at ``join``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym

import envs

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]
KW = dict(task="countdown", split="test", train_size=2, test_size=2)

_VECTOR = r"""
import json, os, signal, sys, time
import gymnasium as gym, psutil, envs
gym.register_envs(envs)
gold, bomb = sys.argv[1], sys.argv[2]


def live(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, s=20.0):
    end = time.time() + s
    while live(pids) and time.time() < end:
        time.sleep(0.2)
    return live(pids)


venv = gym.make_vec("ReasoningGym-v1", num_envs=2, vectorization_mode="async", **%(kw)r)
venv.reset(options={"index": 1})
t0 = time.perf_counter()
venv.step_async([f"<answer>{bomb}</answer>", gold])
_, rewards, _, _, infos = venv.step_wait(timeout=90)
dt = time.perf_counter() - t0
graders = [c.pid for p in venv.processes for c in psutil.Process(p.pid).children(recursive=True)]
venv.close()
after_close = wait_gone(graders)

venv = gym.make_vec("ReasoningGym-v1", num_envs=1, vectorization_mode="async", **%(kw)r)
venv.reset(options={"index": 1})
venv.step([gold])
worker = venv.processes[0].pid
killed = [c.pid for c in psutil.Process(worker).children(recursive=True)]
os.kill(worker, signal.SIGKILL)  # an env worker that dies as a crash would
after_kill = wait_gone(killed)
try:
    venv.close(terminate=True)
except OSError:  # gymnasium reading from the dead worker's pipe
    pass
print(json.dumps({"rewards": [float(r) for r in rewards], "errors": [str(e) for e in infos.get("action_error", [])],
                  "timeout": [bool(x) for x in infos["grader_timeout"]], "dt": dt, "graders": len(graders),
                  "killed": len(killed), "after_close": after_close, "after_kill": after_kill}))
"""

_PLAIN_CHILD = r"""
import json, multiprocessing as mp, os, time
from envs import grader_process


def job(q):
    value, failure = grader_process.grade(os.getpid)
    q.put([value != os.getpid(), failure is None])


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=job, args=(q,))
    p.start()
    ran = q.get(timeout=60)
    p.join(30)
    alive = p.is_alive()
    if alive:
        p.kill()
    print(json.dumps({"ran_in_a_worker": ran, "child_exited": not alive, "exitcode": p.exitcode}))
"""


def _run(args, timeout=180) -> dict:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_async_vector_env_bounds_its_graders_and_leaves_no_worker_behind():
    env = gym.make("ReasoningGym-v1", **KW)
    env.reset(options={"index": 1})
    gold = env.unwrapped.demonstration({"index": 1})[0]["content"]
    out = _run(["-c", _VECTOR % {"kw": KW}, gold, "exp(100000000*log(3))"])
    assert out["rewards"] == [0.0, 1.0], out
    assert out["errors"][0].startswith("grader_timeout") and out["timeout"] == [True, False], out
    assert out["dt"] < 30, out  # CPU bound 1 s; the rest is a loaded machine
    assert out["graders"] >= 2 and out["killed"] >= 1, out  # each env worker graded in workers of its own
    assert out["after_close"] == [] and out["after_kill"] == [], out


def test_a_multiprocessing_child_that_graded_exits(tmp_path):
    script = tmp_path / "child.py"  # a file: the fork server imports the caller's __main__
    script.write_text(_PLAIN_CHILD)
    out = _run([str(script)], timeout=150)
    assert out == {"ran_in_a_worker": [True, True], "child_exited": True, "exitcode": 0}, out


_UNGUARDED = r"""
import json, multiprocessing as mp, os, sys
import gymnasium as gym, envs
with open(os.environ["MAIN_LOG"], "a") as f:  # every process that runs this script's body
    f.write(f"{os.getpid()}\n")
gym.register_envs(envs)


def grade(q):
    env = gym.make("ReasoningGym-v1", task="countdown", split="test", train_size=2, test_size=2)
    env.reset(options={"index": 1})
    q.put(float(env.step(env.unwrapped.demonstration({"index": 1})[0]["content"])[1]))


ctx = mp.get_context("fork")
q = ctx.Queue()
grade(q)  # here (the pool's workers come from a fork server) ...
child = ctx.Process(target=grade, args=(q,))  # ... and in a forked child (its workers are spawned)
child.start()
child.join(120)
print(json.dumps({"rewards": [q.get(timeout=5), q.get(timeout=5)], "exitcode": child.exitcode}))
"""


def test_a_script_without_a_main_guard_grades_and_runs_once(tmp_path):
    """multiprocessing prepares a fork-server or spawned worker by running the caller's main script again (as
    ``__mp_main__``): a script without ``if __name__ == "__main__":`` that made a ReasoningGym env ran its body in
    every grader worker, which tried to start a pool while bootstrapping, and every call failed (``BrokenProcessPool:
    All workers expired``; gymnasium users do not guard a script that makes one env). The workers now never run the
    caller's main: the body runs once, in the script's process (and is not re-run by the forked child)."""
    script, log = tmp_path / "unguarded.py", tmp_path / "main.log"
    script.write_text(_UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "MAIN_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"rewards": [1.0, 1.0], "exitcode": 0}, out
    assert len(log.read_text().split()) == 1, log.read_text()
