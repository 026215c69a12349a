"""TRL glue: the envs of this package inside ``trl.GRPOTrainer`` (TRL 1.16, extra ``[trl]``).

Three entry points, none of which imports TRL (``datasets`` is imported lazily by :func:`dataset`)::

    from trl import GRPOConfig, GRPOTrainer
    from envs.trl import dataset, environment_factory, reward_function

    # multi-turn tool use (tau2): one env instance per rollout, its tools as methods
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=dataset("tau2/retail-v0", "train"),
                          environment_factory=environment_factory("tau2/retail-v0", split="train"))
    # one-turn envs (GSM8K-v1, IFEval-v0, ReasoningGym-v1, ...): the env's own grader as a reward function
    trainer = GRPOTrainer(model, reward_funcs=reward_function("GSM8K-v1", split="train"),
                          train_dataset=dataset("GSM8K-v1", "train"), args=GRPOConfig(...))

What TRL 1.16 does with an ``environment_factory`` (read from ``trl/trainer/grpo_trainer.py``): it calls the
factory with no argument, once at start-up to probe it and then whenever a batch needs more instances (instances
are pooled and reused across batches); every public *function* of the class other than ``reset`` and
``get_reward`` is a tool, its JSON schema made by ``transformers.utils.get_json_schema`` from the type hints and
the Google-style docstring; before generation it calls ``reset(**row)`` with every column of the dataset row
(``prompt`` included) and appends the returned string to the content of the prompt's last message; a tool call
runs ``method(**arguments)`` and the return value, ``str()``-ed, is the tool message (an exception becomes
``{"error": str(e)}``); the episode ends when the model answers without a tool call, after
``max_tool_calling_iterations`` tool rounds, or at ``max_completion_length``; then ``get_reward()`` is called
once per rollout and logged as ``rewards/<class name>/mean``.

:func:`environment_factory` (env ids with tools, i.e. the tau2 domains) builds such a class over
``gym.make(env_id, **make_kwargs)``:

* one method per tool of the env's OpenAI schemas (``info["tools"]``, ``done`` included), with typed parameters
  (JSON types -> ``str``/``int``/``float``/``bool``/``list``/``dict``, enums -> ``Literal``, optional ones default
  to the schema's default or ``None``) and an ``Args:`` docstring; a parameter whose type the hints cannot carry
  (nested objects, ``anyOf``, ``$ref``) has its full JSON schema (``$defs`` resolved) in its description. A call
  is passed to ``env.step`` as an assistant message with that one tool call and *all* the keyword arguments the
  model wrote, so the env's own validation answers bad ones (strict pydantic, unknown keys rejected);
  the method returns the env's tool message, so an ``"Error: ..."`` answer (``info["action_error"]``) reaches the
  model as the tool's reply, exactly the text our own collector shows it, and never raises;
* ``send_message_to_user(content)`` where the env has a customer (its opening observation has a ``user``
  message): TRL ends an episode on a plain reply, so talking to the customer must be a tool; it returns the
  customer's answer;
* ``reset(**row)`` resets the env on the row's ``task_id`` (or ``index``) and returns the customer's opening
  message (``None`` in solo mode, where the prompt already holds everything); it raises ``ValueError`` when the
  row's prompt does not match the env's opening (a dataset built for another split or configuration);
* ``get_reward()`` ends the episode if it has not ended (a ``done`` call: tau2's agent stop) and returns the env's
  final reward (tau2's evaluator, :mod:`envs.tau2.rewards`).

Public attributes (not functions, so not tools): ``env`` (the Gymnasium env), ``actions`` (the env actions of
the episode, in order: replaying them through ``gym.make`` gives the same reward), ``info`` (the last ``info``),
``reward`` (``None`` until the episode ends), ``ended``.

:func:`dataset` gives the rows TRL needs for any registered id; :func:`reward_function` scores one-turn envs with
their own grader in TRL's ``reward_funcs`` signature.

Where a TRL episode differs from ours, and why (see also README, "Use these envs from TRL / TorchRL / OpenEnv"):

1. The model's final plain reply is not seen by the env: TRL's ``get_reward`` takes no argument. An unfinished
   episode is ended by ``get_reward`` with a ``done`` call, as tau2's agent stop (in our env a plain text in solo
   mode is an ``agent_error`` and, with a customer, a message the customer answers). Anything the customer must
   hear (tau2's ``communicate_info``) has to go through ``send_message_to_user``.
2. A tool call that comes after the env's episode ended (``done``, the customer hung up, ``max_steps``,
   ``max_errors``) is answered ``"Error: the episode has ended (...)"`` and changes nothing; our collector stops
   the episode at that point instead.
3. TRL's own limits cut an episode without the env knowing (``max_tool_calling_iterations``,
   ``max_completion_length``); ``get_reward`` then scores it as an agent stop, where our collector scores a cut
   episode as truncated (reward 0, tau2's ``max_steps``).
4. The customer's own tool calls (telecom's dual control with an LLM customer) run inside
   ``send_message_to_user``; the model sees only the customer's text, as in our env.
"""
from __future__ import annotations

