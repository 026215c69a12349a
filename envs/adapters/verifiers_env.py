"""verifiers glue (prime-rl / Environments Hub): every registered id as a verifiers ``Environment``.

Needs verifiers' classic in-process API (``vf.MultiTurnEnv``, ``vf.SingleTurnEnv``, ``vf.Rubric``,
``env.evaluate(client, model, ...)``), i.e. verifiers 0.3.x, installed in its own venv layered over the project's
(``benchmarks/verifiers_env.sh``: verifiers pins ``mcp<2`` while this project resolves mcp 2.x; an extra could not
hold both). verifiers 0.4.0 is a rewrite (``verifiers.v1``: Taskset / Task / Harness / Env); its adapter is
:mod:`envs.adapters.verifiers_v1_env` (plugin id ``gym-taskset``). Importing this module does not import
verifiers; :func:`load_environment` does, and raises ``ImportError`` when the classic API is missing::

    import asyncio, verifiers as vf
    from openai import AsyncOpenAI
    from envs.adapters.verifiers_env import load_environment

    env = load_environment("tau2/mock-v0")                    # vf.MultiTurnEnv: the domain's tools, our env's reward
    env = load_environment("GSM8K-v1", split="test", limit=50)  # vf.SingleTurnEnv: our grader as the rubric
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="x"))
    results = asyncio.run(env.evaluate(client, "my-model", num_examples=10))
    rewards = [o["reward"] for o in results["outputs"]]
    # through verifiers' own loader (vf-eval): the module is the "environment", the id an argument
    env = vf.load_environment("envs.adapters.verifiers_env", gym_id="tau2/mock-v0")

What each id becomes (the rows are the split's usable tasks, ``usable_task_indices(limit)``, one per task):

* an env with tools (the tau2 domains): :class:`GymToolEnv`, a ``vf.MultiTurnEnv`` whose ``tool_defs`` are the
  env's own tool schemas (``info["tools"]``, ``done`` included). Each rollout holds one Gymnasium env (from a pool:
  ``gym.make`` of a tau2 domain takes seconds), reset on the row's ``task_id`` in ``setup_state`` (the env's opening
  becomes the rollout's prompt, so an LLM customer's opening line is the one this episode's customer said); every
  assistant message the model sends is one ``env.step`` (its text and tool calls, exactly as our own collector
  steps it), and the observation (tool answers in call order, the customer's reply) is verifiers' env response.
  When the env ends the episode the rollout stops (``final_env_response``); the rubric's ``env_reward`` is the env's
  final reward. A rollout that verifiers cuts before the env ended (its ``max_turns``, a model error, an overlong
  prompt, its timeout) scores 0, as our collector scores a truncated episode (tau2 scores ``max_steps`` 0).
* an env without tools (``GSM8K-v1``, ``IFEval-v0``, ``ReasoningGym-v1``): :class:`GymOneTurnEnv`, a
  ``vf.SingleTurnEnv`` whose prompt is the env's opening and whose rubric's ``env_reward`` resets a grader env on the
  row's ``task_id`` and steps it with the text of the model's last assistant message (``reasoning_content`` is not
  part of the answer): the env's own grader, reward in ``[0, 1]``.

Rollout state: ``state["gym"]`` holds ``task_id``, ``reward`` (``None`` until the env ended), ``terminated``,
``truncated``, ``termination_reason`` and ``steps`` (JSON values: ask for it with ``state_columns=["gym"]``).
Rows: ``prompt`` (the env's opening, chat messages), ``answer`` (the env's ``info["answer"]`` as text, ``""`` when it
has none), ``info`` (``{"task_id": str, "index": int}``).

Where a verifiers rollout differs from our collector's episode:

1. verifiers' reward functions swallow exceptions (logged, reward 0); an env that raised inside the grader shows as 0.
2. An empty model response is a verifiers error (``EmptyModelResponseError``) that stops the rollout before the env
   sees it (reward 0); our env would answer it as an ``action_error``.
3. verifiers checks its ``max_turns`` before it hands a reply to the env: with ``max_turns=k`` the env sees the
   first ``k - 1`` of the model's messages (the episode is cut, reward 0, unless the env ended before).
4. Rollouts run concurrently on one event loop: env calls run in worker threads (``asyncio.to_thread``), one env per
   rollout, so an LLM customer's latency overlaps across rollouts. A rollout that verifiers' timeout cancels during a
   step gives its env back only once that step has finished (:class:`envs.adapters.env_pool.Lease`).

This module never imports ``torchrl_grpo``.
"""
from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import envs as _envs
from envs.adapters.env_pool import EnvPool, end_episode, episode_summary

