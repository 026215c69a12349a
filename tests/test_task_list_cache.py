"""Built task lists are cached per (family, builder arguments), bounded, shared read-only (issue 42,
:mod:`envs.task_list_cache`).

A server builds an env on every stateless ``/reset`` / ``/step``, ``POST /sessions`` and new ``/ws``: with
``{"task": "intermediate_integration"}`` that rebuilt the split every time (32-36 s per 13-byte request). These tests
count the builder's work (reasoning-gym's per-item ``is_test_question``, the other families' builders) over two
constructions with the same kwargs, check other kwargs build their own list, the LRU bound, and that envs sharing a
list never change it nor see each other's episode.
"""
from __future__ import annotations

import copy
import threading
import time

import gymnasium as gym
import pytest

import envs
from envs import task_list_cache
from envs.reasoning_gym import data as rg_data
from envs.task_list_cache import MAX_ENTRIES, TaskListCache

gym.register_envs(envs)


@pytest.fixture
def cache(monkeypatch) -> TaskListCache:
    """A fresh process cache (the default bound) for the test."""
    fresh = TaskListCache()
    monkeypatch.setattr(task_list_cache, "TASK_LISTS", fresh)
    return fresh


@pytest.fixture
def drawn(monkeypatch) -> list:
    """Every question reasoning-gym's split builder classifies (one per generated item)."""
    seen: list[str] = []
    real = rg_data.is_test_question

    def counting(question: str) -> bool:
        seen.append(question)
        return real(question)

    monkeypatch.setattr(rg_data, "is_test_question", counting)
    return seen


def test_intermediate_integration_is_built_once_per_kwargs(cache, drawn):
    """``gym.make("ReasoningGym-v1", task="intermediate_integration", ...)`` twice draws the split once (it drew it
    twice before); other kwargs (size, split, seed) draw their own."""
    kw = dict(task="intermediate_integration", split="test", test_size=2)
    first = gym.make("ReasoningGym-v1", **kw).unwrapped
    n = len(drawn)
    assert n >= 2
    t = time.perf_counter()
    second = gym.make("ReasoningGym-v1", **kw).unwrapped
    assert len(drawn) == n, "the same kwargs drew the split again"
    assert time.perf_counter() - t < 5.0
    assert second._problems == first._problems and second._problems is not first._problems
    assert all(a is b for a, b in zip(first._problems, second._problems))  # the items are shared
    gym.make("ReasoningGym-v1", **{**kw, "test_size": 3})
    assert len(drawn) > n
    n = len(drawn)
    gym.make("ReasoningGym-v1", **{**kw, "test_seed": 23})
    assert len(drawn) > n
    assert cache.builds == 3 and cache.hits == 1


def test_every_family_builds_its_list_once(cache):
    """GSM8K, IFEval, DigitSum, ReasoningGym: the second construction with the same kwargs builds nothing."""
    for env_id, kw in (("GSM8K-v1", {"split": "test"}), ("IFEval-v0", {"split": "test"}),
                       ("DigitSum-v0", {"split": "test"}),
                       ("ReasoningGym-v1", {"task": "chain_sum", "split": "test", "test_size": 5})):
        before = cache.builds
        a = gym.make(env_id, **kw).unwrapped
        built = cache.builds - before
        assert built >= 1, env_id
        b = gym.make(env_id, **kw).unwrapped
        assert cache.builds - before == built, f"{env_id}: built again"
        assert a.task_ids == b.task_ids, env_id


def test_the_cache_is_a_bounded_lru(cache):
    """At most :data:`MAX_ENTRIES` (16) lists; the least recently used is dropped and built again when asked."""
    assert MAX_ENTRIES == 16 and cache.max_entries == MAX_ENTRIES
    for size in range(1, MAX_ENTRIES + 3):
        gym.make("DigitSum-v0", split="test", test_size=size)
    assert len(cache) == MAX_ENTRIES and cache.builds == MAX_ENTRIES + 2

    small = TaskListCache(max_entries=2)
    calls = []

    def build(k):
        return lambda: calls.append(k) or [k]

    assert small.get("a", build("a")) == ("a",)
    small.get("b", build("b"))
    small.get("a", build("a"))  # a is now the most recent: b goes first
    small.get("c", build("c"))
    assert "a" in small and "b" not in small and len(small) == 2
    small.get("b", build("b"))
    assert calls == ["a", "b", "c", "b"]
    with pytest.raises(ValueError, match="max_entries"):
        TaskListCache(max_entries=0)


def test_a_failed_build_caches_nothing_and_concurrent_callers_build_once():
    c = TaskListCache()

    def fail():
        raise ValueError("no such task")

    with pytest.raises(ValueError, match="no such task"):
        c.get(("x",), fail)
    assert len(c) == 0 and c.get(("x",), lambda: [1]) == (1,)

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return [2]

    out = []
    threads = [threading.Thread(target=lambda: out.append(c.get(("y",), slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and out == [(2,)] * 4


@pytest.mark.parametrize("env_id, kw", [
    ("ReasoningGym-v1", {"task": "chain_sum", "split": "test", "test_size": 4}),
    ("GSM8K-v1", {"split": "test"}),
    ("IFEval-v0", {"split": "test"}),
    ("DigitSum-v0", {"split": "test", "test_size": 4}),
])
def test_envs_sharing_a_list_never_change_it_nor_see_each_other(cache, env_id, kw):
    """Two envs of one list play interleaved episodes (the callers scribbling on what they were handed): the cached
    list is unchanged, and each env's episode is its own."""
    a, b = gym.make(env_id, **kw).unwrapped, gym.make(env_id, **kw).unwrapped
    snapshot = {k: copy.deepcopy(v) for k, v in cache._entries.items()}
    assert snapshot
    indices = a.usable_task_indices(3)
    for i, j in zip(indices, reversed(indices)):
        obs_a, info_a = a.reset(options={"index": i})
        obs_b, info_b = b.reset(options={"index": j})
        for obs, info in ((obs_a, info_a), (obs_b, info_b)):
            obs[-1]["content"] += " scribbled"
            for v in info.values():
                if isinstance(v, dict):
                    v["scribbled"] = True
                elif isinstance(v, list):
                    v.append("scribbled")
        _, _, _, _, step_a = a.step("the answer is 7")
        assert step_a["index"] == i and a._messages[-2]["content"] == a._prompt(i)
        _, _, _, _, step_b = b.step("<answer>0</answer>")
        assert step_b["index"] == j
    for name in ("_problems", "_prompts", "_numbers"):
        own = getattr(a, name, None)
        if isinstance(own, list):
            own.append("scribbled")  # an env's own list is a copy: appending changes nothing shared
    assert {k: v for k, v in cache._entries.items()} == snapshot
    c = gym.make(env_id, **kw).unwrapped
    assert c.reset(options={"index": indices[0]})[0][-1]["content"] == a._prompt(indices[0])
