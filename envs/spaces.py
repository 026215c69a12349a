"""Gymnasium spaces for chat-based text environments.

Observations of the text envs are lists of OpenAI-format chat messages, actions are either the
raw text a model produced or an assistant message dict. Neither fits a built-in space
(``gymnasium.spaces.Text`` restricts characters to a charset and cannot hold dicts; ``Sequence``
of ``Dict`` needs fixed keys and returns tuples), so two small :class:`gymnasium.spaces.Space`
subclasses describe them. Nothing here is specific to GSM8K.

Both are non-numpy spaces: ``shape`` is ``None`` and they cannot be flattened.

TorchRL: ``torchrl.envs.GymEnv("GSM8K-v1")`` converts both to ``NonTensor`` specs
(:func:`register_torchrl_conversions`, run when a space is built while TorchRL is loaded; nothing here
imports TorchRL). ``GymEnv`` gives one env with the observation as non-tensor data and no ``info``; the
batched adapter with rendered prompts, tokens, tools and partial resets is :func:`envs.adapters.torchrl_env.make_torchrl_env`.

Vector envs (``gym.make_vec(id, num_envs, vectorization_mode="sync" | "async")``): Gymnasium's
vector utilities (:mod:`gymnasium.vector.utils`) batch these spaces into per-env tuples --

* ``batch_space``: a ``Tuple`` of ``num_envs`` independently seeded copies (Gymnasium's generic
  fallback for custom spaces), so a batched observation / action is a ``tuple`` with one
  conversation / text per env; ``iterate`` and ``concatenate`` go through that tuple;
* ``create_empty_array`` (registered here): ``num_envs`` empty members (``[]`` / ``""``);
* shared memory (registered here for :class:`ChatMessages`, used by ``AsyncVectorEnv``'s default
  ``shared_memory=True``): one fixed slot of ``shared_memory_bytes`` (default
  :data:`SHARED_MEMORY_BYTES`, 1 MiB) per env holding the pickled observation;
  ``read_from_shared_memory`` gives a live :class:`SharedChatBatch` view that ``AsyncVectorEnv``
  deep-copies into a plain ``tuple`` before returning it (its default ``copy=True``). An observation
  over the slot raises ``ValueError`` in the worker; pass
  ``vector_kwargs={"shared_memory": False}`` (observations then travel through the pipes, any size).
"""
from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import pickle
import string
import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector.utils import (
    create_empty_array,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

__all__ = [
    "ChatMessages", "AssistantAction", "CHAT_ROLES", "SharedChatBatch", "SHARED_MEMORY_BYTES", "SAMPLE_MESSAGES",
    "sample_json", "register_torchrl_conversions",
]

#: Default shared-memory slot per env for one pickled :class:`ChatMessages` observation (bytes).
SHARED_MEMORY_BYTES = 1 << 20
_LEN = struct.Struct("<Q")  # slot header: byte length of the pickled observation (0 = nothing written yet)

#: Roles of the OpenAI chat format.
CHAT_ROLES = ("system", "user", "assistant", "tool")
_SAMPLE_CHARS = np.array(list(string.ascii_letters + string.digits + string.punctuation + " \n"))


def _random_text(rng: np.random.Generator, max_length: int) -> str:
    n = int(rng.integers(0, max_length + 1))
    return "".join(rng.choice(_SAMPLE_CHARS, size=n).tolist())


#: Plain assistant messages :meth:`AssistantAction.sample` draws from (``{n}``: a random integer 0..99): valid
#: actions of every env here (tau2: a message to the user; GSM8K / Reasoning Gym: an answer that is graded).
SAMPLE_MESSAGES = ("OK.", "Could you tell me more?", "I cannot help with that.", "The answer is {n}.\n#### {n}")
_WORDS = ("alpha", "bravo", "1234", "HAT001", "2024-05-01", "user_1", "blue", "yes")
_MAX_SCHEMA_DEPTH = 8  # nested $ref / arrays / objects deeper than this get the smallest value of their type


def sample_json(schema: dict, rng: np.random.Generator, defs: dict | None = None, _depth: int = 0) -> Any:
    """A random value valid under a JSON schema (the subset OpenAI tool schemas use).

    Handles ``$ref`` into ``$defs`` / ``definitions``, ``enum``, ``const``, ``anyOf`` / ``oneOf`` (one branch),
    ``allOf`` (the first), ``type`` (one name or a list) ``string`` / ``integer`` / ``number`` (``minimum`` /
    ``maximum`` honoured, default 0..99) / ``boolean`` / ``null`` / ``array`` (``items``, 0..2 of them, at least
    ``minItems``) / ``object`` (every ``required`` property, each optional one with probability 1/2). A schema
    without ``type`` gives a string. Recursion stops at depth 8 (empty array / object beyond it).

    Args:
        schema: the JSON schema (a dict; ``True`` / ``{}`` accept anything: a string is returned).
        rng: the generator to draw from.
        defs: ``$defs`` to resolve ``$ref`` against (default: the schema's own).

    Raises:
        ValueError: a ``$ref`` that does not resolve in ``defs``.
    """
    if not isinstance(schema, dict):
        return str(rng.choice(_WORDS))
    defs = {**(defs or {}), **schema.get("$defs", {}), **schema.get("definitions", {})}
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        if name not in defs:
            raise ValueError(f"unresolved $ref {schema['$ref']!r} in a tool schema")
        return sample_json(defs[name], rng, defs, _depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            options = [o for o in schema[key] if not (isinstance(o, dict) and o.get("type") == "null")] or schema[key]
            return sample_json(options[int(rng.integers(len(options)))], rng, defs, _depth + 1)
    if schema.get("allOf"):
        return sample_json(schema["allOf"][0], rng, defs, _depth + 1)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = kinds[int(rng.integers(len(kinds)))]
    deep = _depth >= _MAX_SCHEMA_DEPTH
    if kind == "integer":
        lo = int(schema.get("minimum", 0))
        return int(rng.integers(lo, int(schema.get("maximum", max(lo, 99))) + 1))
    if kind == "number":
        lo = float(schema.get("minimum", 0.0))
        return float(rng.uniform(lo, float(schema.get("maximum", max(lo, 99.0)))))
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "null":
        return None
    if kind == "array":
        n = int(schema.get("minItems", 0)) if deep else max(int(schema.get("minItems", 0)), int(rng.integers(0, 3)))
        return [sample_json(schema.get("items", {}), rng, defs, _depth + 1) for _ in range(n)]
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return {k: sample_json(v, rng, defs, _depth + 1) for k, v in props.items()
                if k in required or (not deep and rng.integers(2))}
    return str(rng.choice(_WORDS))


def _is_message(x: Any, roles: tuple[str, ...]) -> bool:
    if not isinstance(x, dict) or x.get("role") not in roles:
        return False
    content = x.get("content")
    if content is not None and not isinstance(content, str):
        return False
    tool_calls = x.get("tool_calls")
    return tool_calls is None or isinstance(tool_calls, list)


class ChatMessages(Space[list]):
    """A list of chat messages ``[{"role": ..., "content": ..., ...}, ...]``.

    A member is a ``list`` (possibly empty) of dicts whose ``role`` is one of ``roles`` and whose
    ``content`` is a ``str`` or ``None``; ``tool_calls`` (if present) is a list. Other keys
    (``tool_call_id``, ``name``) are allowed.

    Args:
        roles: accepted roles, default :data:`CHAT_ROLES`.
        max_sample_length: longest ``content`` produced by :meth:`sample` (characters).
        seed: seed of the sampler.
        shared_memory_bytes: size of the per-env shared-memory slot of an ``AsyncVectorEnv`` with
            ``shared_memory=True`` (bytes of the pickled observation; see the module docstring).
    """

    def __init__(
        self,
        roles: tuple[str, ...] = CHAT_ROLES,
        max_sample_length: int = 64,
        seed: int | np.random.Generator | None = None,
        shared_memory_bytes: int = SHARED_MEMORY_BYTES,
    ):
        self.roles = tuple(roles)
        self.max_sample_length = int(max_sample_length)
        self.shared_memory_bytes = int(shared_memory_bytes)
        if self.shared_memory_bytes <= 0:
            raise ValueError(f"shared_memory_bytes must be > 0, got {shared_memory_bytes}")
        super().__init__(shape=None, dtype=None, seed=seed)
        register_torchrl_conversions()

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> list[dict]:
        """A random conversation of 1–3 messages with random text (``mask`` is not supported)."""
        if mask is not None or probability is not None:
            raise NotImplementedError("ChatMessages.sample does not support masks")
        n = int(self.np_random.integers(1, 4))
        return [
            {
                "role": str(self.np_random.choice(self.roles)),
                "content": _random_text(self.np_random, self.max_sample_length),
            }
            for _ in range(n)
        ]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(_is_message(m, self.roles) for m in x)

    def to_jsonable(self, sample_n):
        return [list(s) for s in sample_n]

    def from_jsonable(self, sample_n):
        return [list(s) for s in sample_n]

    def __repr__(self) -> str:
        return f"ChatMessages(roles={self.roles})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ChatMessages) and other.roles == self.roles


class AssistantAction(Space[Any]):
    """The policy's turn: the raw text a model produced, or an assistant message dict.

    Members: any ``str`` (no charset restriction), or a dict with ``role`` absent or
    ``"assistant"``, ``content`` a ``str``/``None`` and optional ``tool_calls`` list.

    :meth:`sample` draws a valid action of the env: without ``tools``, one of :data:`SAMPLE_MESSAGES`
    (a plain message: an answer with a number for the single-turn envs, a message to the user for
    tau2); with ``tools`` (OpenAI tool schemas), a tool call of a uniformly chosen tool with
    arguments valid under its schema (:func:`sample_json`), or (one chance in ``len(tools) + 1``) one
    of those messages.

    Args:
        tools: OpenAI tool schemas (``[{"type": "function", "function": {"name", "parameters"}}]``)
            the env executes, or None.
        max_sample_length: kept for compatibility; samples are no longer random text (characters).
        seed: seed of the sampler.

    Raises:
        ValueError: a tool schema without ``function.name``.
    """

    def __init__(self, tools: Sequence[dict] | None = None, max_sample_length: int = 256,
                 seed: int | np.random.Generator | None = None):
        self.max_sample_length = int(max_sample_length)
        self.tools = [dict(t) for t in tools or []]
        for t in self.tools:
            if not isinstance(t.get("function"), dict) or not t["function"].get("name"):
                raise ValueError(f"tool schema without function.name: {t!r:.200}")
        super().__init__(shape=None, dtype=None, seed=seed)
        register_torchrl_conversions()

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str | dict:
        """A valid action (class docstring): a message ``str``, or an assistant message dict
        ``{"role": "assistant", "content": None, "tool_calls": [{"id", "type": "function",
        "function": {"name", "arguments": <JSON string>}}]}`` (masks unsupported)."""
        if mask is not None or probability is not None:
            raise NotImplementedError("AssistantAction.sample does not support masks")
        rng = self.np_random
        pick = int(rng.integers(len(self.tools) + 1))
        if pick == len(self.tools):
            text = SAMPLE_MESSAGES[int(rng.integers(len(SAMPLE_MESSAGES)))]
            return text.format(n=int(rng.integers(100)))
        fn = self.tools[pick]["function"]
        args = sample_json(fn.get("parameters") or {"type": "object"}, rng)
        call = {"id": f"call_{int(rng.integers(1 << 32)):08x}", "type": "function",
                "function": {"name": fn["name"], "arguments": json.dumps(args)}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        if isinstance(x, dict):
            return _is_message({"role": "assistant", **x}, ("assistant",))
        return False

    def __repr__(self) -> str:
        return f"AssistantAction(tools={[t['function']['name'] for t in self.tools]})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AssistantAction) and other.tools == self.tools


# ----------------------------------------------------------------------------- TorchRL's GymEnv
def register_torchrl_conversions() -> bool:
    """Register :class:`ChatMessages` and :class:`AssistantAction` with TorchRL's gym space conversion
    (``torchrl.envs.libs.gym.register_gym_spec_conversion``), both as ``NonTensor`` specs, so that
    ``torchrl.envs.GymEnv("GSM8K-v1")`` builds (without it: ``KeyError: No conversion tool could be found with the
    gym space``). Runs only when TorchRL's gym module is already imported (this module never imports TorchRL: the
    envs stay usable without torch); every space's constructor calls it, and ``GymEnv`` builds the env, hence its
    spaces, before converting them. Idempotent.

    Returns:
        True when the conversions are registered (now or before), False when TorchRL is not loaded.
    """
    libs_gym = sys.modules.get("torchrl.envs.libs.gym")
    if libs_gym is None or not hasattr(libs_gym, "register_gym_spec_conversion"):
        return False
    registry = getattr(libs_gym, "_conversion_registry", None)
    if registry is not None and ChatMessages in registry.keys() and AssistantAction in registry.keys():
        return True
    from torchrl.data import NonTensor

    @libs_gym.register_gym_spec_conversion(ChatMessages)
    def _chat_messages_spec(spec, dtype=None, device=None, **kwargs):
        return NonTensor((), device=device, example_data=[{"role": "user", "content": "hi"}])

    @libs_gym.register_gym_spec_conversion(AssistantAction)
    def _assistant_action_spec(spec, dtype=None, device=None, **kwargs):
        return NonTensor((), device=device, example_data="#### 0")

    return True


# ----------------------------------------------------------------------------- vector-env support
class SharedChatBatch(Sequence):
    """Live read-only view of ``n`` :class:`ChatMessages` observations in an ``AsyncVectorEnv``'s
    shared memory (what ``read_from_shared_memory`` returns).

    Indexing unpickles slot ``i`` at the time of access (``[]`` before anything was written), so
    the view follows the workers' writes. ``copy.deepcopy`` and pickling give a plain ``tuple`` of
    the current observations (``AsyncVectorEnv(copy=True)``, the default, hands out that tuple);
    equality compares the current values with any sequence.
    """

    def __init__(self, shared_memory, n: int, slot_bytes: int):
        self._buf = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
        self._n, self._slot = int(n), int(slot_bytes)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._n)))
        if not -self._n <= i < self._n:
            raise IndexError(f"env index {i} out of range for {self._n} envs")
        start = (i % self._n) * (self._slot + _LEN.size)
        (length,) = _LEN.unpack_from(self._buf, start)
        if length == 0:
            return []
        return pickle.loads(self._buf[start + _LEN.size : start + _LEN.size + length].tobytes())

    def __deepcopy__(self, memo) -> tuple:
        return tuple(self)

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"SharedChatBatch({tuple(self)!r})"


