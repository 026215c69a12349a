"""TorchRL adapter for the chat-based Gymnasium envs of this package.

:class:`TextEnv` runs a batch of ``B`` Gymnasium text envs that follow the env contract of
``envs`` (observation: the list of new OpenAI-format chat messages; action: raw model text or an
assistant message dict; ``info["messages"]`` the whole conversation, optional ``info["tools"]``)
as one :class:`torchrl.envs.EnvBase` with ``batch_size=[B]``. Single-turn (GSM8K) and multi-turn
tool-using envs (tau2) go through the same code; :func:`make_torchrl_env` builds one from a
registered id.

Output of ``reset`` / ``step`` (``B`` batch size, ``T_b`` messages in conversation ``b``, ``L``
longest prompt in tokens; ``T_b`` is ragged, so ``History`` is lazily stacked):

===========================  =======================================  ===============================
key                          type, shape                              content
===========================  =======================================  ===============================
``"observation"``            NonTensor ``[B]``                        new messages since last step
``"messages"``               NonTensor ``[B]``                        whole conversation, OpenAI
                                                                      format (the lossless record)
``("history", "prompt")``    ``History [B, T_b]`` (role, content,     whole conversation as torchrl
                             is_complete)                             ``History``
``"tools"``                  NonTensor ``[B]``                        OpenAI tool schemas or None
``"info"``                   NonTensor ``[B]``                        env ``info`` minus messages,
                                                                      tools (answer, task_id, ...)
``("text", "prompt")``       NonTensor ``[B]`` (with tokenizer)       chat template + generation
                                                                      prompt
``("tokens", "prompt")``     int64 ``[B, L]`` (with tokenizer)        its token ids, left-padded
                                                                      with ``pad_token_id``
``"attention_mask"``         bool ``[B, L]`` (with tokenizer)         True on real prompt tokens
``"reward"``                 float32 ``[B, 1]``                       reward of the last step
``"done"`` / ``"terminated"`` / ``"truncated"``  bool ``[B, 1]``      Gymnasium flags, done = or
===========================  =======================================  ===============================

Input of ``step``: ``"action"``, NonTensor ``[B]`` of ``str`` or assistant message dicts. When it
is absent, the output of a TorchRL LLM wrapper is used: ``("text", "response")``, else the last
message of ``("history", "response")``, else ``("tokens", "response")`` decoded.

Input of ``reset`` (all optional): ``"_reset"`` bool ``[B, 1]`` (partial reset: only those envs
restart, the others keep their data), ``"options"`` NonTensor ``[B]`` of per-env Gymnasium
reset options (dict or None), ``"task_index"`` int ``[B]`` (``i >= 0`` means
``options={"index": i}``, negative means "draw one"). Auto-resets inside ``rollout`` /
``step_and_maybe_reset`` pass only ``"_reset"``: those envs draw their next task from their own
seeded RNG.

Conventions kept from TorchRL's LLM envs (``torchrl.envs.llm.ChatEnv``, torchrl 0.14): the
conversation is a :class:`~torchrl.modules.llm.policies.ChatHistory` under ``"history"`` with the
policy input in ``("history", "prompt")``; text in :class:`~torchrl.modules.llm.policies.Text`
``("text", "prompt")``; token ids in :class:`~torchrl.modules.llm.policies.Tokens`
``("tokens", "prompt")`` left-padded with the mask under ``"attention_mask"`` (the default
``attention_mask_key`` of ``TransformersWrapper``). Verified in the tests: a
``TransformersWrapper(input_mode="text")`` drives single- and multi-turn batches through
``rollout``; ``input_mode="history"`` works while all conversations in the batch have the same
length: torchrl 0.14's wrapper cannot extend ragged histories (``History.extend`` fails inside it
with ``zip() argument 2 is shorter than argument 1``), so :meth:`TextEnv.rollout` checks the lengths
before each call of such a policy and raises a ``ValueError`` naming them and the way out
(``input_mode="text"``); ``input_mode="tokens"`` is not supported (the wrapper re-derives the
padding by value and re-pads prompts in place).

Where we diverge from ``ChatEnv``, and why:

1. The Gymnasium env owns the conversation, the task and the reward (``ChatEnv`` is a blank
   canvas fed by a ``DataLoadingPrimer`` and scored by reward transforms such as
   ``GSM8KRewardParser``): tau2's tool execution, user simulator and evaluator live in the env.
2. The action is plain text (``"action"``), not the policy's ``("history", "full")``, so any
   generator (our rollout backends, a fixed policy) can drive it.
3. ``History`` holds role, content and is_complete only: OpenAI extras (``tool_calls``,
   ``tool_call_id``, ``name``) stay in ``"messages"``. A ``History`` with all five fields is ~3x
   slower to build and to clone in ``step_mdp`` (measured at ``B=64``).
4. Prompts are rendered with ``tokenizer.apply_chat_template`` on the OpenAI messages (with
   ``tools=``; tool-call arguments as objects, :func:`envs.chat_template.template_messages`),
   not ``History.apply_chat_template``, so tool schemas and tool calls reach the templates that
   support them, written once (not JSON-encoded twice by Qwen2.5-style templates).
5. Token ids are left-padded dense tensors, not the nested tensors of ``IncrementalTokenizer``:
   torchrl 0.14 cannot ``torch.stack`` nested tensors across time in ``rollout``, and ragged
   lazy stacks fail ``check_env_specs``.
6. A partial reset replaces each top-level entry instead of ``TensorDict.where`` (which cannot
   merge conversations of different lengths); see :meth:`TextEnv._reset_proc_data`.
7. These are re-rendered prompts: a collector that generates turn after turn should extend its
   own token ids (no decode / re-encode of earlier turns) and use ``"observation"`` for the new
   messages.
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
from tensordict.nn import TensorDictModuleBase
from torchrl.data import Bounded, Categorical, Composite, NonTensor, Unbounded
from torchrl.data.llm import History
from torchrl.envs import EnvBase
from torchrl.modules.llm.policies import ChatHistory, Text, Tokens

from envs.chat_template import template_messages
from envs.spaces import register_torchrl_conversions

__all__ = ["TextEnv", "make_torchrl_env", "check_history_policy_input"]

register_torchrl_conversions()  # torchrl.envs.GymEnv("GSM8K-v1") converts our spaces (envs.spaces)


def check_history_policy_input(td: TensorDictBase) -> None:
    """Refuse a batch that a TorchRL LLM wrapper with ``input_mode="history"`` cannot extend.

    torchrl 0.14's ``TransformersWrapper`` / ``vLLMWrapper`` in history mode extend ``("history",
    "prompt")`` with the response along the time dimension, which fails on a batch of conversations
    of different lengths with ``ValueError: zip() argument 2 is shorter than argument 1``.

    Raises:
        ValueError: the ``B`` conversations of ``td`` do not all have the same number of messages;
            the message gives the lengths and the alternatives.
    """
    if "messages" not in td.keys():
        return
    messages = td.get("messages")
    messages = messages.tolist() if isinstance(messages, NonTensorStack) else [messages.data]
    lengths = [len(m) for m in messages]
    if len(set(lengths)) > 1:
        raise ValueError(
            f"the conversations of this batch have different lengths ({lengths} messages): TorchRL's LLM "
            "wrappers with input_mode='history' (torchrl 0.14) cannot extend them (inside the wrapper: 'zip() "
            "argument 2 is shorter than argument 1'). Use input_mode='text' (TextEnv emits ('text', 'prompt') "
            "when given a tokenizer), or envs whose conversations stay the same length (e.g. batch_size=1)"
        )

def _to_history(messages: list[dict]) -> History:
    """``History`` of shape ``[T]`` (role, content, is_complete) from OpenAI messages.

    ``content=None`` becomes ``""``. ``tool_calls`` / ``tool_responses`` are left out (see the
    module docstring, divergence 3): the OpenAI messages keep them.
    """
    td = TensorDict(
        {
            "role": NonTensorStack.from_list([m.get("role", "user") for m in messages]),
            "content": NonTensorStack.from_list([m.get("content") or "" for m in messages]),
            "is_complete": NonTensorStack.from_list([True] * len(messages)),
        },
        batch_size=[len(messages)],
    )
    return History._from_tensordict(td)


def _history_spec(batch_size: torch.Size) -> Composite:
    """Spec of ``("history", "prompt")``: ``History [B, -1]`` with role, content, is_complete."""
    shape = batch_size + (-1,)
    return Composite(
        prompt=Composite(
            role=NonTensor(shape=shape, example_data="user"),
            content=NonTensor(shape=shape, example_data="hi"),
            is_complete=NonTensor(shape=shape, example_data=True),
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


def _left_pad(seqs: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D int64 tensors to ``[B, L_max]``; returns (ids, attention mask bool)."""
    length = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), length), dtype=torch.bool)
    for b, s in enumerate(seqs):
        if len(s):
            ids[b, length - len(s) :] = s
            mask[b, length - len(s) :] = True
    return ids, mask


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
        history: emit ``("history", "prompt")`` (default). ``False`` leaves it out, for a
            caller that keeps its own token ids and reads ``"observation"`` (building ``History``
            for every env on every step is the largest per-step cost of this adapter).
        runner: runs the per-env ``reset`` / ``step`` calls of one batch. It receives a list of
            zero-argument callables and returns, in order, each one's return value or the
            exception it raised. Default: in order, in this thread. A runner may run them
            concurrently, e.g. threads inside a scope that batches the model calls of simulated
            users (``torchrl_grpo.rollout.local_user.LocalUser``).
        catch_env_errors: ``False`` (default): an exception raised by an env's ``step`` propagates.
            ``True``: that env's episode ends there (``truncated``, reward 0, the observation
            unchanged) with ``info["error"]`` (type and message) and
            ``info["termination_reason"] = "env_error"``, and the other envs of the batch go on:
            one failing env does not end a training run. Exceptions at ``reset`` always propagate.

    Step semantics: an env whose episode has ended and that was not reset since is not stepped
    again; it repeats its last observation with ``reward=0`` and its done flags, so a caller can
    keep stepping the whole batch until every episode has ended. A partial step (TorchRL's
    ``"_step"`` entry, bool ``[B]``) steps only the envs where it is ``True``; the others repeat
    their last output the same way (their action entry is ignored). An action is passed to the
    Gymnasium env unchanged: by the env contract (:mod:`envs.contract`) unusable model text is
    answered (``info["action_error"]``), while an action that is neither text nor an assistant
    message dict raises ``TypeError`` (a caller's bug).

    Seeding: :meth:`set_seed` gives env ``b`` the seed ``seed + b`` on its next reset, as
    ``gymnasium.vector`` does.

    Raises:
        ValueError: empty ``envs``; a tokenizer without ``chat_template``; a malformed
            ``options``/``task_index`` entry at reset; a number of actions other than ``B``; an
            env that returns a non-list observation.
        KeyError: ``step`` without ``"action"`` nor an LLM wrapper's response entry.
        RuntimeError: ``step`` before ``reset``; a partial reset before the first full reset.
        TypeError: ``step`` with an action outside the envs' action space (from the env).
    """

    def __init__(
        self,
        envs: Sequence[gym.Env | Callable[[], gym.Env]],
        *,
        tokenizer: Any | None = None,
        template_kwargs: dict | None = None,
        device: torch.device | str | None = None,
        history: bool = True,
        runner: Callable[[list[Callable[[], Any]]], list[Any]] | None = None,
        catch_env_errors: bool = False,
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
        self.emit_history = bool(history)
        self.runner = runner or _run_in_order
        self.catch_env_errors = bool(catch_env_errors)
        self._pad_id = 0
        if tokenizer is not None:
            pad = tokenizer.pad_token_id
            self._pad_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))
        n = len(envs)
        self._messages: list[list[dict]] = [[] for _ in range(n)]
        self._observation: list[list[dict]] = [[] for _ in range(n)]
        self._tools: list[Any] = [None] * n
        self._tools_src: list[Any] = [None] * n  # the env's own tools object, to copy only when it changes
        self._info: list[dict] = [{} for _ in range(n)]
        self._flags: list[tuple[bool, bool]] = [(False, False)] * n  # (terminated, truncated)
        self._started = [False] * n
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
        }
        if self.emit_history:
            obs["history"] = _history_spec(bs)
        if self.tokenizer is not None:
            obs["text"] = Text.default_spec(shape=bs, keys=["prompt"])
            # torchrl's "tokens" input of LLM wrappers: prompt ids left-padded, plus the mask
            # under the wrappers' default ``attention_mask_key``.
            obs["tokens"] = Composite(
                prompt=Bounded(0, len(self.tokenizer), shape=bs + (-1,), dtype=torch.int64),
                padded=NonTensor(shape=bs, example_data=True),
                shape=bs,
                data_cls=Tokens,
                step_mdp_static=True,
            )
            obs["attention_mask"] = Categorical(2, shape=bs + (-1,), dtype=torch.bool)
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
                template_messages(self._messages[b]),
                tokenize=False,
                add_generation_prompt=True,
                **kwargs,
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._render_cache[b] = (text, torch.as_tensor(ids, dtype=torch.int64))
        return self._render_cache[b]

    def _batch_td(self, rewards: list[float]) -> TensorDict:
        """The ``[B]`` TensorDict that every reset and step returns (module docstring)."""
        n = self.batch_size[0]
        terminated = torch.tensor([t for t, _ in self._flags], dtype=torch.bool).unsqueeze(-1)
        truncated = torch.tensor([t for _, t in self._flags], dtype=torch.bool).unsqueeze(-1)
        td = TensorDict(
            {
                # copied once when recorded (_record), then shared by every output until the env changes
                "observation": _non_tensor_stack(list(self._observation)),
                "messages": _non_tensor_stack(list(self._messages)),
                "tools": _non_tensor_stack(list(self._tools)),
                "info": _non_tensor_stack(list(self._info)),
                "reward": torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
            batch_size=self.batch_size,
        )
        if self.emit_history:
            td["history"] = ChatHistory(
                prompt=lazy_stack([_to_history(m) for m in self._messages]), batch_size=self.batch_size
            )
        if self.tokenizer is not None:
            rendered = [self._render(b) for b in range(n)]
            td["text"] = Text(
                prompt=_non_tensor_stack([t for t, _ in rendered]), batch_size=self.batch_size
            )
            ids, mask = _left_pad([i for _, i in rendered], self._pad_id)
            td["tokens"] = Tokens(prompt=ids, padded=True, batch_size=self.batch_size)
            td["attention_mask"] = mask
        return td if self.device is None else td.to(self.device)

    def _record(self, b: int, obs: Any, info: dict, action_msg: dict | None) -> None:
        """Store what env ``b`` returned; invalidate its cached rendering."""
        if not isinstance(obs, list):
            raise ValueError(
                f"env {b} ({type(self.envs[b]).__name__}) returned a {type(obs).__name__} "
                "observation; TextEnv expects a list of chat messages"
            )
        info = dict(info)
        messages = info.pop("messages", None)
        if messages is None:  # env does not report the conversation: accumulate it
            messages = self._messages[b] + ([action_msg] if action_msg else []) + list(obs)
        # Own copies, made once per change: outputs share them (step after step, the envs that did not change
        # return the same objects), and nothing the env does later to its own lists reaches an output. Messages
        # are copied one level deep (the list and each message dict): envs append messages, never edit old ones.
        self._observation[b] = [dict(m) if isinstance(m, dict) else m for m in obs]
        self._messages[b] = [dict(m) if isinstance(m, dict) else m for m in messages]
        if "tools" in info:  # latest report wins; envs may report tools at reset only
            tools = info.pop("tools")
            if tools is not self._tools_src[b]:
                self._tools_src[b], self._tools[b] = tools, copy.deepcopy(tools)
        self._info[b] = info
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
        todo = [b for b in range(n) if mask[b]]  # the others: current data returned unchanged
        seeds = {}
        for b in todo:
            seeds[b], self._pending_seeds[b] = self._pending_seeds[b], None
        results = self.runner(
            [lambda b=b: self.envs[b].reset(seed=seeds[b], options=options[b]) for b in todo]
        )
        for res in results:
            if isinstance(res, BaseException):
                raise res
        for b, (obs, info) in zip(todo, results):
            self._messages[b] = []
            self._tools[b] = self._tools_src[b] = None
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
        elif ("tokens", "response") in tensordict.keys(True) and self.tokenizer is not None:
            ids = tensordict.get(("tokens", "response"), as_list=True)
            return self.tokenizer.batch_decode(
                [torch.as_tensor(i).tolist() for i in ids], skip_special_tokens=True
            )
        else:
            raise KeyError(
                "TextEnv.step needs an 'action' entry (text or assistant message per env), or "
                "a ('text', 'response') / ('history', 'response') / ('tokens', 'response') "
                "entry from a TorchRL LLM wrapper"
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
        n = len(actions)
        stepped = [True] * n
        if "_step" in tensordict.keys():  # TorchRL partial step
            stepped = tensordict.get("_step").reshape(n, -1).any(-1).tolist()
        # finished episodes and envs left out of a partial step repeat their last output, reward 0
        todo = [b for b in range(n) if stepped[b] and not any(self._flags[b])]
        for b in todo:  # a caller's bug, never recorded as an env failure (envs.contract)
            if not isinstance(actions[b], (str, dict)):
                raise TypeError(
                    f"env {b}: action must be text or an assistant message dict, got "
                    f"{type(actions[b]).__name__}"
                )
        results = self.runner([lambda b=b: self.envs[b].step(actions[b]) for b in todo])
        rewards = [0.0] * n
        for b, res in zip(todo, results):
            action = actions[b]
            if isinstance(res, BaseException):
                if not self.catch_env_errors or not isinstance(res, Exception):
                    raise res
                self._info[b] = {
                    **self._info[b],
                    "error": f"{type(res).__name__}: {res}",
                    "termination_reason": "env_error",
                }
                self._observation[b] = []
                self._flags[b] = (False, True)
                continue
            obs, reward, terminated, truncated, info = res
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

    def rollout(self, max_steps: int, policy: Callable | None = None, *args, **kwargs):
        """``EnvBase.rollout``; a TorchRL LLM wrapper with ``input_mode="history"`` as ``policy`` is called only on
        batches it can extend (:func:`check_history_policy_input`: conversations of equal length).

        Raises:
            ValueError: a history-mode wrapper met conversations of different lengths.
        """
        if policy is not None and getattr(policy, "input_mode", None) == "history":
            policy = _HistoryChecked(policy)
        return super().rollout(max_steps, policy, *args, **kwargs)

    def _set_seed(self, seed: int | None) -> None:
        """Env ``b`` resets next with seed ``seed + b`` (as ``gymnasium.vector``)."""
        n = self.batch_size[0]
        self._pending_seeds = [None if seed is None else int(seed) + b for b in range(n)]
        for b, env in enumerate(self.envs):
            env.action_space.seed(None if seed is None else int(seed) + b)

    def close(self, *, raise_if_closed: bool = True) -> None:
        for env in getattr(self, "envs", []):
            env.close()
        super().close(raise_if_closed=raise_if_closed)


class _HistoryChecked(TensorDictModuleBase):
    """A history-mode LLM wrapper, called only after :func:`check_history_policy_input` (same keys)."""

    def __init__(self, policy: Callable):
        super().__init__()
        self.policy = policy
        self.in_keys = list(getattr(policy, "in_keys", []))
        self.out_keys = list(getattr(policy, "out_keys", []))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        check_history_policy_input(tensordict)
        return self.policy(tensordict)


def _run_in_order(fns: list[Callable[[], Any]]) -> list[Any]:
    """Default :class:`TextEnv` runner: call each in order; an exception is returned, not raised."""
    out: list[Any] = []
    for fn in fns:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed back to TextEnv, which raises or records it
            out.append(exc)
    return out


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

        env = make_torchrl_env("GSM8K-v1", batch_size=64, split="test", tokenizer=tok)
        td = env.reset()
        td["action"] = NonTensorStack(*["#### 42"] * 64)
        td = env.step(td)        # td["next", "reward"]: [64, 1]

    Args:
        env_id: a Gymnasium id registered by ``envs`` (``"GSM8K-v1"``, ``"tau2/airline-v0"``, …).
        batch_size: number of envs ``B``.
        tokenizer, template_kwargs, device: see :class:`TextEnv`.
        **env_kwargs: forwarded to every ``gymnasium.make(env_id, ...)``.

    Raises:
        ValueError: ``batch_size < 1``.
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