import copy
import inspect
import json
import keyword
import re
from typing import Any, Callable, Literal, Optional, Union

import gymnasium as gym

import envs as _envs

__all__ = ["TRLToolEnv", "dataset", "environment_factory", "reward_function", "SEND_MESSAGE_TOOL"]

gym.register_envs(_envs)

#: Name of the tool that talks to the customer (offered only where the env has one).
SEND_MESSAGE_TOOL = "send_message_to_user"
#: Names a domain tool may not take (TRL reserves them, or they would shadow our own members).
_RESERVED = frozenset({"reset", "get_reward", SEND_MESSAGE_TOOL, "env", "actions", "info", "reward", "ended"})
_PRIMITIVE = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict,
              "null": type(None)}


def _make(env_id: str, make_kwargs: dict) -> gym.Env:
    return gym.make(env_id, disable_env_checker=True, **make_kwargs)


def _offline(make_kwargs: dict) -> dict:
    """``make_kwargs`` for a probe or a dataset, which must not call an LLM customer: ``user="llm"`` becomes
    ``"scripted"`` (tau2: same system prompt, greeting and tools; the customer's opening line, the only part that
    differs, is left to ``reset``)."""
    return {**make_kwargs, "user": "scripted"} if make_kwargs.get("user") == "llm" else dict(make_kwargs)


def _probe(env: gym.Env) -> tuple[list[dict], dict]:
    """Reset ``env`` on its first usable task: ``(obs, info)`` (the opening, and the tool schemas in ``info``)."""
    usable = env.unwrapped.usable_task_indices(1)
    if not usable:
        raise ValueError(f"{env.spec.id if env.spec else env}: no task this env can play as configured")
    return env.reset(options={"index": usable[0]})