@create_shared_memory.register(ChatMessages)
def _create_chat_shared_memory(space: ChatMessages, n: int = 1, ctx=mp):
    """``n`` slots of ``8 + space.shared_memory_bytes`` bytes: a length header and a pickled observation."""
    return ctx.Array(ctypes.c_uint8, n * (_LEN.size + space.shared_memory_bytes))


@read_from_shared_memory.register(ChatMessages)
def _read_chat_from_shared_memory(space: ChatMessages, shared_memory, n: int = 1) -> SharedChatBatch:
    return SharedChatBatch(shared_memory, n, space.shared_memory_bytes)


@write_to_shared_memory.register(ChatMessages)
def _write_chat_to_shared_memory(space: ChatMessages, index: int, value: list, shared_memory) -> None:
    """Write env ``index``'s observation into its slot.

    Raises:
        ValueError: the pickled observation is larger than ``space.shared_memory_bytes``.
    """
    data = pickle.dumps(list(value), protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > space.shared_memory_bytes:
        raise ValueError(
            f"observation of env {index} is {len(data)} bytes pickled, over the {space.shared_memory_bytes}-byte "
            "shared-memory slot of ChatMessages(shared_memory_bytes=...); make the vector env with "
            'vector_kwargs={"shared_memory": False} (observations then go through the pipes, any size)'
        )
    buf = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
    start = index * (_LEN.size + space.shared_memory_bytes)
    buf[start + _LEN.size : start + _LEN.size + len(data)] = np.frombuffer(data, dtype=np.uint8)
    _LEN.pack_into(buf, start, len(data))  # header last: a reader never sees a length without its bytes


@create_empty_array.register(ChatMessages)
def _create_empty_chat_array(space: ChatMessages, n: int = 1, fn=np.zeros) -> tuple:
    return tuple([] for _ in range(n))


@create_empty_array.register(AssistantAction)
def _create_empty_action_array(space: AssistantAction, n: int = 1, fn=np.zeros) -> tuple:
    return tuple("" for _ in range(n))
