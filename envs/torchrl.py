"""TorchRL adapter for the chat-based Gymnasium envs of this package.

:class:`TextEnv` runs a batch of ``B`` Gymnasium text envs that follow the env contract of
``envs`` (observation: the list of new OpenAI-format chat messages; action: raw model text or an
assistant message dict; ``info["messages"]`` the whole conversation, optional ``info["tools"]``)
as one :class:`torchrl.envs.EnvBase` with ``batch_size=[B]``. Single-turn (GSM8K) and multi-turn
tool-using envs (tau2) go through the same code.

Data layout (``B`` = batch size, ``T_b`` = number of messages of conversation ``b``, ``L_b`` =
number of prompt tokens of conversation ``b``; ragged dims are lazily stacked):

========================  ==================================  ===================================
key                       type / shape                        content
========================  ==================================  ===================================
``"observation"``         NonTensor ``[B]``                   new messages since the last step
                                                              (``list[dict]``)
``"messages"``            NonTensor ``[B]``                   whole conversation (``list[dict]``)
``("history","prompt")``  :class:`~torchrl.data.llm.History`  whole conversation as torchrl
                          ``[B, T_b]``                        ``History`` (role, content,
                                                              tool_calls)
``"tools"``               NonTensor ``[B]``                   OpenAI tool schemas or ``None``
``"info"``                NonTensor ``[B]``                   the env's ``info`` dict without
                                                              ``messages``/``tools``
``("text","prompt")``     NonTensor ``[B]`` (tokenizer only)  chat template applied, generation
                                                              prompt added
``("tokens","prompt")``   int64 ``[B, L_b]`` (tokenizer only) token ids of that text
``"reward"``              float32 ``[B, 1]``                  env reward of the last step
``"done"``, ``"terminated"``, ``"truncated"``  bool ``[B, 1]``  Gymnasium flags (done = or)
``"action"``              NonTensor ``[B]`` (input of step)   ``str`` or assistant message dict
========================  ==================================  ===================================

Reset inputs (all optional): ``"_reset"`` bool ``[B, 1]`` (partial reset: only those envs are
reset, the others keep their current observation), ``"options"`` NonTensor ``[B]`` of per-env
Gymnasium reset options (``dict`` or ``None``), ``"task_index"`` int ``[B]``/``[B, 1]``
(``i >= 0`` means ``options={"index": i}``, negative means "draw one").

Conventions kept from TorchRL's own LLM envs (``torchrl.envs.llm.ChatEnv`` and friends, 0.14):
the conversation lives in a :class:`~torchrl.modules.llm.policies.ChatHistory` under
``"history"`` with the policy input in ``("history", "prompt")``; text and tokens under
``("text", "prompt")`` / ``("tokens", "prompt")`` (:class:`~torchrl.modules.llm.policies.Text` /
:class:`~torchrl.modules.llm.policies.Tokens`), ragged data lazily stacked. So a TorchRL LLM
wrapper (``TransformersWrapper``/``vLLMWrapper``) in ``input_mode="history"`` or ``"text"``
can read the prompt directly, and its ``("text", "response")`` / ``("history", "response")``
output is accepted as the action when ``"action"`` is absent.

Where we diverge from ``ChatEnv``: (1) the *environment* owns the conversation, the task and the
reward (``ChatEnv`` is a blank canvas fed by a ``DataLoadingPrimer`` and scored by reward
transforms such as ``GSM8KRewardParser``), because tau2's tool execution, user simulator and
evaluator live in the Gymnasium env; (2) the action is plain text (``"action"``), not the
policy's ``("history", "full")``, so any generator can drive it; (3) OpenAI message extras that
``History`` has no field for (``tool_call_id``, ``name``) are kept in ``"messages"`` only, which
is the lossless record; (4) tokens are rendered with ``tokenizer.apply_chat_template`` on the
OpenAI messages (with ``tools=``), not with ``History.apply_chat_template``, so tool schemas
reach templates that support them.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import torch
from tensordict import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    lazy_stack,
)
from torchrl.data import Categorical, Composite, NonTensor, Unbounded
from torchrl.data.llm import History
from torchrl.envs import EnvBase
from torchrl.modules.llm.policies import ChatHistory, Text, Tokens

__all__ = ["TextEnv", "make_torchrl_env"]

def _to_history(messages: list[dict]) -> History:
    """``History`` of shape ``[T]`` (role and content) from OpenAI messages.

    ``content=None`` becomes ``""``. Only ``role`` and ``content`` are filled: building and
    cloning (``step_mdp`` clones every step) a ``History`` with all five fields costs about 3x
    more, and tool calls / tool-call ids are kept losslessly in ``"messages"``.
    """
    td = TensorDict(
        {
            "role": NonTensorStack.from_list([m.get("role", "user") for m in messages]),
            "content": NonTensorStack.from_list([m.get("content") or "" for m in messages]),
        },
        batch_size=[len(messages)],
    )
    return History._from_tensordict(td)


def _history_spec(batch_size: torch.Size) -> Composite:
    """Spec of ``("history", "prompt")``: ``History`` ``[B, -1]`` with role and content."""
    shape = batch_size + (-1,)
    return Composite(
        prompt=Composite(
            role=NonTensor(shape=shape, example_data="user"),
            content=NonTensor(shape=shape, example_data="hi"),
            shape=shape,
            data_cls=History,
        ),
        shape=batch_size,
        data_cls=ChatHistory,
        step_mdp_static=True,
    )


def _non_tensor_stack(items: list) -> NonTensorStack:
    """``NonTensorStack [len(items)]`` holding each item as one datum (lists are not unrolled)."""
    return NonTensorStack(*[NonTensorData(x) for x in items])


def _options_list(value: Any, batch: int) -> list:
    """Per-env reset options from a NonTensor entry (stack, data, list or single dict)."""
    if isinstance(value, NonTensorStack):
        value = value.tolist()
    elif isinstance(value, NonTensorData):
        value = value.data
    if isinstance(value, dict) or value is None:
        return [copy.deepcopy(value) for _ in range(batch)]
    value = list(value)
    if len(value) != batch:
        raise ValueError(f"'options' has {len(value)} entries, expected {batch}")
    return value


class TextEnv(EnvBase):
    """A batch of Gymnasium chat envs as a TorchRL ``EnvBase`` (see the module docstring).

    Args:
        envs: ``B`` Gymnasium envs following the ``envs`` contract, or zero-argument callables
            that build them.

    Keyword Args:
        tokenizer: optional ``transformers`` tokenizer with a ``chat_template``; when given,
            ``("text", "prompt")`` and ``("tokens", "prompt")`` are emitted after every reset
            and step.
        template_kwargs: extra kwargs for ``tokenizer.apply_chat_template``.
        device: device of the tensors (``reward``, flags, tokens). Default CPU.

    Step semantics: an env that is already done when stepped is not stepped again; it repeats
    its last observation with ``reward=0`` and ``done=True`` (so ``rollout`` with
    ``break_when_any_done=False, break_when_all_done=True`` works on a batch of episodes of
    different lengths). An action that is neither text nor a dict is handed to the Gymnasium
    env as-is, which answers it with an error observation (the envs never crash on bad actions).

    Seeding: :meth:`set_seed` gives env ``b`` the seed ``seed + b`` on its next reset, as
    ``gymnasium.vector`` does.

    Raises:
        ValueError: empty ``envs``; a malformed ``options``/``task_index`` entry at reset; an
            env that returns a non-list observation.
        KeyError: ``step`` with no ``"action"`` (nor ``("text","response")`` /
            ``("history","response")``) entry.
        RuntimeError: ``step`` before ``reset``.
    """

    batch_locked = True

    def __init__(
        self,
        envs: Sequence[gym.Env | Callable[[], gym.Env]],
        *,
        tokenizer: Any | None = None,
        template_kwargs: dict | None = None,
        device: torch.device | str | None = None,
    ):
        envs = [e if isinstance(e, gym.Env) else e() for e in envs]
        if not envs:
            raise ValueError("TextEnv needs at least one env")
        for e in envs:
            if not isinstance(e, gym.Env):
                raise ValueError(f"expected gymnasium.Env instances, got {type(e).__name__}")
        if tokenizer is not None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; set one to render prompts")
        super().__init__(batch_size=torch.Size([len(envs)]), device=device)
        self.envs = envs
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        n = len(envs)
        self._messages: list[list[dict]] = [[] for _ in range(n)]
        self._observation: list[list[dict]] = [[] for _ in range(n)]
        self._tools: list[Any] = [None] * n
        self._info: list[dict] = [{} for _ in range(n)]
        self._flags: list[tuple[bool, bool]] = [(False, False)] * n  # (terminated, truncated)
        self._started = [False] * n
        self._history_cache: list[History | None] = [None] * n
        self._render_cache: list[tuple[str, torch.Tensor] | None] = [None] * n
        self._pending_seeds: list[int | None] = [None] * n
        self._make_specs()

    # ------------------------------------------------------------------ specs
    def _make_specs(self) -> None:
        bs = self.batch_size
        obs = {
            "observation": NonTensor(shape=bs, example_data=[{"role": "user", "content": "hi"}]),
            "messages": NonTensor(shape=bs, example_data=[{"role": "user", "content": "hi"}]),
            "tools": NonTensor(shape=bs, example_data=None),
            "info": NonTensor(shape=bs, example_data={}),
            "history": _history_spec(bs),
        }
        if self.tokenizer is not None:
            obs["text"] = Text.default_spec(shape=bs, keys=["prompt"])
            obs["tokens"] = Composite(
                prompt=Unbounded(shape=bs + (-1,), dtype=torch.int64),
                shape=bs,
                data_cls=Tokens,
                step_mdp_static=True,
            )
        self.full_observation_spec = Composite(obs, shape=bs).to(self.device)
        self.full_action_spec = Composite(
            action=NonTensor(shape=bs, example_data="#### 0"), shape=bs
        ).to(self.device)
        self.full_reward_spec = Composite(
            reward=Unbounded(shape=bs + (1,), dtype=torch.float32), shape=bs
        ).to(self.device)
        self.full_done_spec = Composite(
            done=Categorical(2, shape=bs + (1,), dtype=torch.bool),
            terminated=Categorical(2, shape=bs + (1,), dtype=torch.bool),
            truncated=Categorical(2, shape=bs + (1,), dtype=torch.bool),
            shape=bs,
        ).to(self.device)

    # ------------------------------------------------------------- rendering
    def _render(self, b: int) -> tuple[str, torch.Tensor]:
        """Chat-template text and token ids of env ``b``'s conversation (cached)."""
        if self._render_cache[b] is None:
            kwargs = dict(self.template_kwargs)
            if self._tools[b]:
                kwargs["tools"] = self._tools[b]
            text = self.tokenizer.apply_chat_template(
                self._messages[b], tokenize=False, add_generation_prompt=True, **kwargs
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._render_cache[b] = (text, torch.as_tensor(ids, dtype=torch.int64))
        return self._render_cache[b]

    def _history(self, b: int) -> History:
        """``History [T_b]`` of env ``b``'s conversation (cached)."""
        if self._history_cache[b] is None:
            self._history_cache[b] = _to_history(self._messages[b])
        return self._history_cache[b]

    def _batch_td(self, rewards: list[float]) -> TensorDict:
        """The ``[B]`` TensorDict that every reset and step returns (module docstring)."""
        n = self.batch_size[0]
        terminated = torch.tensor([t for t, _ in self._flags], dtype=torch.bool).unsqueeze(-1)
        truncated = torch.tensor([t for _, t in self._flags], dtype=torch.bool).unsqueeze(-1)
        td = TensorDict(
            {
                "observation": _non_tensor_stack([copy.deepcopy(o) for o in self._observation]),
                "messages": _non_tensor_stack([copy.deepcopy(m) for m in self._messages]),
                "tools": _non_tensor_stack([copy.deepcopy(t) for t in self._tools]),
                "info": _non_tensor_stack(list(self._info)),
                "history": ChatHistory(
                    prompt=lazy_stack([self._history(b) for b in range(n)]),
                    batch_size=self.batch_size,
                ),
                "reward": torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
            batch_size=self.batch_size,
        )
        if self.tokenizer is not None:
            rendered = [self._render(b) for b in range(n)]
            td["text"] = Text(
                prompt=_non_tensor_stack([t for t, _ in rendered]), batch_size=self.batch_size
            )
            td["tokens"] = lazy_stack([Tokens(prompt=ids) for _, ids in rendered])
        return td if self.device is None else td.to(self.device)

    def _record(self, b: int, obs: Any, info: dict, action_msg: dict | None) -> None:
        """Store what env ``b`` returned; invalidate its cached History and rendering."""
        if not isinstance(obs, list):
            raise ValueError(
                f"env {b} ({type(self.envs[b]).__name__}) returned a {type(obs).__name__} "
                "observation; TextEnv expects a list of chat messages"
            )
        info = dict(info)
        messages = info.pop("messages", None)
        if messages is None:  # env does not report the conversation: accumulate it
            messages = self._messages[b] + ([action_msg] if action_msg else []) + list(obs)
        self._observation[b] = obs
        self._messages[b] = messages
        if "tools" in info:  # latest report wins; envs may report tools at reset only
            self._tools[b] = info.pop("tools")
        self._info[b] = info
        self._history_cache[b] = None
        self._render_cache[b] = None

    # ------------------------------------------------------------------ reset
    def _reset_options(self, tensordict: TensorDictBase | None) -> list:
        n = self.batch_size[0]
        options: list = [None] * n
        if tensordict is None:
            return options
        if "options" in tensordict.keys():
            options = _options_list(tensordict.get("options"), n)
        if "task_index" in tensordict.keys():
            idx = torch.as_tensor(tensordict.get("task_index")).reshape(-1)
            if idx.numel() != n or idx.is_floating_point():
                raise ValueError(f"'task_index' must hold {n} integers, got {idx.tolist()}")
            for b, i in enumerate(idx.tolist()):
                if i >= 0:
                    options[b] = {**(options[b] or {}), "index": int(i)}
        for b, o in enumerate(options):
            if o is not None and not isinstance(o, dict):
                raise ValueError(f"reset options for env {b} must be a dict or None, got {o!r:.80}")
        return options

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        n = self.batch_size[0]
        mask = [True] * n
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict.get("_reset").reshape(n, -1).any(-1).tolist()
        if not all(m or s for m, s in zip(mask, self._started)):
            raise RuntimeError("partial reset of a TextEnv whose envs were never all reset")
        options = self._reset_options(tensordict)
        for b in range(n):
            if not mask[b]:
                continue  # keeps its current data (torchrl merges by the '_reset' mask)
            seed, self._pending_seeds[b] = self._pending_seeds[b], None
            obs, info = self.envs[b].reset(seed=seed, options=options[b])
            self._messages[b] = []
            self._tools[b] = None
            self._record(b, obs, info, None)
            self._flags[b] = (False, False)
            self._started[b] = True
        return self._batch_td([0.0] * n).exclude("reward")

    def _reset_proc_data(
        self, tensordict: TensorDictBase | None, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        """Merge the reset output into the input tensordict.

        TorchRL's default merges a partial reset with ``TensorDict.where(~_reset, ...)``, which
        cannot combine conversations of different lengths (ragged ``History`` / token stacks).
        :meth:`_reset` already returns the current data of the envs it did not reset, so each
        top-level entry is replaced wholesale instead. Overrides a private hook of
        ``torchrl.envs.EnvBase`` (torchrl 0.14).
        """
        self._complete_done(self.full_done_spec, tensordict_reset)
        self._reset_check_done(tensordict, tensordict_reset)
        if tensordict is None:
            return tensordict_reset
        for key in self.reset_keys:
            tensordict.pop(key, None)
        for key, value in tensordict_reset.items():
            tensordict.set(key, value)
        return tensordict

    # ------------------------------------------------------------------- step
    def _actions(self, tensordict: TensorDictBase) -> list:
        n = self.batch_size[0]
        if "action" in tensordict.keys():
            action = tensordict.get("action")
        elif ("text", "response") in tensordict.keys(True):
            action = tensordict.get(("text", "response"))
        elif ("history", "response") in tensordict.keys(True):
            hist = tensordict.get(("history", "response"))
            return [h[-1].content for h in hist.unbind(0)]
        else:
            raise KeyError(
                "TextEnv.step needs an 'action' entry (text or assistant message per env), or "
                "a ('text', 'response') / ('history', 'response') entry from a TorchRL LLM "
                "wrapper"
            )
        if isinstance(action, NonTensorStack):
            action = action.tolist()
        elif isinstance(action, NonTensorData):
            action = [action.data] * n
        elif isinstance(action, (str, dict)):
            action = [action] * n
        action = list(action)
        if len(action) != n:
            raise ValueError(f"got {len(action)} actions for {n} envs")
        return action

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not all(self._started):
            raise RuntimeError("TextEnv.step() called before reset()")
        actions = self._actions(tensordict)
        rewards = [0.0] * len(actions)
        for b, action in enumerate(actions):
            if any(self._flags[b]):
                continue  # finished episode: repeat its last observation, reward 0, done
            obs, reward, terminated, truncated, info = self.envs[b].step(action)
            if isinstance(action, str):
                action_msg = {"role": "assistant", "content": action}
            elif isinstance(action, dict):
                action_msg = {"role": "assistant", **action}
            else:
                action_msg = None
            self._record(b, obs, info, action_msg)
            self._flags[b] = (bool(terminated), bool(truncated))
            rewards[b] = float(reward)
        return self._batch_td(rewards)

    def _set_seed(self, seed: int | None) -> None:
        n = self.batch_size[0]
        self._pending_seeds = [None if seed is None else int(seed) + b for b in range(n)]
        for b, env in enumerate(self.envs):
            env.action_space.seed(None if seed is None else int(seed) + b)

    def close(self, *, raise_if_closed: bool = True) -> None:
        for env in getattr(self, "envs", []):
            env.close()
        super().close(raise_if_closed=raise_if_closed)


def make_torchrl_env(
    env_id: str,
    batch_size: int = 1,
    *,
    tokenizer: Any | None = None,
    template_kwargs: dict | None = None,
    device: torch.device | str | None = None,
    **env_kwargs: Any,
) -> TextEnv:
    """Build ``batch_size`` copies of a registered Gymnasium id as one :class:`TextEnv`.

    Example::

        env = make_torchrl_env("GSM8K-v0", batch_size=64, split="test", tokenizer=tok)
        td = env.reset()
        td["action"] = NonTensorStack(*["#### 42"] * 64)
        td = env.step(td)        # td["next", "reward"]: [64, 1]

    Args:
        env_id: a Gymnasium id registered by ``envs`` (``"GSM8K-v0"``, ``"tau2/airline-v0"``, …).
        batch_size: number of envs ``B``.
        tokenizer, template_kwargs, device: see :class:`TextEnv`.
        **env_kwargs: forwarded to every ``gymnasium.make(env_id, ...)``.

    Raises:
        gymnasium.error.Error: unknown id.
    """
    import envs as _envs  # registers the ids

    gym.register_envs(_envs)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # Passive checker off: observations are chat messages, not numpy data. Other wrappers
    # (e.g. a registered TimeLimit) are kept.
    built = [
        gym.make(env_id, disable_env_checker=True, **env_kwargs) for _ in range(int(batch_size))
    ]
    return TextEnv(built, tokenizer=tokenizer, template_kwargs=template_kwargs, device=device)
