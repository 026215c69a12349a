"""verifiers' evaluation loop over our tau2 env vs over tau2's own ``AgentGymEnv``, wrapped the same way, in one process.

Run it in the verifiers venv (``bash benchmarks/verifiers_env.sh``: verifiers 0.3.1 over the project venv). Both sides
are the same ``vf.MultiTurnEnv`` of :func:`envs.adapters.verifiers_env.load_environment` (same dataset rows, tool schemas,
rubric); the ``tau2`` side lends each rollout, instead of our Gymnasium env, an adapter over tau2's
``tau2.gym.AgentGymEnv`` (a new one per episode, as tau2 builds it: thread per episode, 10 ms polling; scripted
customer as in ``benchmarks/env_bench.py`` and ``benchmarks/trl_env_bench.py``), each assistant message sent as
tau2's action string (JSON tool call, plain text for the customer). One batch = ``env.evaluate`` over the tasks x 2
rollouts (verifiers' real loop: its OpenAI client over ``openai.AsyncOpenAI``, message normalisation, tool-call
parsing, rubric) with the model replaced by a scripted chat-completions endpoint on an httpx transport (no socket)
replaying each task's gold messages (``demonstration``), so both sides play identical episodes and model time is left
out of both.

steps/s = env steps (assistant messages the env answered) / wall time of the batch. A warm-up batch per side is not
timed (our pool's ``gym.make`` per rollout in flight); then batches alternate between sides (same load).

Usage::

    ../venv-verifiers-031/bin/python benchmarks/verifiers_env_bench.py --domain mock --tasks 4 --repeats 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import gymnasium as gym
import httpx
import openai
import verifiers as vf

import envs
from envs.adapters.env_pool import EnvPool
from envs.adapters.verifiers_env import GYM_STATE_KEY, load_environment

gym.register_envs(envs)


class AgentGymAsEnv:
    """What our pool lends a rollout (``reset(options={"task_id"})``, ``step(action)``, ``close``), over tau2's
    ``AgentGymEnv`` built per episode."""

    def __init__(self, domain: str, solo: bool):
        self.domain, self.solo, self._agym = domain, solo, None

    def reset(self, *, options: dict):
        from env_bench import make_tau2_gym_env

        self._agym = make_tau2_gym_env(self.domain, str(options["task_id"]), self.solo)
        obs, _ = self._agym.reset()
        return [{"role": "user", "content": obs if self.solo else obs.rsplit("user: ", 1)[-1]}], {}

    def step(self, action: dict):
        calls = action.get("tool_calls") or []
        if calls:
            f = calls[0]["function"]
            args = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else f["arguments"]
            text = json.dumps({"name": f["name"], "arguments": args})
        else:
            text = action.get("content") or ""
        obs, reward, term, trunc, info = self._agym.step(text)
        if (term or trunc) and self._agym._orchestrator_thread is not None:
            self._agym._orchestrator_thread.join(timeout=5)
        reply = ({"role": "tool", "tool_call_id": calls[0].get("id") or "", "content": obs} if calls
                 else {"role": "user", "content": obs})
        info = {"termination_reason": info.get("termination_reason")} if isinstance(info, dict) else {}
        return [reply], float(reward or 0.0), bool(term), bool(trunc), info

    def close(self) -> None:
        self._agym = None


class Script:
    """A scripted OpenAI-compatible ``POST /chat/completions``: rollout turn ``n`` of task ``t`` answers
    ``plans[t][n]`` (the turn counted in the rollout's verifiers state, sent in headers with the task id)."""

    def __init__(self, plans: dict[str, list[dict]]):
        self.plans = plans

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        reply = self.plans[request.headers["X-Task-Id"]][int(request.headers["X-Turn"])]
        message = {"role": "assistant", "content": reply.get("content")}
        if reply.get("tool_calls"):
            message["tool_calls"] = [{"id": c.get("id") or f"gold_{i}", "type": "function",
                                      "function": {"name": c["function"]["name"],
                                                   "arguments": c["function"]["arguments"] if isinstance(
                                                       c["function"]["arguments"], str)
                                                   else json.dumps(c["function"]["arguments"])}}
                                     for i, c in enumerate(reply["tool_calls"])]
        return httpx.Response(200, json={
            "id": "scripted", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def client(self):
        class Routed(vf.OpenAIChatCompletionsClient):
            async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
                state = kwargs["state"]
                turn = state.setdefault("bench_turn", 0)
                state["bench_turn"] = turn + 1
                kwargs["extra_headers"] = {"X-Task-Id": str(state["info"]["task_id"]), "X-Turn": str(turn)}
                return await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)

        return Routed(openai.AsyncOpenAI(base_url="http://scripted.invalid/v1", api_key="scripted", max_retries=0,
                                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handle))))


