"""Run as ``python -m tests.grader_main_probe`` by tests/test_grader_process.py: a main module (as ``python -m
envs.serve`` is one) whose imports (:mod:`tests.grader_main_probe_imports`) record the pid of every process that
imports them, then a one-worker grader pool whose worker is killed by the CPU bound and replaced. Prints the two worker
pids as JSON."""
import json
import os

import tests.grader_main_probe_imports  # noqa: F401 -- stands for envs.serve's imports (fastapi, uvicorn, ...)

if __name__ == "__main__":
    from envs.grader_process import GraderPool

    pool = GraderPool(workers=1, cpu_s=0.3)
    first, _ = pool.call(os.getpid)
    _, failure = pool.call(pow, 3, 10**9)  # one C call: killed by its CPU bound, the worker replaced
    second, _ = pool.call(os.getpid)
    pool.close()
    print(json.dumps({"workers": [first, second], "failure": failure.kind if failure else None}))
