"""TRL glue: the envs of this package inside ``trl.GRPOTrainer`` (TRL 1.16, extra ``[trl]``).

Three entry points, none of which imports TRL (``datasets`` is imported lazily by :func:`dataset`, ``websockets``
by :class:`RemoteEnv`)::

    from trl import GRPOConfig, GRPOTrainer
    from envs.adapters.trl_env import dataset, environment_factory, reward_function

    # multi-turn tool use (tau2): one env instance per rollout, its tools as methods
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=dataset("tau2/retail-v0", "train"),
                          environment_factory=environment_factory("tau2/retail-v0", split="train"))
    # one-turn envs (GSM8K-v1, IFEval-v0, ReasoningGym-v1, ...): the env's own grader as a reward function
    trainer = GRPOTrainer(model, reward_funcs=reward_function("GSM8K-v1", split="train"),
                          train_dataset=dataset("GSM8K-v1", "train"), args=GRPOConfig(...))

TRL's advanced modes (TRL 1.16; tests: ``tests/test_trl_async.py``, ``tests/test_trl_env.py``)::

    environment_factory("tau2/retail-v0", asynchronous=True)   # async tools / get_reward (Tau2RetailV0AsyncEnv)
    environment_factory(url="http://host:8000")                 # over ``python -m envs.serve tau2/retail-v0``
    mix = multi_environment({"airline": "tau2/airline-v0", "chain_sum": ("ReasoningGym-v1", {"task": "chain_sum"})})
    GRPOTrainer(model, args=..., **mix._asdict())               # dict environment_factory + `environment` column

* pickling: a factory class pickles as the call that makes it (:class:`_FactoryClass`; one class per arguments and
  process), reward functions are :class:`EnvReward` objects: TRL's async rollout worker spawns a process and
  pickles both;
* ``asynchronous=True``: ``async def`` tools, ``send_message_to_user`` and ``get_reward`` (the env step runs in a
  worker thread). TRL 1.16's ``GRPOTrainer`` awaits them one rollout at a time (no overlap across the batch);
  ``trl.experimental.async_grpo``'s rollout worker runs all in-flight rollouts concurrently (sync tools too, in its
  thread pool). ``reset`` stays synchronous: TRL calls it so;
* multi-environment: :func:`dataset` ``environment=`` adds the column TRL routes on; :func:`multi_environment` builds
  the classes (one-turn envs as :class:`TRLOneTurnEnv`, scored by an :class:`EnvReward` restricted to their rows),
  rows and reward functions;
* a served env: :class:`RemoteEnv` (:mod:`envs.adapters.remote_env`) is one WebSocket session of
  ``python -m envs.serve`` with Gymnasium's ``reset``/``step``; ``environment_factory(url=...)`` builds the same
  class over it. The server is another party: its replies, redirects and tool schemas are bounded
  (:class:`ClientBounds`: 8 MiB per reply after decompression, JSON 64 deep and 100,000 arrays/objects, 50,000
  expanded schema nodes and 1 MiB of expanded schema text, no redirect to another origin; ``bounds=`` changes
  them) and a breach raises
  :class:`RemoteBoundError` naming the bound.

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
  message and the env is not tau2 solo, whose ``solo_ticket="user"`` ticket is a user message no one answers; a
  served env is judged by its opening alone): TRL ends an episode on a plain reply, so talking to the customer must
  be a tool; it returns the customer's answer;
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

import asyncio
import copy
import copyreg
import inspect
import json
import keyword
import re
import threading
from typing import Any, Callable, Literal, NamedTuple, Optional, Union

import gymnasium as gym

import envs as _envs
from envs.adapters.remote_env import ClientBounds, RemoteBoundError, RemoteEnv, RemoteEnvError

__all__ = ["ClientBounds", "EnvReward", "MultiEnvironment", "RemoteBoundError", "RemoteEnv", "RemoteEnvError",
           "TRLOneTurnEnv", "TRLToolEnv", "dataset", "gold_tool_call_texts",
           "environment_factory", "multi_environment", "reward_function", "SEND_MESSAGE_TOOL"]

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
def _text_size(text: str) -> int:
    """Bytes of ``json.dumps(text)`` (quotes included, ``ensure_ascii`` as ``json.dumps`` writes by default): a quote
    or backslash is 2 bytes, a control or non-ASCII character 6 (``\\u00e9``), one outside the BMP 12. Printable ASCII
    is counted without building the text (the common case); other text is encoded once (C, linear; at most 12 bytes
    per character, and the budget is charged at least as much, so the encoding done before a refusal is bounded)."""
    if text.isascii() and text.isprintable():
        return len(text) + 2 + text.count('"') + text.count("\\")
    return len(json.dumps(text))


def _json_size(value: Any) -> int:
    """Bytes of compact JSON text ``value``'s own node takes (its children are paid for as nodes of their own): a
    string its JSON text (:func:`_text_size`: escapes included), a key its JSON text + 2 (colon, comma), an integer
    its decimal digits (bounded from its bits), a list 2 + a comma per item; as ``json.dumps`` writes the schema into
    the method's docstring (and a chat template into every prompt). Counting characters instead let a schema of
    control or non-ASCII characters write up to 12x the bound (issue 49 audit)."""
    if isinstance(value, str):
        return _text_size(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, dict):
        return 2 + sum(_text_size(k) + 2 if isinstance(k, str) else 24 for k in value)
    if isinstance(value, (list, tuple)):
        return 2 + len(value)
    return 24  # a float (repr at most 24 characters), or anything else a local env put there


class _SchemaBudget:
    """What :func:`_resolve_refs` may still build, for all the tools of a class together (a hostile server's schemas
    could otherwise each stay just under a per-tool bound): ``max_nodes`` nodes (objects, arrays, scalars) and
    ``max_bytes`` bytes of JSON text (:func:`_json_size` of every node), both counted at every copy a ``$ref``
    makes: a ``$ref`` reuses one object, so a 2 MiB string in a ``$defs`` entry that refers to itself twice costs
    a node per copy but 2 MiB per copy once written into the method's docstring (issue 49: 128 copies, 1.07 GB)."""

    def __init__(self, max_nodes: int, max_bytes: int):
        self.max_nodes, self.max_bytes = max_nodes, max_bytes
        self.nodes_left, self.bytes_left = max_nodes, max_bytes

    def spend(self, value: Any) -> None:
        """Pay for one node of the expanded schemas.

        Raises:
            RemoteBoundError: ``bound`` ``"max_schema_nodes"`` or ``"max_schema_bytes"``.
        """
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise RemoteBoundError("max_schema_nodes", f"the tool schemas expand ($defs resolved) to more than "
                                                       f"{self.max_nodes} nodes")
        self.spend_bytes(_json_size(value))

    def spend_bytes(self, n: int) -> None:
        """Pay ``n`` bytes of text (a tool's own description, which is not a node of its parameters' schemas).

        Raises:
            RemoteBoundError: ``bound`` ``"max_schema_bytes"``.
        """
        self.bytes_left -= n
        if self.bytes_left < 0:
            raise RemoteBoundError("max_schema_bytes", f"the tool schemas expand ($defs resolved) to more than "
                                                       f"{self.max_bytes} bytes of JSON text (every copy counted)")

    def spend_subtree(self, value: Any) -> None:
        """Pay for every node of ``value`` as it is (no ``$ref`` resolved), without recursion."""
        stack = [value]
        while stack:
            v = stack.pop()
            self.spend(v)
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)


