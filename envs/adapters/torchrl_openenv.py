"""TorchRL over an OpenEnv server: :class:`OpenEnvTextEnv` and :func:`make_openenv_torchrl_env`.

torchrl 0.14.1 ships no OpenEnv env class: ``torchrl.envs.llm`` has ``ChatEnv``, ``DatasetChatEnv`` (GSM8K,
IFEval), ``MLGymWrapper`` and tool transforms (Python executor, MCP, browser), and nothing in torchrl 0.14.1
mentions OpenEnv (checked with ``grep -ri openenv`` over the installed package). This module is the adapter:

* :class:`OpenEnvTextEnv`: a Gymnasium env that follows :mod:`envs.contract` and runs its episodes on an OpenEnv
  server (``python -m envs.serve <id>``, :mod:`envs.serve`) through openenv-core's own WebSocket client
  (``openenv.core.generic_client.GenericEnvClient``): one instance = one server session = one env on the server.
* :func:`make_openenv_torchrl_env`: ``B`` of them as one TorchRL ``EnvBase`` (:class:`envs.adapters.torchrl_env.TextEnv`, the
  same adapter as for in-process envs), so a TorchRL rollout (``env.rollout``, a collector, an LLM wrapper) drives
  the served env exactly as it drives ``envs.adapters.torchrl_env.make_torchrl_env(env_id)``::

      # shell: python -m envs.serve tau2/mock-v0 --port 8000
      from envs.adapters.torchrl_openenv import make_openenv_torchrl_env
      env = make_openenv_torchrl_env("http://127.0.0.1:8000", batch_size=4, tokenizer=tok)
      td = env.reset()                                   # ("text", "prompt"), "messages", ...
      td["action"] = NonTensorStack(*texts)              # the model's texts
      td = env.step(td)                                  # td["next", "reward"], td["next", "done"]

Mapping (action -> wire -> env): a ``str`` action is sent as ``{"content": text}`` and parsed by the served env
(tool calls in the model family's format, :mod:`envs.tau2.actions`); an assistant message dict as ``{"content",
"tool_calls"}``. The server's ``TextObservation`` maps back to ``obs = observation["messages"]``, ``reward``,
``terminated`` / ``truncated``, ``info = observation["info"]`` (a JSON-safe copy of the env's info; ``envs.serve``
leaves out ``messages`` -- rebuilt here, see ``exact_messages`` -- and, on step, ``tools`` -- the reset's are kept). ``reset(options={"task_id" | "index"}, seed=...)`` is sent as the session's reset data.

Where we diverge from an in-process env, and why: ``num_tasks`` / ``task_ids`` / ``usable_task_indices`` are not
available (OpenEnv's protocol has no task listing; pass ``task_index`` / ``options`` to reset, or a seed), and
``info`` is the JSON-safe copy the server sends (tau2's ``reward_info`` as a dict, as in-process).
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

import gymnasium as gym

from envs.adapters.remote_env import ClientBounds, RemoteBoundError, RemoteEnvError, parse_reply
from envs.contract import check_action
from envs.spaces import AssistantAction, ChatMessages

__all__ = ["OpenEnvTextEnv", "make_openenv_torchrl_env"]


class OpenEnvTextEnv(gym.Env):
    """One session on an OpenEnv server of :mod:`envs.serve`, as a Gymnasium env following :mod:`envs.contract`.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:8000"``.
        connect_timeout_s: seconds to open the WebSocket.
        message_timeout_s: seconds to wait for the answer to one ``reset`` / ``step`` (a tau2 step with an LLM
            customer waits for the customer's model).
        bounds: what a reply may cost (:class:`envs.adapters.remote_env.ClientBounds`, as for
            :class:`~envs.adapters.remote_env.RemoteEnv`): its ``max_reply_bytes`` (8 MiB, after decompression) is
            the client's ``max_message_size_mb`` (openenv-core's default: 100 MiB), and every reply passes
            ``max_json_depth`` / ``max_json_containers`` before ``json.loads`` (openenv-core parses it
            unchecked: a 200k-deep reply raised ``RecursionError``). It expands no schema (the tools reach the
            chat template as data), so the ``max_schema_*`` bounds do not apply.
        exact_messages: fill ``info["messages"]`` after every step with the server's own conversation (one more
            round trip per step: ``state``). Default ``False``: ``envs.serve`` sends only the new messages, and
            ``info["messages"]`` is the conversation accumulated here (reset messages, each action as sent, each
            observation), which is what :class:`envs.adapters.torchrl_env.TextEnv` records anyway; it differs from the env's only
            in how an action is written (the raw text sent vs. the env's parsed assistant message).

    Raises (``reset``): ``ValueError`` when the server rejects the reset (unknown task id, index out of range,
    bad option); ``RemoteBoundError`` / ``RemoteEnvError`` (``BAD_REPLY``) for a reply past ``bounds`` or not
    JSON (``reset`` and ``step``). (``step``): ``TypeError`` for an action outside the action space (checked here, nothing sent);
    ``RuntimeError`` for anything the server reports (step before reset or after the end, an env failure).
    Connection errors of the client (``websockets``/``OSError``/``TimeoutError``) propagate.
    """

    metadata = {"render_modes": []}

    def __init__(self, base_url: str, *, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0,
                 exact_messages: bool = False, bounds: ClientBounds | None = None):
        if bounds is not None and not isinstance(bounds, ClientBounds):
            raise ValueError(f"bounds must be a ClientBounds, got {type(bounds).__name__}")
        self.base_url = base_url
        self.bounds = bounds or ClientBounds()
        self.observation_space = ChatMessages()
        self.action_space = AssistantAction()
        self._client = _bounded_client_class()(
            self.bounds, base_url=base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s,
            max_message_size_mb=self.bounds.max_reply_bytes / (1 << 20)).sync()
        self._client.connect()
        self._closed = False
        self.exact_messages = bool(exact_messages)
        self._messages: list[dict] = []
        self._tools: list = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        data: dict[str, Any] = {}
        if seed is not None:
            data["seed"] = int(seed)
        for key, value in (options or {}).items():
            data[key] = value  # the server validates (unknown keys, types): BadRequestError -> ValueError here
        try:
            result = self._client.reset(**data)
        except RemoteEnvError:  # a reply past the bounds, or not JSON: the server's fault, not the reset's
            raise
        except RuntimeError as e:
            raise ValueError(f"{self.base_url}: {e}") from e
        observation = result.observation or {}
        obs = list(observation.get("messages") or [])
        info = dict(observation.get("info") or {})
        self._messages = list(obs)  # on reset, obs is the whole conversation (envs.contract)
        self._tools = info.get("tools") or []
        info.setdefault("messages", list(self._messages))
        return obs, info

    def step(self, action: str | dict) -> tuple[list[dict], float, bool, bool, dict]:
        check_action(action)
        wire = {"content": action} if isinstance(action, str) else \
            {"content": action.get("content"), "tool_calls": action.get("tool_calls")}
        result = self._client.step(wire)
        observation = result.observation or {}
        reward = float(result.reward) if result.reward is not None else 0.0
        obs = list(observation.get("messages") or [])
        info = dict(observation.get("info") or {})
        sent = {"role": "assistant", **{k: v for k, v in wire.items() if v is not None}}
        self._messages = self._messages + [sent] + obs
        if self.exact_messages:
            info["messages"] = list(self.state().get("messages") or [])
        else:
            info.setdefault("messages", list(self._messages))
        info.setdefault("tools", self._tools)  # envs.serve sends the tools on reset only
        return obs, reward, bool(observation.get("terminated")), bool(observation.get("truncated")), info

    def state(self) -> dict:
        """The server's ``TextState`` of this session (env id, task, messages, step count, reward, tau2 ``db_hash``)."""
        return self._client.state()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


@functools.cache
def _bounded_client_class() -> type:
    """openenv-core's ``GenericEnvClient`` whose every reply is checked by
    :func:`envs.adapters.remote_env.parse_reply` (size already capped by websockets' ``max_size``; then depth and
    containers by the linear scan, then ``json.loads``), and whose oversized reply raises ``RemoteBoundError``
    ``max_reply_bytes`` instead of a bare ``ConnectionClosedError``. Overrides openenv-core 0.3's ``_receive``
    (``[serve]`` pins ``openenv-core>=0.3,<0.4``; ``tests/test_issue49_client_bounds.py`` checks it)."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("OpenEnvTextEnv needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

    class BoundedGenericEnvClient(GenericEnvClient):
        def __init__(self, bounds: ClientBounds, **kwargs: Any):
            super().__init__(**kwargs)
            self._bounds = bounds

        async def _receive(self) -> dict:
            from websockets.exceptions import ConnectionClosed
            from websockets.frames import CloseCode

            try:
                raw = await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
            except ConnectionClosed as e:
                if e.sent is not None and e.sent.code == CloseCode.MESSAGE_TOO_BIG:
                    raise RemoteBoundError("max_reply_bytes", f"the reply is larger than {self._bounds.max_reply_bytes}"
                                                              f" bytes (after decompression)") from None
                raise
            reply = parse_reply(raw, self._bounds)
            if not isinstance(reply, dict):
                raise RemoteEnvError(f"unexpected reply {reply!r:.200}", "BAD_REPLY")
            return reply

    return BoundedGenericEnvClient


def make_openenv_torchrl_env(base_url: str, batch_size: int = 1, *, tokenizer: Any | None = None,
                             template_kwargs: dict | None = None, device: Any = None,
                             message_timeout_s: float = 60.0, **text_env_kwargs: Any):
    """``batch_size`` sessions on the OpenEnv server at ``base_url`` as one TorchRL ``EnvBase``
    (:class:`envs.adapters.torchrl_env.TextEnv`, ``batch_size=[B]``; keys as documented there).

    Args:
        base_url: the server (``python -m envs.serve <id>``).
        batch_size: number of sessions ``B`` (the server's ``--max-sessions`` must allow them).
        tokenizer, template_kwargs, device, **text_env_kwargs: see :class:`envs.adapters.torchrl_env.TextEnv`.
        message_timeout_s: see :class:`OpenEnvTextEnv`.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    from envs.adapters.torchrl_env import TextEnv

    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sessions: list[OpenEnvTextEnv] = []
    try:
        for _ in range(int(batch_size)):
            sessions.append(OpenEnvTextEnv(base_url, message_timeout_s=message_timeout_s))
    except BaseException:
        for s in sessions:  # do not leave the sessions already opened on the server
            s.close()
        raise
    return TextEnv(sessions, tokenizer=tokenizer, template_kwargs=template_kwargs, device=device, **text_env_kwargs)