# ---------------------------------------------------------------------------------------------------------------
# OpenAI tool schema -> a Python method TRL (transformers.get_json_schema) turns back into a schema
# ---------------------------------------------------------------------------------------------------------------
def _resolve_refs(schema: Any, defs: dict, depth: int = 0) -> Any:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``defs["X"]`` (depth-bounded: tool schemas are
    ours, but a recursive ``$defs`` must not recurse forever)."""
    if depth > 20:
        return schema
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            return _resolve_refs(defs[ref[8:]], defs, depth + 1)
        return {k: _resolve_refs(v, defs, depth + 1) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_resolve_refs(v, defs, depth + 1) for v in schema]
    return schema


def _hint(prop: dict) -> tuple[Any, bool]:
    """Python type hint for a JSON-schema property, and whether the hint carries the whole schema."""
    if "enum" in prop and all(isinstance(v, (str, int, float, bool)) for v in prop["enum"]) and prop["enum"]:
        return Literal[tuple(prop["enum"])], True
    if "anyOf" in prop:
        subs = [_hint(s)[0] for s in prop["anyOf"] if isinstance(s, dict)]
        subs = list(dict.fromkeys(subs)) or [Any]
        return (subs[0] if len(subs) == 1 else Union[tuple(subs)]), False
    t = prop.get("type")
    if isinstance(t, list):
        subs = list(dict.fromkeys(_PRIMITIVE.get(x, Any) for x in t))
        return (subs[0] if len(subs) == 1 else Union[tuple(subs)]), True
    if t == "array":
        items = prop.get("items")
        if not items:
            return list, True
        simple = isinstance(items, dict) and items.get("type") in ("string", "integer", "number", "boolean") \
            and set(items) <= {"type", "description", "title"}
        return (list[_PRIMITIVE[items["type"]]], True) if simple else (list, False)
    if t == "object":
        return dict, not prop.get("properties") and prop.get("additionalProperties", True) in (True, {})
    if t in _PRIMITIVE:
        return _PRIMITIVE[t], True
    return Any, False


def _one_line(text: Any) -> str:
    """Collapse whitespace: ``get_json_schema`` splits ``Args:`` entries on newlines followed by ``word:``."""
    return re.sub(r"\s+", " ", str(text or "")).strip()


def _tool_method(schema: dict) -> tuple[str, Callable]:
    """``(name, function)`` for one OpenAI tool schema; the function forwards ``**kwargs`` to ``self._call_tool``.

    ``__signature__``/``__annotations__``/``__doc__`` are set so that ``transformers.utils.get_json_schema`` gives
    back the tool's name, description, parameters (types, required ones, enums) and their descriptions.

    Raises:
        ValueError: a name that is not a Python identifier, or one :data:`_RESERVED`.
    """
    fn_schema = schema.get("function", schema)
    name = fn_schema["name"]
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in _RESERVED:
        raise ValueError(f"tool name {name!r} cannot be a TRL tool method (not an identifier, private or reserved)")
    params = fn_schema.get("parameters") or {}
    defs = params.get("$defs") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    sig_required, sig_optional, arg_docs, annotations = [], [], [], {}
    for pname, raw in props.items():
        if not pname.isidentifier() or keyword.iskeyword(pname) or pname == "self":
            raise ValueError(f"tool {name!r}: parameter {pname!r} is not a Python identifier")
        prop = _resolve_refs(raw, defs)
        hint, complete = _hint(prop)
        desc = _one_line(prop.get("description") or prop.get("title") or pname)
        if not complete:
            shown = {k: v for k, v in prop.items() if k not in ("description", "title")}
            desc += " JSON schema: " + json.dumps(shown, separators=(",", ":"), sort_keys=True)
        if pname in required:
            sig_required.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=hint))
        else:
            default = prop.get("default")
            if default is None:
                hint = Optional[hint]
            sig_optional.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=hint, default=default))
        annotations[pname] = hint
        arg_docs.append(f"    {pname}: {desc}")

    def tool(self, **kwargs):
        return self._call_tool(name, kwargs)

    description = _one_line(fn_schema.get("description") or name)
    doc = description + ("\n\nArgs:\n" + "\n".join(arg_docs) if arg_docs else "")
    doc += "\n\nReturns:\n    The environment's answer."
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = doc
    annotations["return"] = str
    tool.__annotations__ = annotations
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    tool.__signature__ = inspect.Signature([self_param, *sig_required, *sig_optional], return_annotation=str)
    return name, tool


# ---------------------------------------------------------------------------------------------------------------
# the environment class TRL instantiates
# ---------------------------------------------------------------------------------------------------------------
class TRLToolEnv:
    """Base of the classes :func:`environment_factory` returns (see the module docstring); not used alone.

    Subclasses set ``_env_id``, ``_make_kwargs`` and ``_has_user`` and add one method per tool. Only ``reset`` and
    ``get_reward`` are public functions here: TRL makes every other public function a tool.
    """

    _env_id: str = ""
    _make_kwargs: dict = {}
    _has_user: bool = False

    def __init__(self):
        self.env = _make(self._env_id, self._make_kwargs)
        self.actions: list[dict] = []
        self.info: dict = {}
        self.reward: float | None = None
        self.ended = True
        self._started = False

    def reset(self, **row: Any) -> str | None:
        """Start the episode of a dataset row (TRL passes every column of the row).

        Args:
            row: ``task_id`` (tau2's id) or ``index`` (position in the split) picks the task; ``prompt`` (the
                row's prompt messages) is checked against the env's opening; other columns are ignored.

        Returns:
            The customer's opening message (TRL appends it to the prompt's last, empty, user message), or
            ``None`` when the env's opening has no customer message (solo mode).

        Raises:
            ValueError: no ``task_id``/``index`` in the row; a task the env rejects; a ``prompt`` that is not the
                env's opening (other split, configuration or env).
        """
        options = {k: row[k] for k in ("task_id", "index") if row.get(k) is not None}
        if "task_id" in options:
            options = {"task_id": str(options["task_id"])}
        elif "index" in options:
            options = {"index": int(options["index"])}
        else:
            raise ValueError("reset needs the row's 'task_id' or 'index' column (build rows with envs.trl.dataset)")
        try:
            obs, info = self.env.reset(options=options)
        except KeyError as e:  # the contract allows KeyError for an unknown task id; one error type for TRL users
            raise ValueError(str(e)) from e
        self.actions, self.info, self.reward, self.ended, self._started = [], info, None, False, True
        opening = obs[-1]["content"] if obs and obs[-1].get("role") == "user" else None
        prompt = row.get("prompt")
        if prompt is not None:
            expected = _row_prompt(obs, blank_last_user=True)
            if _comparable(prompt) != _comparable(expected):
                raise ValueError(
                    f"the row's prompt is not the opening of {self._env_id} task {info.get('task_id')!r} with "
                    f"{self._make_kwargs}: build the dataset with envs.trl.dataset(env_id, split, **make_kwargs) "
                    "using the same arguments as environment_factory"
                )
        return opening

    def get_reward(self) -> float:
        """The episode's reward from the env (tau2's evaluator); ends an unfinished episode with a ``done`` call.

        Returns:
            The env's final reward, in [0, 1].

        Raises:
            RuntimeError: before ``reset``.
        """
        if not self._started:
            raise RuntimeError("get_reward() before reset()")
        if not self.ended:
            self._step(copy.deepcopy(self.env.unwrapped.do_nothing_action))
        return float(self.reward)

    # -- internals (private: TRL would make any public function a tool) -----------------------------------------
    def _step(self, action: dict) -> list[dict]:
        self.actions.append(copy.deepcopy(action))
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.info = info
        if terminated or truncated:
            self.ended, self.reward = True, float(reward)
        return obs

    def _after_end_reply(self) -> str:
        return f"Error: the episode has ended ({self.info.get('termination_reason')}); answer without a tool call."

    def _call_tool(self, name: str, arguments: dict) -> str:
        if not self._started:
            raise RuntimeError(f"tool {name!r} called before reset()")
        if self.ended:
            return self._after_end_reply()
        call = {"id": f"trl_{len(self.actions)}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return self._reply(self._step({"role": "assistant", "content": None, "tool_calls": [call]}), "tool")

    def _send_message(self, content: str) -> str:
        if not self._started:
            raise RuntimeError("send_message_to_user called before reset()")
        if self.ended:
            return self._after_end_reply()
        if not isinstance(content, str):
            return f"Error: content must be a string, got {type(content).__name__}"
        return self._reply(self._step({"role": "assistant", "content": content}), "user")

    def _reply(self, obs: list[dict], role: str) -> str:
        """What the tool returns to the model: the ``role`` messages of ``obs`` (tool results or the customer's
        answer), else the env's ``action_error``, else whether the conversation ended."""
        replies = [m.get("content") or "" for m in obs if m.get("role") == role]
        if replies:
            return "\n".join(replies)
        if self.info.get("action_error"):
            return f"Error: {self.info['action_error']}"
        return "The conversation has ended." if self.ended else ""