def batch(env, script: Script, rollouts: int) -> tuple[float, int, list]:
    """One ``env.evaluate`` batch: (wall seconds, env steps, sorted (task_id, reward, termination_reason))."""
    t0 = time.perf_counter()
    results = asyncio.run(env.evaluate(script.client(), "scripted", rollouts_per_example=rollouts,
                                       state_columns=[GYM_STATE_KEY], on_progress=lambda *a: None))
    wall = time.perf_counter() - t0
    outs = results["outputs"]
    bad = [o["error"] for o in outs if o.get("error")]
    if bad:
        raise RuntimeError(f"rollout errors: {bad[:2]}")
    steps = sum(o[GYM_STATE_KEY]["steps"] for o in outs)
    return wall, steps, sorted((o["info"]["task_id"], o["reward"], o[GYM_STATE_KEY]["termination_reason"]) for o in outs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--domain", default="mock")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=2, help="rollouts per task (a GRPO group)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    env_id = f"tau2/{args.domain}-v0"
    sides = {"ours": load_environment(env_id, limit=args.tasks), "tau2": load_environment(env_id, limit=args.tasks)}
    probe = gym.make(env_id)
    solo = probe.unwrapped.solo
    task_ids = [r["info"]["task_id"] for r in sides["ours"].get_eval_dataset().to_list()]
    plans = {t: probe.unwrapped.demonstration({"task_id": t}) for t in task_ids}
    probe.close()
    sides["tau2"]._pool.close()
    sides["tau2"]._pool = EnvPool(lambda: AgentGymAsEnv(args.domain, solo))
    script = Script(plans)
    times, steps, episodes = {s: [] for s in sides}, {}, {}
    for side, env in sides.items():  # warm-up (not timed)
        _, steps[side], episodes[side] = batch(env, script, args.rollouts)
    for _ in range(args.repeats):
        for side, env in sides.items():
            wall, n, eps = batch(env, script, args.rollouts)
            times[side].append(wall)
            assert (n, eps) == (steps[side], episodes[side]), (side, n, eps)
    load = os.getloadavg()
    print(f"# verifiers {vf.__version__} evaluate, {env_id}, {len(task_ids)} tasks x {args.rollouts} rollouts x "
          f"{args.repeats} repeats (+1 warm-up), env steps per batch: ours {steps['ours']}, tau2 {steps['tau2']}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs")
    for side in sides:
        med = statistics.median(times[side])
        print(f"{side:5s}: median batch {med:.3f} s (all {[round(t, 3) for t in times[side]]}), "
              f"{steps[side] / med:.1f} steps/s, rewards {[r for _, r, _ in episodes[side]]}, "
              f"ends {sorted({e for _, _, e in episodes[side]})}")
    print(f"rewards identical: {[r for _, r, _ in episodes['ours']] == [r for _, r, _ in episodes['tau2']]}")
    print(f"ratio ours/tau2 steps/s: {statistics.median(times['tau2']) / statistics.median(times['ours']):.2f}")
    for env in sides.values():
        asyncio.run(env._teardown())


if __name__ == "__main__":
    main()
