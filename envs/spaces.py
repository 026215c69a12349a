"""Gymnasium spaces for chat-based text environments.

Observations of the text envs are lists of OpenAI-format chat messages, actions are either the
raw text a model produced or an assistant message dict. Neither fits a built-in space
(``gymnasium.spaces.Text`` restricts characters to a charset and cannot hold dicts; ``Sequence``
of ``Dict`` needs fixed keys and returns tuples), so two small :class:`gymnasium.spaces.Space`
subclasses describe them. Nothing here is specific to GSM8K.

Both are non-numpy spaces: ``shape`` is ``None`` and they cannot be flattened. Gymnasium's
vector utilities batch them through their generic ``Space`` fallbacks (a ``Tuple`` of copies,
observations concatenated into a tuple), so ``SyncVectorEnv`` / ``gym.make_vec`` work.
"""
from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Space

__all__ = ["ChatMessages", "AssistantAction", "CHAT_ROLES"]

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
    """

    def __init__(
        self,
        roles: tuple[str, ...] = CHAT_ROLES,
        max_sample_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ):
        self.roles = tuple(roles)
        self.max_sample_length = int(max_sample_length)
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
