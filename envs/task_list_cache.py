"""A bounded, process-wide cache of the task lists the env families build (issue 42).

Building a split can cost seconds to minutes (reasoning-gym's ``intermediate_integration``: 32-36 s for 1,000
problems, each drawn through sympy), and a server (``python -m envs.serve``) builds an env on every stateless
``/reset`` / ``/step``, every ``POST /sessions`` and every new ``/ws``. The data builders therefore ask this cache
first, keyed by what determines the list (the family's name and the builder's arguments, e.g. reasoning-gym's
resolved task spec, split, seed and size; GSM8K's resolved file and split), so constructing an env again with the
same kwargs reuses the list built the first time:

* bounded: an LRU of at most :data:`MAX_ENTRIES` lists (16) over every family together; the least recently used
  list is dropped (built again when next asked for);
* built once: concurrent constructions with one key wait for the first build (one lock per key in flight); a build
  that raises caches nothing;
* read-only: a list is stored as a ``tuple`` (no caller can append, drop or replace an entry of another's list) and
  its items are shared between the envs built from it: envs never mutate them (they copy what they hand out:
  ``info`` values, the reasoning-gym entry given to its scorer); ``tests/test_task_list_cache.py`` plays tasks of
  every family and checks the cached items are unchanged. Episode state (the current task, the messages) lives on
  each env instance, never in the list: two sessions never see each other's state.

Used by :func:`envs.reasoning_gym.data.split_items`, :func:`envs.gsm8k.data.load_gsm8k`,
:func:`envs.ifeval.data.load_prompts` and :func:`envs.digit_sum.env.generate_numbers`. tau2 keeps its own caches
(:mod:`envs.tau2.tasks`: one parse per domain, one task set per (domain, split)): bounded by tau2's closed set of
domains and splits, and telecom's 14 MB task file must not be evicted and parsed again.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable

__all__ = ["MAX_ENTRIES", "TaskListCache", "TASK_LISTS", "cached_task_list"]

#: Most task lists kept (all families together). The largest is GSM8K's train split (7,473 problems, ~10 MB of
#: Python objects); a reasoning-gym split of 1,000 problems is ~1-3 MB.
MAX_ENTRIES = 16


class TaskListCache:
    """An LRU of built task lists (module docstring), thread-safe.

    Args:
        max_entries: most lists kept (>= 1).

    Attributes:
        builds: how many times a builder ran (a test counts them); ``hits``: how many lists were served from the
            cache.

    Raises:
        ValueError: ``max_entries`` < 1.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self.builds = 0
        self.hits = 0
        self._entries: OrderedDict[Hashable, tuple] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def _lookup(self, key: Hashable) -> tuple | None:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
            return None

    def get(self, key: Hashable, build: Callable[[], Iterable[Any]]) -> tuple:
        """The list of ``key``: the cached tuple, else ``tuple(build())``, kept (dropping the least recently used
        list beyond ``max_entries``).

        Raises:
            TypeError: an unhashable ``key``.
            Whatever ``build`` raises (nothing is cached then).
        """
        hash(key)
        found = self._lookup(key)
        if found is not None:
            return found
        with self._lock:
            key_lock = self._building.setdefault(key, threading.Lock())
        try:
            with key_lock:  # one build per key at a time: a second caller waits for the first one's list
                found = self._lookup(key)
                if found is not None:
                    return found
                value = tuple(build())
                with self._lock:
                    self.builds += 1
                    self._entries[key] = value
                    self._entries.move_to_end(key)
                    while len(self._entries) > self.max_entries:
                        self._entries.popitem(last=False)
                return value
        finally:
            with self._lock:
                if self._building.get(key) is key_lock and not key_lock.locked():
                    del self._building[key]

    def clear(self) -> None:
        """Drop every list (and reset the counters)."""
        with self._lock:
            self._entries.clear()
            self.builds = self.hits = 0


#: The process's cache, shared by every family's data builders.
TASK_LISTS = TaskListCache()


def cached_task_list(key: Hashable, build: Callable[[], Iterable[Any]]) -> tuple:
    """:meth:`TaskListCache.get` on :data:`TASK_LISTS`: the task list of ``key`` (a hashable tuple starting with the
    family's name), built by ``build()`` the first time (a ``tuple``: read-only, shared)."""
    return TASK_LISTS.get(key, build)