__all__ = ["GYM_STATE_KEY", "assistant_action", "load_environment", "to_vf_messages"]

gym.register_envs(_envs)

#: The rollout-state key holding our env's episode summary (see the module docstring).
GYM_STATE_KEY = "gym"
_JSON_SCALARS = (str, int, float, bool, type(None))


def _verifiers():
    """The verifiers package, checked for the classic API this module implements."""
    try:
        import verifiers as vf
    except ImportError as e:
        raise ImportError("envs.adapters.verifiers_env needs verifiers 0.3.x in its own venv: bash benchmarks/verifiers_env.sh "
                          "(then run with that venv's python)") from e
    if not all(hasattr(vf, name) for name in ("MultiTurnEnv", "SingleTurnEnv", "Rubric")):
        raise ImportError(f"verifiers {getattr(vf, '__version__', '?')} lacks the classic in-process API "
                          "(vf.MultiTurnEnv / vf.SingleTurnEnv / vf.Rubric) that envs.adapters.verifiers_env implements; "
                          "install verifiers 0.3.1 (benchmarks/verifiers_env.sh), or use verifiers 0.4's adapter, "
                          "envs.adapters.verifiers_v1_env (taskset id 'gym-taskset')")
    return vf


# ---------------------------------------------------------------------------------------------------------------
# message conversions (OpenAI-format dicts of our envs <-> verifiers' messages)
# ---------------------------------------------------------------------------------------------------------------
def content_text(content: Any) -> str:
    """The text of a message content: a string, or the ``text`` of its text parts (others dropped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            kind = part.get("type") if hasattr(part, "get") else None
            text = part.get("text") if hasattr(part, "get") else None
            if kind == "text" and isinstance(text, str):
                out.append(text)
        return "".join(out)
    raise TypeError(f"message content must be text or a list of parts, got {type(content).__name__}")


def to_vf_messages(messages: list[dict]) -> list[dict]:
    """Our envs' OpenAI-format chat messages as the plain dicts verifiers normalises (``vf.Messages`` once passed
    through its ``normalize_messages``): ``{"role", "content"}``, an assistant's ``tool_calls`` as verifiers'
    ``{"id", "name", "arguments": <JSON string>}``, a tool message's ``tool_call_id`` (``""`` when absent).

    Raises:
        ValueError: a role other than system / user / assistant / tool.
        TypeError: a message that is not a dict.
    """
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise TypeError(f"a chat message must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if role in ("system", "user"):
            out.append({"role": role, "content": content_text(m.get("content"))})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function") or {}
                args = fn.get("arguments", "")
                calls.append({"id": str(c.get("id") or ""), "name": str(fn.get("name") or ""),
                              "arguments": args if isinstance(args, str) else json.dumps(args, default=str)})
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": str(m.get("tool_call_id") or ""),
                        "content": content_text(m.get("content"))})
        else:
            raise ValueError(f"unknown chat message role {role!r:.40}")
    return out


def assistant_action(message: Any) -> dict:
    """A verifiers assistant message (``vf.AssistantMessage`` or a dict, tool calls as ``{"id", "name",
    "arguments"}``) as our envs' action: ``{"role": "assistant", "content": str | None, "tool_calls": [OpenAI
    calls]?}`` (:func:`envs.contract.check_action`'s action space). ``reasoning_content`` is dropped: the env reads
    what the model says and calls.

    Raises:
        TypeError: not an assistant message.
    """
    role = message.get("role") if hasattr(message, "get") else None
    if role != "assistant":
        raise TypeError(f"expected an assistant message, got role {role!r:.40}")
    content = message.get("content")
    action: dict[str, Any] = {"role": "assistant", "content": None if content is None else content_text(content)}
    calls = message.get("tool_calls") or []
    if calls:
        action["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                                 "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
                                for i, c in enumerate(calls)]
    return action


def _last_assistant_text(completion: Any) -> str:
    """The text of the last assistant message of a completion (``""`` when there is none)."""
    if isinstance(completion, str):
        return completion
    for m in reversed(list(completion or [])):
        if hasattr(m, "get") and m.get("role") == "assistant":
            return content_text(m.get("content"))
    return ""


def _tool_defs(tools: list[dict]) -> list[dict]:
    """OpenAI tool schemas (``{"type": "function", "function": {...}}``) as verifiers' ``vf.Tool`` dicts."""
    out = []
    for t in tools:
        fn = t.get("function", t)
        out.append({"name": fn["name"], "description": fn.get("description") or "",
                    "parameters": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out


# ---------------------------------------------------------------------------------------------------------------
# the verifiers classes (defined once verifiers is importable)
# ---------------------------------------------------------------------------------------------------------------
@functools.cache
def _classes() -> tuple[type, type]:
    vf = _verifiers()
    from verifiers.utils.message_utils import normalize_messages

    class GymToolEnv(vf.MultiTurnEnv):
        """A multi-turn env with tools over a Gymnasium env of :mod:`envs` (module docstring: what a rollout is)."""

        def __init__(self, gym_id: str, pool: EnvPool, **kwargs: Any):
            self.gym_id, self._pool, self._episodes = gym_id, pool, {}
            super().__init__(**kwargs)

        async def setup_state(self, state, **kwargs):
            # one lease per rollout, ended by release_env (verifiers' cleanup, also after its timeout cancelled a
            # turn): the env goes back to the pool only once no call on it runs (EnvPool.lease, issue 49)
            lease = await self._pool.lease().__aenter__()
            self._episodes[state["trajectory_id"]] = lease
            task_id = str(state["info"]["task_id"])
            obs, _ = await lease.run(lease.env.reset, options={"task_id": task_id})
            state["prompt"] = normalize_messages(to_vf_messages(obs), field_name="prompt")
            state[GYM_STATE_KEY] = episode_summary(task_id)
            return state

        async def env_response(self, messages, state, **kwargs):
            lease = self._episodes[state["trajectory_id"]]
            action = assistant_action(messages[-1])
            obs, reward, terminated, truncated, info = await lease.run(lease.env.step, action)
            summary = state[GYM_STATE_KEY]
            summary["steps"] += 1
            reply = normalize_messages(to_vf_messages(obs), field_name="env_response")
            if terminated or truncated:
                end_episode(summary, reward, terminated, truncated, info)
                state["final_env_response"] = reply
            return reply

        @vf.cleanup
        async def release_env(self, state, **kwargs):
            lease = self._episodes.pop(state.get("trajectory_id"), None)
            if lease is not None:
                await lease.__aexit__(None, None, None)

        @vf.teardown
        async def close_envs(self):
            self._pool.close()

    class GymOneTurnEnv(vf.SingleTurnEnv):
        """A one-turn env over a Gymnasium env of :mod:`envs`, graded by that env (module docstring)."""

        def __init__(self, gym_id: str, pool: EnvPool, **kwargs: Any):
            self.gym_id, self._pool = gym_id, pool
            super().__init__(**kwargs)

        @vf.teardown
        async def close_envs(self):
            self._pool.close()

    return GymToolEnv, GymOneTurnEnv


def _tool_reward() -> Callable:
    def env_reward(state) -> float:
        """The env's final reward; 0 when the env did not end the episode (cut by verifiers)."""
        reward = (state.get(GYM_STATE_KEY) or {}).get("reward")
        return 0.0 if reward is None else float(reward)

    return env_reward


def _one_turn_reward(gym_id: str, pool: EnvPool) -> Callable:
    def _grade(task_id: str, text: str) -> tuple[float, dict]:
        env = pool.acquire()
        try:
            env.reset(options={"task_id": task_id})
            _, reward, terminated, truncated, info = env.step(text)
        finally:
            pool.release(env)
        if not (terminated or truncated):
            raise RuntimeError(f"{gym_id} did not end after one step: not a one-turn env")
        summary = episode_summary(task_id)
        summary["steps"] = 1
        end_episode(summary, reward, terminated, truncated, info)
        return float(reward), summary

    async def env_reward(completion, info, state) -> float:
        reward, summary = await asyncio.to_thread(_grade, str(info["task_id"]), _last_assistant_text(completion))
        state[GYM_STATE_KEY] = summary
        return reward

    return env_reward


def _env_args(gym_id: str, split: str | None, limit: int | None, make_kwargs: dict) -> dict:
    args = {"gym_id": gym_id, "split": split, "limit": limit, **make_kwargs}
    return {k: v if isinstance(v, _JSON_SCALARS) else repr(v) for k, v in args.items()}


def load_environment(env_id: str | None = None, *, gym_id: str | None = None, split: str | None = None,
                     limit: int | None = None, **make_kwargs: Any):
    """A verifiers ``Environment`` playing a registered id of :mod:`envs` (module docstring: what each id becomes).

    Args:
        env_id: a registered id (``envs.ENV_IDS``: ``GSM8K-v1``, ``IFEval-v0``, ``ReasoningGym-v1``,
            ``tau2/{airline,retail,telecom,mock}-v0``, ...).
        gym_id: the same, by keyword, for ``vf.load_environment("envs.adapters.verifiers_env", gym_id=...)`` (verifiers'
            loader takes ``env_id`` itself); give one of the two.
        split: the split (``None``: the env's default).
        limit: only the first ``limit`` usable tasks (``None``: all); one dataset row per task.
        **make_kwargs: forwarded to ``gym.make`` (``task="chain_sum"``, ``user="llm"``, ``reward="partial"``, ...).
            Building the rows never calls an LLM customer (``user="llm"`` is built as ``"scripted"``: same prompts;
            the rollout's prompt is the opening of its own episode).

    Returns:
        ``GymToolEnv`` (``vf.MultiTurnEnv``) for an env with tools, else ``GymOneTurnEnv`` (``vf.SingleTurnEnv``);
        ``env_id`` is the Gymnasium id, ``env_args`` the arguments (JSON values).

    Raises:
        ImportError: verifiers with the classic API (0.3.x) is not installed.
        ValueError: neither or both of ``env_id`` / ``gym_id``; ``limit < 1``; an id that does not follow
            :mod:`envs.contract` (``tau2/agent-gym-v0``); no task the env can play as configured.
        gymnasium.error.Error: unknown id.
    """
    if (env_id is None) == (gym_id is None):
        raise ValueError("give the registered id as env_id or gym_id (one of the two)")
    gym_id = env_id if env_id is not None else gym_id
    if not isinstance(gym_id, str) or gym_id in _envs.COMPAT_IDS:
        raise ValueError(f"{gym_id!r:.80}: not an id that follows envs.contract (envs.ENV_IDS)")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an int >= 1 or None, got {limit!r:.40}")
    vf = _verifiers()
    GymToolEnv, GymOneTurnEnv = _classes()
    from datasets import Dataset

    kwargs = dict(make_kwargs)
    if split is not None:
        kwargs["split"] = split
    offline = {**kwargs, "user": "scripted"} if kwargs.get("user") == "llm" else kwargs
    pool = EnvPool(lambda: gym.make(gym_id, disable_env_checker=True, **kwargs))
    probe = gym.make(gym_id, disable_env_checker=True, **offline)
    try:
        rows, tools = [], None
        for i in probe.unwrapped.usable_task_indices(limit):
            obs, info = probe.reset(options={"index": i})
            tools = info.get("tools") or []
            answer = info.get("answer")
            rows.append({"prompt": to_vf_messages(obs), "answer": "" if answer is None else str(answer),
                         "info": {"task_id": str(info["task_id"]), "index": int(info["index"])}})
        if not rows:
            raise ValueError(f"{gym_id}: no task this env can play as configured")
    except BaseException:
        probe.close()
        raise
    if offline is kwargs:
        pool.add(probe)
    else:
        probe.close()
    dataset = Dataset.from_list(rows)
    common = {"dataset": dataset, "eval_dataset": dataset, "env_id": gym_id,
              "env_args": _env_args(gym_id, split, limit, make_kwargs)}
    if tools:
        rubric = vf.Rubric(funcs=[_tool_reward()])
        return GymToolEnv(gym_id, pool, tool_defs=_tool_defs(tools), rubric=rubric, **common)
    rubric = vf.Rubric(funcs=[_one_turn_reward(gym_id, pool)])
    return GymOneTurnEnv(gym_id, pool, rubric=rubric, **common)

