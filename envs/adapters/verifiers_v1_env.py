"""verifiers 0.4 glue (the ``verifiers.v1`` Taskset / Task / Harness / Env API): every registered id as a v1 env.

verifiers 0.4.0 removed the classic API that :mod:`envs.adapters.verifiers_env` implements (``vf.MultiTurnEnv``,
``vf.Rubric``, ``load_environment(env_id)``); its loader, ``verifiers.v1.load_environment(config)``, imports the
module a taskset id names and takes the ``Taskset``, ``Env`` and ``Harness`` subclasses it exports. This module is
such a plugin: its id is its import path. verifiers 0.4 lives in its own venv layered over the project's
(``VERIFIERS_VERSION=0.4.0 bash benchmarks/verifiers_env.sh``: it pins ``mcp==2.0.0``); importing this module
imports verifiers::

    import asyncio
    import verifiers.v1 as vf
    from envs.adapters.verifiers_v1_env import GymEnvConfig, GymTasksetConfig

    config = GymEnvConfig(taskset=GymTasksetConfig(id="gym-taskset", gym_id="tau2/mock-v0",
                                                   limit=5))
    env = vf.load_environment(config)      # GymEnv: our env plays tools and customer; GymChatHarness by default
    ctx = vf.ModelContext(model="my-model", client=vf.EvalClientConfig(base_url="http://localhost:8000/v1",
                                                                        api_key_var="OPENAI_API_KEY"))

    async def main():
        async with env.serving():
            episodes = [await env.run_episode(task, ctx) for task in env.taskset.load()]
        return [ep.traces[0].reward for ep in episodes]

    rewards = asyncio.run(main())

What the v1 pieces are here:

* :class:`GymTaskset` (``GymTasksetConfig``: ``gym_id``, ``split``, ``limit``, ``make_kwargs``): one
  :class:`GymTask` per usable task of the split (``usable_task_indices(limit)``). A task carries the env's
  ``task_id``, its tool schemas (``info["tools"]``: the task's native tools, ``[]`` for one-turn envs) and its
  ``answer``; ``prompt`` is ``None``: the env opens the conversation (system prompt, the customer's opening line:
  with an LLM customer that line is this episode's own).
* :class:`GymTask`: its one ``@vf.reward``, ``env_reward``, is the env's final reward (0 when the episode did not
  end: cut by a verifiers limit, an error, a model that stopped answering).
* :class:`GymEnv` (``vf.Env``): one episode drives one Gymnasium env from a pool (``gym.make`` of a tau2 domain
  takes seconds), reset on the task's ``task_id``; the env goes back to the pool once the episode is over and no
  call on it still runs (a cancelled rollout's step finishes first: :class:`envs.adapters.env_pool.Lease`). The env plays the conversation's user side: its opening is the
  first turn; every assistant message the agent sends is one ``env.step`` (text and tool calls, exactly as our
  collector steps it) and the observation (tool answers in call order, the customer's reply) is the next turn.
  The trace's ``info["gym"]`` holds ``task_id``, ``reward``, ``terminated``, ``truncated``, ``termination_reason``,
  ``steps``.
* :class:`GymChatHarness` (the default harness of this taskset): an in-process chat loop, one model call per
  segment through verifiers' interception endpoint, the task's tools passed to the model as OpenAI tool schemas.
  It launches no program and fetches nothing, so it runs offline (0.4's built-in harnesses install their agents
  with ``uv`` at run time). Any other harness that supports resume can be paired instead.

Where we diverge from 0.4's own patterns, and why: 0.4 serves a task's tools as MCP servers (``Toolset``) in a
separate process per rollout; our tools mutate the episode's env (tau2's database), which lives with the env's run
loop, so the tool calls are executed by :class:`GymEnv` stepping the env (as TextArena's and OpenEnv's tasksets in
verifiers step their engines host-side). The agent still sees the domain's tools natively (OpenAI ``tools``).

This module never imports ``torchrl_grpo``.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import verifiers.v1 as vf
from openai import AsyncOpenAI
from pydantic import Field
from verifiers.v1.runtimes import ProgramResult

import envs as _envs
from envs.adapters.env_pool import EnvPool, end_episode, episode_summary
from envs.adapters.verifiers_env import GYM_STATE_KEY, assistant_action, content_text

__all__ = ["GymChatHarness", "GymEnv", "GymTaskset"]

gym.register_envs(_envs)

#: Pools of Gymnasium envs, one per (id, make kwargs as JSON), shared by the episodes of a process.
_POOLS: dict[str, EnvPool] = {}


def _pool(gym_id: str, make_kwargs: dict) -> EnvPool:
    key = json.dumps([gym_id, make_kwargs], sort_keys=True, default=str)
    if key not in _POOLS:
        _POOLS[key] = EnvPool(lambda: gym.make(gym_id, disable_env_checker=True, **make_kwargs))
    return _POOLS[key]


class GymTasksetConfig(vf.TasksetConfig):
    """Which env and tasks: ``gym_id`` a registered id (``envs.ENV_IDS``), ``split`` (``None``: the env's default),
    ``limit`` the first usable tasks only (``None``: all), ``make_kwargs`` forwarded to ``gym.make``."""

    gym_id: str = "tau2/mock-v0"
    split: str | None = None
    limit: int | None = Field(None, ge=1)
    make_kwargs: dict[str, Any] = Field(default_factory=dict)


class GymTaskData(vf.TaskData):
    """One task of the env: its ``task_id``, the env's tool schemas (OpenAI format) and reference ``answer``."""

    gym_id: str
    make_kwargs: dict[str, Any] = Field(default_factory=dict)
    task_id: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    answer: str = ""


class GymTask(vf.Task[GymTaskData, vf.State, vf.TaskConfig]):
    """A task of one of our envs, scored by that env."""

    @vf.reward
    async def env_reward(self, trace) -> float:
        """The env's final reward in [0, 1]; 0 when the env did not end the episode."""
        reward = (trace.info.get(GYM_STATE_KEY) or {}).get("reward")
        return 0.0 if reward is None else float(reward)


def _make_kwargs(config: GymTasksetConfig) -> dict:
    kwargs = dict(config.make_kwargs)
    if config.split is not None:
        kwargs["split"] = config.split
    return kwargs


class GymTaskset(vf.Taskset[GymTask, GymTasksetConfig]):
    """The usable tasks of ``config.gym_id``'s split as :class:`GymTask` rows (module docstring).

    Raises (from ``load``):
        ValueError: an id that does not follow :mod:`envs.contract` (``tau2/agent-gym-v0``), or no usable task.
        gymnasium.error.Error: unknown id.
    """

    def load(self) -> Iterator[GymTask]:
        config = self.config
        if config.gym_id in _envs.COMPAT_IDS:
            raise ValueError(f"{config.gym_id!r:.80}: not an id that follows envs.contract (envs.ENV_IDS)")
        kwargs = _make_kwargs(config)
        offline = {**kwargs, "user": "scripted"} if kwargs.get("user") == "llm" else kwargs
        probe = gym.make(config.gym_id, disable_env_checker=True, **offline)
        try:
            tasks = []
            for i in probe.unwrapped.usable_task_indices(config.limit):
                _, info = probe.reset(options={"index": i})
                answer = info.get("answer")
                tasks.append(GymTask(GymTaskData(
                    name=f"{config.gym_id}#{info['task_id']}", id=str(info["task_id"]), prompt=None,
                    gym_id=config.gym_id, make_kwargs=kwargs, task_id=str(info["task_id"]),
                    tools=list(info.get("tools") or []), answer="" if answer is None else str(answer)),
                    config.task))
        finally:
            probe.close()
        if not tasks:
            raise ValueError(f"{config.gym_id}: no task this env can play as configured")
        yield from tasks


def _wire(messages: list[dict]) -> list[dict]:
    """Our envs' observation messages as v1 turn messages (plain text content; tool messages keep their call id; an
    assistant message of the opening, tau2's greeting, is part of the given conversation, not a sampled turn)."""
    out = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            out.append({"role": "tool", "tool_call_id": str(m.get("tool_call_id") or ""),
                        "content": content_text(m.get("content")), "name": m.get("name")})
        elif role in ("system", "user", "assistant"):
            out.append({"role": role, "content": content_text(m.get("content"))})
        else:
            raise ValueError(f"an env observation holds a {role!r:.40} message")
    return out


def _action(segment) -> dict:
    """The segment's last assistant message as our envs' action (``{"role", "content", "tool_calls"?}``)."""
    for message in reversed(segment.messages):
        if getattr(message, "role", None) == "assistant":
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls or []]
            return assistant_action({"role": "assistant", "content": message.content, "tool_calls": calls})
    return {"role": "assistant", "content": ""}