def _resolve_refs(schema: Any, defs: dict, budget: _SchemaBudget, depth: int = 0) -> Any:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``defs["X"]``: nesting past 20 is left as is
    (a recursive ``$defs`` must not recurse forever) and every node of the result, the part left as is included, is
    paid from ``budget`` in nodes and bytes (a ``$defs`` that references itself k times per level expands as
    k**depth: 12 per level grew to 2.1 GB, issue 42; a large string in it is copied as often, issue 49).

    Raises:
        RemoteBoundError: ``bound`` ``"max_schema_nodes"`` or ``"max_schema_bytes"``: the budget ran out.
    """
    if depth > 20:
        budget.spend_subtree(schema)
        return schema
    budget.spend(schema)
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            return _resolve_refs(defs[ref[8:]], defs, budget, depth + 1)
        return {k: _resolve_refs(v, defs, budget, depth + 1) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_resolve_refs(v, defs, budget, depth + 1) for v in schema]
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


def _tool_method(schema: dict, asynchronous: bool = False,
                 budget: _SchemaBudget | None = None) -> tuple[str, Callable]:
    """``(name, function)`` for one OpenAI tool schema; the function forwards ``**kwargs`` to ``self._call_tool``
    (``asynchronous``: an ``async def`` that runs it in a worker thread, ``asyncio.to_thread``); ``$defs`` are
    expanded within ``budget`` (default: :class:`ClientBounds`' ``max_schema_nodes`` and ``max_schema_bytes``),
    which also pays for the tool's own description.

    ``__signature__``/``__annotations__``/``__doc__`` are set so that ``transformers.utils.get_json_schema`` gives
    back the tool's name, description, parameters (types, required ones, enums) and their descriptions.

    Raises:
        ValueError: a name that is not a Python identifier, or one :data:`_RESERVED`.
        RemoteBoundError: the expanded schemas outgrow ``budget`` (``bound`` ``"max_schema_nodes"`` or
            ``"max_schema_bytes"``).
    """
    if budget is None:
        budget = _SchemaBudget(ClientBounds().max_schema_nodes, ClientBounds().max_schema_bytes)
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
            raise ValueError(f"tool {name!r}: parameter {pname!r:.100} is not a Python identifier")
        budget.spend_bytes(_text_size(pname) + 2)  # the parameter's name (not a node of its schema)
        prop = _resolve_refs(raw, defs, budget)
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

    if asynchronous:
        async def tool(self, **kwargs):
            return await asyncio.to_thread(self._call_tool, name, kwargs)
    else:
        def tool(self, **kwargs):
            return self._call_tool(name, kwargs)

    description = _one_line(fn_schema.get("description") or name)
    budget.spend_bytes(_text_size(description) + _text_size(name))
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
# pickling: a factory-made class travels as the call that makes it
# ---------------------------------------------------------------------------------------------------------------
class _FactoryClass(type):
    """Metaclass of the classes this module makes. A class made by :func:`environment_factory` (or for a one-turn
    env by :func:`multi_environment`) pickles as the call that makes it (its ``_recipe``): TRL's asynchronous
    rollout worker spawns a process and pickles the factory. Unpickling in a process that has the class already
    gives that same class (one class per recipe and process), so TRL's ``type(env) is cls`` reward routing holds.
    A subclass written in a module (no ``_recipe`` of its own) pickles by reference, as any class."""


def _reduce_class(cls: type) -> Any:
    recipe = cls.__dict__.get("_recipe")
    if recipe is None:
        return cls.__qualname__  # pickle's global lookup, <module>.<qualname>
    return _rebuild, recipe


copyreg.pickle(_FactoryClass, _reduce_class)
_CLASSES: dict[str, type] = {}
_CLASSES_LOCK = threading.Lock()


def _recipe_key(recipe: tuple) -> str:
    return json.dumps(recipe, sort_keys=True, default=repr)


def _rebuild(kind: str, env_id: str | None, url: str | None, asynchronous: bool, make_kwargs: dict,
             bounds: ClientBounds | None = None) -> type:
    """The class of a pickled recipe (see :class:`_FactoryClass`)."""
    if kind == "one_turn":
        return _one_turn_class(env_id, make_kwargs)
    return environment_factory(env_id, url=url, asynchronous=asynchronous, bounds=bounds, **make_kwargs)


# ---------------------------------------------------------------------------------------------------------------
# the environment class TRL instantiates
# ---------------------------------------------------------------------------------------------------------------
#: tau2's agent stop (:data:`envs.tau2.env.DO_NOTHING_ACTION`): how ``get_reward`` ends an unfinished episode.
_DONE_CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "done", "arguments": {}}}]}


class TRLToolEnv(metaclass=_FactoryClass):
    """Base of the classes :func:`environment_factory` returns (see the module docstring); not used alone.

    Subclasses set ``_env_id``, ``_url`` (a served env), ``_make_kwargs``, ``_has_user`` and ``_do_nothing_action``
    and add one method per tool. Only ``reset`` and ``get_reward`` are public functions here: TRL makes every other
    public function a tool.
    """

    _env_id: str = ""
    _url: str | None = None
    _bounds: ClientBounds | None = None
    _make_kwargs: dict = {}
    _has_user: bool = False
    _do_nothing_action: dict = _DONE_CALL

    def __init__(self):
        self.env = RemoteEnv(self._url, bounds=self._bounds) if self._url else _make(self._env_id, self._make_kwargs)
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
            raise ValueError("reset needs the row's 'task_id' or 'index' column (build rows with envs.adapters.trl_env.dataset)")
        try:
            obs, info = self.env.reset(options=options)
        except KeyError as e:  # the contract allows KeyError for an unknown task id; one error type for TRL users
            raise ValueError(str(e)) from e
        except RemoteEnvError as e:  # the server refused the task (its 400): the same ValueError
            if e.code == "VALIDATION_ERROR":
                raise ValueError(str(e)) from e
            raise
        self.actions, self.info, self.reward, self.ended, self._started = [], info, None, False, True
        opening = obs[-1]["content"] if obs and obs[-1].get("role") == "user" else None
        prompt = row.get("prompt")
        if prompt is not None:
            expected = _row_prompt(obs, blank_last_user=True)
            if _comparable(prompt) != _comparable(expected):
                raise ValueError(
                    f"the row's prompt is not the opening of {self._env_id} task {info.get('task_id')!r} with "
                    f"{self._make_kwargs}: build the dataset with envs.adapters.trl_env.dataset(env_id, split, **make_kwargs) "
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
            self._step(copy.deepcopy(self._do_nothing_action))
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


async def _send_message_to_user_async(self, content: str) -> str:
    return await asyncio.to_thread(self._send_message, content)


async def _get_reward_async(self) -> float:
    return await asyncio.to_thread(TRLToolEnv.get_reward, self)


for _f in (_send_message_to_user, _send_message_to_user_async):
    _f.__name__ = _f.__qualname__ = SEND_MESSAGE_TOOL
_send_message_to_user_async.__doc__ = _send_message_to_user.__doc__
_get_reward_async.__name__ = _get_reward_async.__qualname__ = "get_reward"
_get_reward_async.__doc__ = TRLToolEnv.get_reward.__doc__


def _class_name(env_id: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", env_id)
    return "".join(p[:1].upper() + p[1:] for p in parts if p) + "Env"


def environment_factory(env_id: str | None = None, *, url: str | None = None, asynchronous: bool = False,
                        bounds: ClientBounds | None = None, **make_kwargs: Any) -> type[TRLToolEnv]:
    """A class for ``GRPOTrainer(environment_factory=...)`` over ``gym.make(env_id, **make_kwargs)``, or over a
    served env (``url``).

    Args:
        env_id: a registered id whose env has tools (``tau2/{airline,retail,telecom,mock}-v0``). With ``url``: the
            id the server serves (checked), or ``None`` to take it from the server.
        url: a server started with ``python -m envs.serve <env_id> ...`` (``http://host:port`` or
            ``ws://host:port``): each instance opens one WebSocket session (one env on the server); the tools,
            their schemas, ``reset`` and ``get_reward`` are the same as a local class's, the rewards the server's
            env's. The server's ``--env-kwargs`` set split and customer; ``make_kwargs`` must be empty.
        asynchronous: tool methods, ``send_message_to_user`` and ``get_reward`` are ``async def`` (each runs the
            env step in a worker thread, ``asyncio.to_thread``; the env itself is synchronous). TRL 1.16 awaits
            them: ``GRPOTrainer`` gathers one rollout's calls at a time (rollouts still run one after another),
            the experimental async rollout worker (``trl.experimental.async_grpo``) runs every in-flight rollout's
            calls concurrently on its event loop (its sync tools go to a thread pool: also concurrent). ``reset``
            stays synchronous: TRL calls it so.
        bounds: what the class accepts from a server (:class:`~envs.adapters.remote_env.ClientBounds`; its
            ``max_schema_nodes`` and ``max_schema_bytes`` apply to a local env's schemas too). Defaults: replies
            at most 8 MiB after decompression, JSON at most 64 deep with at most 100,000 arrays/objects, the tool
            schemas at most 50,000 nodes and 1 MiB of JSON text once ``$defs`` are expanded (all tools together,
            every copy a ``$ref`` makes counted), no redirect to another origin.
        **make_kwargs: forwarded to every ``gym.make`` (``split``, ``user``, ``max_steps``, ``reward``, ...). The
            class is built from one probe env reset on the first usable task, never with an LLM customer
            (``user="llm"`` is probed as ``"scripted"``: same tools); its instances use ``make_kwargs`` as given.

    Returns:
        A no-argument class (see the module docstring): one method per tool, ``send_message_to_user`` where a
        customer is present, ``reset(**row)``, ``get_reward()``. Its name (TRL's reward column) is the id in
        CamelCase, e.g. ``Tau2MockV0Env`` (``Tau2MockV0AsyncEnv`` with ``asynchronous``, ``RemoteTau2MockV0Env``
        with ``url``). The class pickles (as this call; TRL's async worker needs it) and one
        call with the same arguments returns the same class.

    Raises:
        ValueError: an env without tools (use :func:`reward_function`), a tool name that cannot be a method;
            ``url`` with ``make_kwargs``, a malformed ``url``, or a server serving another id than ``env_id``.
        gymnasium.error.Error: unknown id.
        RemoteBoundError: the server's replies, redirect or tool schemas went past ``bounds`` (``bound`` names
            which; the message gives the value).
        RemoteEnvError, OSError: the server refused or could not be reached.
    """
    if url is None and env_id is None:
        raise ValueError("environment_factory needs an env id or a url")
    if url is not None and make_kwargs:
        raise ValueError(f"with url=..., the server's --env-kwargs configure the env; got make_kwargs {sorted(make_kwargs)}")
    bounds = bounds or ClientBounds()
    recipe = ("tool", env_id, url, bool(asynchronous), dict(make_kwargs), bounds)
    key = _recipe_key(recipe)
    with _CLASSES_LOCK:
        if key in _CLASSES:
            return _CLASSES[key]
    if url is not None:
        probe = RemoteEnv(url, bounds=bounds)
        try:
            obs, info = probe.reset(seed=0)
            served = probe.state().get("env_id")
        finally:
            probe.close()
        if env_id is not None and served != env_id:
            raise ValueError(f"the server at {url} serves {served!r}, not {env_id!r}")
        env_id, do_nothing, solo = served, _DONE_CALL, False
    else:
        probe = _make(env_id, _offline(make_kwargs))
        try:
            obs, info = _probe(probe)
            do_nothing = copy.deepcopy(probe.unwrapped.do_nothing_action)
            solo = bool(getattr(probe.unwrapped, "solo", False))  # tau2 solo_ticket="user": a ticket, no customer
        finally:
            probe.close()
    tools = info.get("tools") or []
    if not tools:
        raise ValueError(f"{env_id} has no tools: a one-turn env is trained with reward_funcs=reward_function({env_id!r})")
    # a customer to message: a user turn in the opening, unless the env is solo (its ticket may be a user message)
    has_user = not solo and any(m.get("role") == "user" for m in obs)
    members: dict[str, Any] = {"_env_id": env_id, "_url": url, "_make_kwargs": dict(make_kwargs), "_has_user": has_user,
                               "_do_nothing_action": do_nothing, "_recipe": recipe, "__module__": __name__,
                               "_bounds": bounds}
    budget = _SchemaBudget(bounds.max_schema_nodes, bounds.max_schema_bytes)
    for schema in tools:
        name, fn = _tool_method(schema, asynchronous, budget)
        if name in members:
            raise ValueError(f"{env_id}: tool {name!r} listed twice")
        members[name] = fn
    if has_user:
        members[SEND_MESSAGE_TOOL] = _send_message_to_user_async if asynchronous else _send_message_to_user
    if asynchronous:
        members["get_reward"] = _get_reward_async
    name = ("Remote" if url else "") + _class_name(env_id)
    if asynchronous:  # a reward column of its own (TRL names it after the class)
        name = name[:-3] + "AsyncEnv"
    cls = _FactoryClass(name, (TRLToolEnv,), members)
    where = f"served at {url}" if url else f"({make_kwargs or 'default arguments'})"
    cls.__doc__ = (f"{env_id} {where} as a TRL environment: {len(tools)} {'async ' if asynchronous else ''}tools"
                   f"{', send_message_to_user' if has_user else ''} (envs.adapters.trl_env).")
    with _CLASSES_LOCK:
        return _CLASSES.setdefault(key, cls)


class TRLOneTurnEnv(metaclass=_FactoryClass):
    """A one-turn env (GSM8K-v1, IFEval-v0, ReasoningGym-v1, ...) in TRL's multi-environment mode, made by
    :func:`multi_environment`: no tools and no ``get_reward`` (TRL's ``get_reward`` does not see the completion);
    the row's prompt already holds the question, so ``reset`` returns ``None``; the env's own grader scores the
    completion through an :class:`EnvReward` restricted to this environment's rows."""

    _env_id: str = ""
    _make_kwargs: dict = {}

    def reset(self, **row: Any) -> None:
        """Nothing to do: the row's prompt is the env's opening (question included). Returns ``None``."""
        return None


def _one_turn_class(env_id: str, make_kwargs: dict) -> type[TRLOneTurnEnv]:
    recipe = ("one_turn", env_id, None, False, dict(make_kwargs))
    key = _recipe_key(recipe)
    with _CLASSES_LOCK:
        if key not in _CLASSES:
            _CLASSES[key] = _FactoryClass(_class_name(env_id), (TRLOneTurnEnv,), {
                "_env_id": env_id, "_make_kwargs": dict(make_kwargs), "_recipe": recipe, "__module__": __name__,
                "__doc__": f"{env_id} ({make_kwargs or 'default arguments'}): a one-turn env for TRL's multi-environment mode."})
        return _CLASSES[key]


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


def dataset(env_id: str, split: str | None = None, *, limit: int | None = None, environment: str | None = None,
            **make_kwargs: Any):
    """The rows TRL needs for ``env_id``, as a ``datasets.Dataset`` (``datasets`` is a TRL dependency).

    Columns: ``prompt`` (the env's opening messages, OpenAI format: for an env with tools the system prompt with
    the domain policy, any prior history and the greeting, with the customer's opening message left empty --
    :meth:`TRLToolEnv.reset` returns it; for a one-turn env the whole opening, question included), ``task_id``
    (``str``) and ``index`` (``int``); with ``environment``, an ``environment`` column (``str``) holding it: the key
    of TRL's multi-environment mode (``environment_factory={name: cls, ...}``; :func:`multi_environment` builds
    the whole mix).

    Args:
        env_id: any registered id.
        split: the split (``None``: the env's default).
        limit: only the first ``limit`` usable tasks (``None``: all).
        environment: the name of this env in a multi-environment run (``None``: no ``environment`` column).
        **make_kwargs: forwarded to ``gym.make`` (use the same as for :func:`environment_factory`); building
            the rows never calls an LLM customer (``user="llm"`` is built as ``"scripted"``: same prompts).

    Raises:
        ValueError: ``limit < 1``; ``environment`` not a non-empty string.
        gymnasium.error.Error: unknown id.
    """
    from datasets import Dataset

    return Dataset.from_list(_rows(env_id, split, limit, environment, make_kwargs))



def gold_tool_call_texts(task, solo: bool) -> list[str]:
    """What a model would write to play a tau2 task's gold actions through the TRL tool loop: one Hermes
    ``<tool_call>`` text per gold tool call, the agent's words to the customer as a ``send_message_to_user`` call
    (not in solo mode), then a final plain answer ``"Done."`` (a scripted policy for tests and benchmarks).

    Args:
        task: a tau2 ``Task`` (``env.unwrapped.task``); solo: the env's solo mode.
    """
    from envs.tau2.oracle import oracle_actions  # here: importing envs.adapters.trl_env must not load tau2 for one-turn envs

    out = []
    for msg in oracle_actions(task, solo)[:-1]:
        for c in msg.get("tool_calls") or []:
            args = c["function"]["arguments"]
            args = json.loads(args) if isinstance(args, str) else args
            out.append("<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": args}) + "\n</tool_call>")
        if msg.get("content") and not solo:
            out.append("<tool_call>\n" + json.dumps({"name": SEND_MESSAGE_TOOL, "arguments": {"content": msg["content"]}})
                       + "\n</tool_call>")
    return out + ["Done."]

def _rows(env_id: str, split: str | None, limit: int | None, environment: str | None, make_kwargs: dict) -> list[dict]:
    if limit is not None and int(limit) < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    if environment is not None and not (isinstance(environment, str) and environment):
        raise ValueError(f"environment must be a non-empty string or None, got {environment!r:.80}")
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
            if environment is not None:
                rows[-1]["environment"] = environment
    finally:
        env.close()
    return rows


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


class EnvReward:
    """A TRL reward function (``reward_funcs=``) scoring a one-turn env's completions with the env's own grader; a
    picklable callable (TRL's async rollout worker pickles its reward functions). Made by :func:`reward_function`
    and :func:`multi_environment`.

    For each completion: ``env.reset(options={"task_id": task_id})`` then ``env.step(text)``; the reward is
    ``env.step``'s. ``text`` is the completion (standard format) or the last assistant message's content
    (conversational format). ``__name__`` (TRL's reward column) is the id, or ``environment`` when given.

    Call signature (TRL 1.16): ``fn(prompts, completions, completion_ids=None, task_id=None, index=None,
    environment=None, **kwargs) -> list[float | None]``; ``task_id`` / ``index`` / ``environment`` are the
    dataset's columns (:func:`dataset`), one per completion. With ``environment`` set, rows of another environment
    get ``None`` (TRL: not applicable; ignored in the sum).

    Args:
        env_id: a registered one-turn id (no tools): ``GSM8K-v1``, ``IFEval-v0``, ``ReasoningGym-v1``, ...
        environment: the name of this env in a multi-environment run (``None``: score every row).
        **make_kwargs: forwarded to ``gym.make`` (``split`` must be the dataset's).

    Raises:
        ValueError: an env with tools (use :func:`environment_factory`); at call time, neither a ``task_id``
            nor an ``index`` column, or lengths that do not match.
        RuntimeError: the env did not end after one step.
    """

    def __init__(self, env_id: str, *, environment: str | None = None, **make_kwargs: Any):
        self.env_id, self.environment, self.make_kwargs = env_id, environment, dict(make_kwargs)
        self.__name__ = self.__qualname__ = environment or env_id
        self._lock = threading.Lock()
        self._env = _make(env_id, make_kwargs)
        _, info = _probe(self._env)
        if info.get("tools"):
            self._env.close()
            raise ValueError(f"{env_id} has tools: a multi-turn env is trained with environment_factory({env_id!r})")

    @property
    def env(self) -> gym.Env:
        """The env that grades (made again after unpickling)."""
        if self._env is None:
            self._env = _make(self.env_id, self.make_kwargs)
        return self._env

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_env", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._env, self._lock = None, threading.Lock()

    def __call__(self, prompts=None, completions=None, completion_ids=None, task_id=None, index=None,
                 environment=None, **kwargs) -> list[float | None]:
        if completions is None:
            raise ValueError("reward function called without completions")
        keys = task_id if task_id is not None else index
        if keys is None:
            raise ValueError("the dataset needs a 'task_id' or 'index' column (build it with envs.adapters.trl_env.dataset)")
        if len(keys) != len(completions) or (environment is not None and len(environment) != len(completions)):
            raise ValueError(f"{len(completions)} completions but {len(keys)} task ids"
                             + (f" and {len(environment)} environment names" if environment is not None else ""))
        mine = [True] * len(completions)
        if self.environment is not None and environment is not None:
            mine = [e == self.environment for e in environment]
        out: list[float | None] = []
        with self._lock:
            env = self.env
            for key, completion, own in zip(keys, completions, mine):
                if not own:
                    out.append(None)
                    continue
                option = {"task_id": str(key)} if task_id is not None else {"index": int(key)}
                env.reset(options=option)
                _, r, terminated, truncated, _ = env.step(_completion_text(completion))
                if not (terminated or truncated):
                    raise RuntimeError(f"{self.env_id} did not end after one step: not a one-turn env")
                out.append(float(r))
        return out


def reward_function(env_id: str, **make_kwargs: Any) -> EnvReward:
    """A TRL reward function (``reward_funcs=``) scoring a one-turn env's completions with the env's own grader:
    ``EnvReward(env_id, **make_kwargs)`` (see :class:`EnvReward`: signature, rows, errors; it pickles).

    Args:
        env_id: a registered one-turn id (no tools): ``GSM8K-v1``, ``IFEval-v0``, ``ReasoningGym-v1``, ...
        **make_kwargs: forwarded to ``gym.make`` (``split`` must be the dataset's).

    Raises:
        ValueError: an env with tools (use :func:`environment_factory`).
    """
    return EnvReward(env_id, **make_kwargs)


# ---------------------------------------------------------------------------------------------------------------
# TRL's multi-environment mode
# ---------------------------------------------------------------------------------------------------------------
class MultiEnvironment(NamedTuple):
    """What ``GRPOTrainer(**mix._asdict())`` needs for a run over several envs (see :func:`multi_environment`)."""

    #: ``{name: class}``: tool envs' :func:`environment_factory` classes, one-turn envs' :class:`TRLOneTurnEnv`.
    environment_factory: dict
    #: rows of every env (:func:`dataset` columns plus ``environment``), interleaved env by env.
    train_dataset: Any
    #: one :class:`EnvReward` per one-turn env, each scoring only its own rows (tool envs own their reward).
    reward_funcs: list


def multi_environment(envs_by_name: dict[str, str | tuple[str, dict]], split: str | None = None, *,
                      limit: int | None = None, asynchronous: bool = False) -> MultiEnvironment:
    """Several envs in one TRL run (TRL 1.16's multi-environment mode: a ``dict`` ``environment_factory`` and an
    ``environment`` column; each prompt shows only its own env's tools)::

        mix = multi_environment({"airline": "tau2/airline-v0", "retail": "tau2/retail-v0",
                                 "telecom": "tau2/telecom-v0", "chain_sum": ("ReasoningGym-v1", {"task": "chain_sum"})},
                                split="train", limit=64)
        trainer = GRPOTrainer(model, args=GRPOConfig(...), **mix._asdict())

    Tool envs own their reward (``get_reward``, logged as ``rewards/<class name>/mean``); a one-turn env is a
    :class:`TRLOneTurnEnv` whose rows an :class:`EnvReward` named after the entry scores (``rewards/<name>/mean``).
    Every other column of a row gets ``None`` from the reward sources of other envs, which TRL ignores.

    Args:
        envs_by_name: ``{name: env_id}`` or ``{name: (env_id, make_kwargs)}``; at least one entry.
        split: the split of every env whose ``make_kwargs`` name none (``None``: each env's default).
        limit: at most ``limit`` rows per env (``None``: all usable tasks).
        asynchronous: async tool classes (see :func:`environment_factory`).

    Returns:
        :class:`MultiEnvironment` ``(environment_factory, train_dataset, reward_funcs)``; rows are interleaved
        (first row of each env, then the second, ...).

    Raises:
        ValueError: no entry, a name that is not a non-empty string, an entry that is not an id or
            ``(id, kwargs)``; as :func:`environment_factory`, :func:`dataset`.
    """
    from datasets import Dataset

    if not envs_by_name:
        raise ValueError("multi_environment needs at least one {name: env_id} entry")
    factories: dict[str, type] = {}
    reward_funcs: list = []
    per_env: list[list[dict]] = []
    for name, spec in envs_by_name.items():
        if not (isinstance(name, str) and name):
            raise ValueError(f"environment names must be non-empty strings, got {name!r:.80}")
        env_id, kwargs = (spec, {}) if isinstance(spec, str) else (tuple(spec) if isinstance(spec, (tuple, list)) else (None, None))
        if not isinstance(env_id, str) or not isinstance(kwargs, dict):
            raise ValueError(f"entry {name!r}: expected an env id or (env_id, make_kwargs), got {spec!r:.120}")
        kwargs = dict(kwargs)
        if split is not None:
            kwargs.setdefault("split", split)
        probe = _make(env_id, _offline(kwargs))
        try:
            has_tools = bool(_probe(probe)[1].get("tools"))
        finally:
            probe.close()
        if has_tools:
            factories[name] = environment_factory(env_id, asynchronous=asynchronous, **kwargs)
        else:
            factories[name] = _one_turn_class(env_id, kwargs)
            reward_funcs.append(EnvReward(env_id, environment=name, **kwargs))
        per_env.append(_rows(env_id, None, limit, name, kwargs))
    rows = [r for i in range(max(map(len, per_env))) for env_rows in per_env if i < len(env_rows) for r in [env_rows[i]]]
    return MultiEnvironment(factories, Dataset.from_list(rows), reward_funcs)
