"""Gymnasium spaces for chat-based text environments.

Observations of the text envs are lists of OpenAI-format chat messages, actions are either the
raw text a model produced or an assistant message dict. Neither fits a built-in space
(``gymnasium.spaces.Text`` restricts characters to a charset and cannot hold dicts; ``Sequence``
of ``Dict`` needs fixed keys and returns tuples), so two small :class:`gymnasium.spaces.Space`
subclasses describe them. Nothing here is specific to GSM8K.

Both are non-numpy spaces: ``shape`` is ``None`` and they cannot be flattened.

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
import multiprocessing as mp
import pickle
import string
import struct
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

__all__ = ["ChatMessages", "AssistantAction", "CHAT_ROLES", "SharedChatBatch", "SHARED_MEMORY_BYTES"]

#: Default shared-memory slot per env for one pickled :class:`ChatMessages` observation (bytes).
SHARED_MEMORY_BYTES = 1 << 20
_LEN = struct.Struct("<Q")  # slot header: byte length of the pickled observation (0 = nothing written yet)

#: Roles of the OpenAI chat format.
CHAT_ROLES = ("system", "user", "assistant", "tool")
_SAMPLE_CHARS = np.array(list(string.ascii_letters + string.digits + string.punctuation + " \n"))


def _random_text(rng: np.random.Generator, max_length: int) -> str:
    n = int(rng.integers(0, max_length + 1))
    return "".join(rng.choice(_SAMPLE_CHARS, size=n).tolist())


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
    :meth:`sample` draws random printable text.

    Args:
        max_sample_length: longest string produced by :meth:`sample` (characters).
        seed: seed of the sampler.
    """

    def __init__(self, max_sample_length: int = 256, seed: int | np.random.Generator | None = None):
        self.max_sample_length = int(max_sample_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """Random printable text of length ``0..max_sample_length`` (masks unsupported)."""
        if mask is not None or probability is not None:
            raise NotImplementedError("AssistantAction.sample does not support masks")
        return _random_text(self.np_random, self.max_sample_length)

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        if isinstance(x, dict):
            return _is_message({"role": "assistant", **x}, ("assistant",))
        return False

    def __repr__(self) -> str:
        return "AssistantAction()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AssistantAction)


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