def _send_message_to_user(self, content: str) -> str:
    """Send a message to the customer and wait for the answer.

    Args:
        content: The message to the customer.

    Returns:
        The customer's answer.
    """
    return self._send_message(content)


_send_message_to_user.__name__ = _send_message_to_user.__qualname__ = SEND_MESSAGE_TOOL


def _class_name(env_id: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", env_id)
    return "".join(p[:1].upper() + p[1:] for p in parts if p) + "Env"


def environment_factory(env_id: str, **make_kwargs: Any) -> type[TRLToolEnv]:
    """A class for ``GRPOTrainer(environment_factory=...)`` over ``gym.make(env_id, **make_kwargs)``.

    Args:
        env_id: a registered id whose env has tools (``tau2/{airline,retail,telecom,mock}-v0``).
        **make_kwargs: forwarded to every ``gym.make`` (``split``, ``user``, ``max_steps``, ``reward``, ...). The
            class is built from one probe env reset on the first usable task, never with an LLM customer
            (``user="llm"`` is probed as ``"scripted"``: same tools); its instances use ``make_kwargs`` as given.

    Returns:
        A no-argument class (see the module docstring): one method per tool, ``send_message_to_user`` where a
        customer is present, ``reset(**row)``, ``get_reward()``. Its name (TRL's reward column) is the id in
        CamelCase, e.g. ``Tau2MockV0Env``.

    Raises:
        ValueError: an env without tools (use :func:`reward_function`), a tool name that cannot be a method.
        gymnasium.error.Error: unknown id.
    """
    probe = _make(env_id, _offline(make_kwargs))
    try:
        obs, info = _probe(probe)
    finally:
        probe.close()
    tools = info.get("tools") or []
    if not tools:
        raise ValueError(f"{env_id} has no tools: a one-turn env is trained with reward_funcs=reward_function({env_id!r})")
    has_user = any(m.get("role") == "user" for m in obs)
    members: dict[str, Any] = {"_env_id": env_id, "_make_kwargs": dict(make_kwargs), "_has_user": has_user,
                               "__module__": __name__}
    for schema in tools:
        name, fn = _tool_method(schema)
        if name in members:
            raise ValueError(f"{env_id}: tool {name!r} listed twice")
        members[name] = fn
    if has_user:
        members[SEND_MESSAGE_TOOL] = _send_message_to_user
    cls = type(_class_name(env_id), (TRLToolEnv,), members)
    cls.__doc__ = (f"{env_id} ({make_kwargs or 'default arguments'}) as a TRL environment: "
                   f"{len(tools)} tools{', send_message_to_user' if has_user else ''} (envs.trl).")
    return cls


# ---------------------------------------------------------------------------------------------------------------
# dataset rows and one-turn reward functions
# ---------------------------------------------------------------------------------------------------------------
def _row_prompt(obs: list[dict], blank_last_user: bool) -> list[dict]:
    """The prompt messages of a row: the env's opening, the last user message's content left empty when
    ``blank_last_user`` (``reset`` returns it). Messages are kept as ``{"role", "content"}`` plus
    ``tool_calls``/``tool_call_id``/``name`` where present (JSON-encoded arguments, so Arrow can store them)."""
    out = []
    for m in obs:
        msg = {"role": m["role"], "content": m.get("content") or ""}
        for k in ("tool_call_id", "name"):
            if m.get(k) is not None:
                msg[k] = m[k]
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c.get("id", ""), "type": "function",
                 "function": {"name": c["function"]["name"],
                              "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                              else json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(msg)
    if blank_last_user and out and out[-1]["role"] == "user":
        out[-1]["content"] = ""
    return out


def _comparable(messages: Any) -> list:
    """Role and content of each message (Arrow adds ``None`` for keys other rows have; those are not compared)."""
    return [(m.get("role"), m.get("content") or "") for m in messages]


def dataset(env_id: str, split: str | None = None, *, limit: int | None = None, **make_kwargs: Any):
    """The rows TRL needs for ``env_id``, as a ``datasets.Dataset`` (``datasets`` is a TRL dependency).

    Columns: ``prompt`` (the env's opening messages, OpenAI format: for an env with tools the system prompt with
    the domain policy, any prior history and the greeting, with the customer's opening message left empty --
    :meth:`TRLToolEnv.reset` returns it; for a one-turn env the whole opening, question included), ``task_id``
    (``str``) and ``index`` (``int``).

    Args:
        env_id: any registered id.
        split: the split (``None``: the env's default).
        limit: only the first ``limit`` usable tasks (``None``: all).
        **make_kwargs: forwarded to ``gym.make`` (use the same as for :func:`environment_factory`); building
            the rows never calls an LLM customer (``user="llm"`` is built as ``"scripted"``: same prompts).

    Raises:
        ValueError: ``limit < 1``.
        gymnasium.error.Error: unknown id.
    """
    from datasets import Dataset

    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    kwargs = dict(make_kwargs)
    if split is not None:
        kwargs["split"] = split
    env = _make(env_id, _offline(kwargs))
    try:
        rows = []
        for i in env.unwrapped.usable_task_indices(limit):
            obs, info = env.reset(options={"index": i})
            tools = bool(info.get("tools"))
            rows.append({"prompt": _row_prompt(obs, blank_last_user=tools), "task_id": str(info["task_id"]),
                         "index": int(info["index"])})
    finally:
        env.close()
    return Dataset.from_list(rows)


def _completion_text(completion: Any) -> str:
    """The model's answer: a string completion, or the content of the last assistant message of a conversational
    one (TRL's ``completions`` entries)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for m in reversed(completion):
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant":
                content = m.get("content")
                if isinstance(content, list):  # content blocks
                    return "".join(b.get("text", "") for b in content if isinstance(b, dict))
                return content if isinstance(content, str) else ""
        return ""
    if isinstance(completion, dict):
        content = completion.get("content")
        return content if isinstance(content, str) else ""
    raise TypeError(f"a completion must be text or a list of messages, got {type(completion).__name__}")


def reward_function(env_id: str, **make_kwargs: Any) -> Callable[..., list[float]]:
    """A TRL reward function (``reward_funcs=``) scoring a one-turn env's completions with the env's own grader.

    For each completion: ``env.reset(options={"task_id": task_id})`` then ``env.step(text)``; the reward is
    ``env.step``'s. ``text`` is the completion (standard format) or the last assistant message's content
    (conversational format). The function's ``__name__`` (TRL's reward column) is the id.

    Signature (TRL 1.16): ``fn(prompts, completions, completion_ids=None, task_id=None, index=None, **kwargs)
    -> list[float]``; ``task_id`` / ``index`` are the dataset's columns (:func:`dataset`), one per completion.

    Args:
        env_id: a registered one-turn id (no tools): ``GSM8K-v1``, ``IFEval-v0``, ``ReasoningGym-v1``, ...
        **make_kwargs: forwarded to ``gym.make`` (``split`` must be the dataset's).

    Raises:
        ValueError: an env with tools (use :func:`environment_factory`); at call time, neither a ``task_id``
            nor an ``index`` column, or lengths that do not match.
    """
    env = _make(env_id, make_kwargs)
    _, info = _probe(env)
    if info.get("tools"):
        env.close()
        raise ValueError(f"{env_id} has tools: a multi-turn env is trained with environment_factory({env_id!r})")

    def reward(prompts=None, completions=None, completion_ids=None, task_id=None, index=None, **kwargs) -> list[float]:
        if completions is None:
            raise ValueError("reward function called without completions")
        keys = task_id if task_id is not None else index
        if keys is None:
            raise ValueError("the dataset needs a 'task_id' or 'index' column (build it with envs.trl.dataset)")
        if len(keys) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(keys)} task ids")
        out = []
        for key, completion in zip(keys, completions):
            option = {"task_id": str(key)} if task_id is not None else {"index": int(key)}
            env.reset(options=option)
            _, r, terminated, truncated, _ = env.step(_completion_text(completion))
            if not (terminated or truncated):
                raise RuntimeError(f"{env_id} did not end after one step: not a one-turn env")
            out.append(float(r))
        return out

    reward.__name__ = reward.__qualname__ = env_id
    reward.env = env
    return reward