class GymEnvConfig(vf.EnvConfig):
    """The env's one seat, ``agent`` (``--env.agent.*``: model, harness, limits). Its runtime defaults to a local
    subprocess (verifiers' default is Prime's hosted sandbox, which needs an account and a tunnel): the default
    harness runs in-process and executes nothing."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class GymEnv(vf.Env[GymEnvConfig]):
    """One episode = one pooled Gymnasium env driven by the agent's messages (module docstring)."""

    async def run(self, task, agents) -> None:
        data = task.data
        # the env goes back to the pool when the episode is over and no call on it runs: a rollout cancelled during
        # a step (a verifiers timeout, a shutdown) leaves the step running in its thread (EnvPool.lease, issue 49)
        async with _pool(data.gym_id, data.make_kwargs).lease() as lease:
            env = lease.env
            obs, _ = await lease.run(env.reset, options={"task_id": data.task_id})
            summary = episode_summary(data.task_id)
            async with agents.agent.interaction(task) as interaction:
                interaction.trace.info[GYM_STATE_KEY] = summary
                segment = await interaction.turn(_wire(obs))
                while not segment.terminated:
                    obs, reward, terminated, truncated, info = await lease.run(env.step, _action(segment))
                    summary["steps"] += 1
                    if terminated or truncated:
                        end_episode(summary, reward, terminated, truncated, info)
                        break
                    segment = await interaction.turn(_wire(obs))


class GymChatHarnessConfig(vf.HarnessConfig):
    """No settings of its own: sampling and limits are the agent's."""


class GymChatHarness(vf.Harness[GymChatHarnessConfig]):
    """An in-process chat loop: each segment is one chat completion through verifiers' interception endpoint on the
    conversation so far, with the task's tool schemas; no program launched, nothing fetched."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint: str, secret: str, mcp_urls: dict[str, str], data,
                     tool_interception_url: str | None = None) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        for m in prompt or []:
            messages.append(m.model_dump(mode="json", exclude_none=True) if hasattr(m, "model_dump") else dict(m))
        for m in messages:
            for call in m.get("tool_calls") or []:  # v1 keeps calls flat; the chat wire nests them in "function"
                call.setdefault("function", {"name": call.pop("name", None), "arguments": call.pop("arguments", "")})
                call.pop("namespace", None)
        tools = getattr(data, "tools", None) or None
        async with AsyncOpenAI(base_url=endpoint, api_key=secret) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages,
                                                 **({"tools": tools} if tools else {}))
        return ProgramResult(exit_code=0, stdout="", stderr="")
