"""Task files a user brings (``tasks_path``, :mod:`envs.tau2.task_file`): served exactly, in file order, graded by
their own gold; every bad file refused at construction with a ValueError naming the file, the task and the field."""
from __future__ import annotations

import json

import gymnasium as gym
import pytest

import envs
from envs.tau2.tasks import load_tasks

gym.register_envs(envs)


def _dumped(domain: str, split: str) -> list[dict]:
    """The tasks of a registry split, read by tau2's own loader, as JSON-ready dicts."""
    return [t.model_dump(mode="json", exclude_none=True) for t in load_tasks(domain, split).tasks]


def _mock(task_id: str) -> dict:
    return next(t for t in _dumped("mock", "base") if t["id"] == task_id)


def _write(path, tasks: list[dict], jsonl: bool = False):
    path.write_text("\n".join(json.dumps(t) for t in tasks) if jsonl else json.dumps(tasks))
    return str(path)


def _play(env, actions) -> float:
    reward = 0.0
    for a in actions:
        _, reward, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    return reward


def _gold_reward(env, task_id: str, actions=None) -> float:
    u = env.unwrapped
    env.reset(options={"task_id": task_id})
    return _play(env, actions if actions is not None else u.demonstration({"task_id": task_id}))


def _retitled(title: str) -> dict:
    """tau2 mock's ``create_task_1`` (same id) asking for another title: another gold database."""
    t = _mock("create_task_1")
    t["user_scenario"]["instructions"] = f"Create a new task called '{title}' for user_1."
    t["ticket"] = f"Create a new task called '{title}' for user_1."
    t["evaluation_criteria"]["actions"][0]["arguments"]["title"] = title
    return t


@pytest.mark.parametrize("user", ["scripted", "solo"])
def test_a_file_task_with_a_registry_id_is_graded_by_its_own_gold(tmp_path, user):
    first = gym.make("tau2/mock-v0", user=user, tasks_path=_write(tmp_path / "a.json", [_retitled("Dentist")]))
    second = gym.make("tau2/mock-v0", user=user, tasks_path=_write(tmp_path / "b.json", [_retitled("Groceries")]))
    registry = gym.make("tau2/mock-v0", user=user)
    gold = {name: env.unwrapped.demonstration({"task_id": "create_task_1"})
            for name, env in (("first", first), ("second", second), ("registry", registry))}
    for name, env in (("registry", registry), ("first", first), ("second", second), ("registry", registry)):
        assert _gold_reward(env, "create_task_1") == 1.0, name
    # the three golds differ: each one's replay in another env scores 0
    assert _gold_reward(first, "create_task_1", gold["registry"]) == 0.0
    assert _gold_reward(registry, "create_task_1", gold["first"]) == 0.0
    assert _gold_reward(second, "create_task_1", gold["first"]) == 0.0
