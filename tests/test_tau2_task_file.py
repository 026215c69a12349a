"""Task files a user brings (``tasks_path``, :mod:`envs.tau2.task_file`): served exactly, in file order, graded by
their own gold (and by tau2's own evaluator the same); every bad file refused at construction with a ValueError
naming the file, the task and the field; the same keyword through every adapter and the trainer's config."""
from __future__ import annotations

import json
import os

import gymnasium as gym
import pytest

import envs
from envs.tau2 import task_file
from envs.tau2.rewards import tau2_reward_reference
from envs.tau2.task_file import (MAX_TASK_FILE_BYTES, MAX_TASK_FILE_DEPTH, TaskFileError, TaskFileNotFoundError,
                                 load_task_file)
from envs.tau2.tasks import load_tasks

gym.register_envs(envs)

#: tau2 mock tasks that solo mode can play (a ticket, no customer turns), in an order unlike the registry's
SOLO_MOCK = ["update_task_1", "create_task_1", "update_task_with_initialization_actions",
             "create_task_1_with_env_assertions", "impossible_task_1"]


def _dumped(domain: str, split: str = "base") -> list[dict]:
    """The tasks of a registry split, read by tau2's own loader, as JSON-ready dicts."""
    return [t.model_dump(mode="json", exclude_none=True) for t in load_tasks(domain, split).tasks]


def _mock(task_id: str) -> dict:
    return next(t for t in _dumped("mock") if t["id"] == task_id)


def _renamed(task_ids: list[str], prefix: str = "my_") -> list[dict]:
    out = []
    for tid in task_ids:
        t = _mock(tid)
        t["id"] = prefix + tid
        out.append(t)
    return out


def _write(path, tasks: list, jsonl: bool = False) -> str:
    path.write_text("\n".join(json.dumps(t) for t in tasks) + "\n" if jsonl else json.dumps(tasks, indent=1))
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


@pytest.mark.parametrize("user", ["scripted", "solo"])
def test_mock_file_tasks_are_served_in_file_order_and_their_gold_scores_like_tau2(tmp_path, user):
    ids = SOLO_MOCK + (["update_task_with_message_history"] if user == "scripted" else [])
    path = _write(tmp_path / "mine.json", _renamed(ids))
    env = gym.make("tau2/mock-v0", user=user, tasks_path=path)
    u = env.unwrapped
    assert u.task_ids == ["my_" + i for i in ids] and u.num_tasks == len(ids)
    assert u.split == "file:mine.json" and u.tasks_path == os.path.realpath(path)
    assert u.usable_task_indices() == list(range(len(ids)))
    for i, tid in enumerate(u.task_ids):
        _, info = env.reset(options={"index": i})
        assert info["task_id"] == tid and info["index"] == i and info["split"] == "file:mine.json"
        _, info = env.reset(options={"task_id": tid})
        assert info["index"] == i
        reward = _play(env, u.demonstration({"index": i}))
        ref = tau2_reward_reference(u.simulation_run(), u.task, "mock", u.solo)
        assert reward == ref.reward == 1.0, tid
    with pytest.raises(KeyError, match="file:mine.json"):
        env.reset(options={"task_id": "create_task_1"})  # a registry id, not in the file
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"index": len(ids)})


def test_airline_file_tasks_as_tau2_writes_them(tmp_path):
    """tau2's own airline tasks file, first tasks, ids changed (its ``annotations`` key kept: tau2 ignores it)."""
    from tau2.domains.airline.utils import AIRLINE_TASK_SET_PATH

    raw = json.loads(open(AIRLINE_TASK_SET_PATH).read())[:4]
    assert all("annotations" in t for t in raw)
    for t in raw:
        t["id"] = f"air_{t['id']}"
    path = _write(tmp_path / "air.jsonl", raw[::-1], jsonl=True)
    env = gym.make("tau2/airline-v0", user="scripted", tasks_path=path)
    u = env.unwrapped
    assert u.task_ids == [t["id"] for t in raw[::-1]] and u.split == "file:air.jsonl"
    for i in range(u.num_tasks):
        env.reset(options={"index": i})
        assert _play(env, u.demonstration({"index": i})) == 1.0, u.task.id


def test_json_lines_in_any_file_name_and_blank_lines(tmp_path):
    tasks = _renamed(SOLO_MOCK[:3])
    lines = tmp_path / "tasks.json"
    lines.write_text("\n" + json.dumps(tasks[0]) + "\n\n" + json.dumps(tasks[1]) + "\n" + json.dumps(tasks[2]))
    listed = _write(tmp_path / "list.json", tasks)
    for path in (str(lines), listed, _write(tmp_path / "t.jsonl", tasks, jsonl=True)):
        assert load_task_file("mock", path).ids == [t["id"] for t in tasks]


def test_one_parse_per_file_version(tmp_path):
    path = _write(tmp_path / "t.json", _renamed(SOLO_MOCK[:2]))
    a, b = (gym.make("tau2/mock-v0", tasks_path=path).unwrapped for _ in range(2))
    assert a.tasks is b.tasks and a.tasks is load_task_file("mock", tmp_path / "t.json")
    _write(tmp_path / "t.json", _renamed(SOLO_MOCK[:3]))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    c = gym.make("tau2/mock-v0", tasks_path=path).unwrapped
    assert c.tasks is not a.tasks and c.num_tasks == 3 and a.num_tasks == 2


# ---------------------------------------------------------------------------------------------------------------
# bad files: a ValueError naming the file, the task and the field
# ---------------------------------------------------------------------------------------------------------------
def _edit(task_id: str, edit) -> dict:
    t = _mock(task_id)
    edit(t)
    return t


def _set(path: list, value):
    def edit(t):
        node = t
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _drop(key):
    return lambda t: t.pop(key)


ACTION0 = ["evaluation_criteria", "actions", 0]
BAD_TASKS = {
    "missing user_scenario": (_edit("create_task_1", _drop("user_scenario")), "'create_task_1' (#0)",
                              "user_scenario", "Field required"),
    "arguments not an object": (_edit("create_task_1", _set(ACTION0 + ["arguments"], "x")), "'create_task_1' (#0)",
                                "evaluation_criteria.actions[0].arguments", "valid dictionary"),
    "no id": (_edit("create_task_1", _drop("id")), "#0", "id", "Field required"),
    "empty id": (_edit("create_task_1", _set(["id"], " ")), "#0", "id", "empty task id"),
    "misspelt top-level field": (_edit("create_task_1", _set(["evaluation_critera"], {})), "'create_task_1' (#0)",
                                 "evaluation_critera", "unknown field"),
    "misspelt nested field": (_edit("create_task_1", _set(["evaluation_criteria", "reward_bases"], ["DB"])),
                              "'create_task_1' (#0)", "evaluation_criteria.reward_bases", "unknown field"),
    "unknown gold tool": (_edit("create_task_1", _set(ACTION0 + ["name"], "crate_task")), "'create_task_1' (#0)",
                          "evaluation_criteria.actions[0].name", "'crate_task' is not a agent tool"),
    "user tool in a domain without": (_edit("create_task_1", _set(ACTION0 + ["requestor"], "user")),
                                      "'create_task_1' (#0)", "evaluation_criteria.actions[0].name", "no user tools"),
    "gold arguments invalid": (_edit("create_task_1", _set(ACTION0 + ["arguments"], {"user_id": 1, "title": "x"})),
                               "'create_task_1' (#0)", "evaluation_criteria.actions[0].arguments", "user_id"),
    "gold arguments unknown": (_edit("create_task_1", _set(ACTION0 + ["arguments", "colour"], "red")),
                               "'create_task_1' (#0)", "evaluation_criteria.actions[0].arguments", "colour"),
    "compare_args not parameters": (_edit("create_task_1", _set(ACTION0 + ["compare_args"], ["titel"])),
                                    "'create_task_1' (#0)", "evaluation_criteria.actions[0].compare_args", "titel"),
    "LLM-judged basis": (_edit("create_task_1", _set(["evaluation_criteria", "reward_basis"], ["DB", "NL_ASSERTION"])),
                         "'create_task_1' (#0)", "evaluation_criteria.reward_basis", "NL_ASSERTION needs an LLM judge"),
    "unknown reward type": (_edit("create_task_1", _set(["evaluation_criteria", "reward_basis"], ["DBB"])),
                            "'create_task_1' (#0)", "evaluation_criteria.reward_basis[0]", "Input should be"),
    "initial state cannot be set": (
        _edit("create_task_1", _set(["initial_state"], {"initialization_actions": [
            {"env_type": "assistant", "func_name": "no_such_function", "arguments": {}}]})),
        "'create_task_1' (#0)", "initial_state", "no_such_function"),
    "env assertion cannot run": (
        _edit("create_task_1_with_env_assertions",
              _set(["evaluation_criteria", "env_assertions", 0, "func_name"], "assert_nothing")),
        "'create_task_1_with_env_assertions' (#0)", "evaluation_criteria.env_assertions[0]", "assert_nothing"),
    "env assertion with bad arguments": (
        _edit("create_task_1_with_env_assertions",
              _set(["evaluation_criteria", "env_assertions", 0, "arguments"], {"task": "task_2"})),
        "'create_task_1_with_env_assertions' (#0)", "evaluation_criteria.env_assertions[0]", "TypeError"),
    "not an object": (1, "#0", None, "a task is a JSON object, got a JSON number"),
}


@pytest.mark.parametrize("case", sorted(BAD_TASKS))
def test_a_bad_task_is_refused_naming_file_task_and_field(tmp_path, case):
    task, label, field, text = BAD_TASKS[case]
    path = _write(tmp_path / "bad_tasks.json", [task])
    with pytest.raises(ValueError) as e:
        gym.make("tau2/mock-v0", tasks_path=path)
    msg = str(e.value)
    assert isinstance(e.value, TaskFileError) and e.value.path == os.path.realpath(path)
    assert "bad_tasks.json" in msg and f"task {label}" in msg and text in msg, msg
    if field is not None:
        assert f"{label}: {field}:" in msg, msg


def test_a_task_after_good_ones_is_named_by_its_index_and_duplicates_by_both(tmp_path):
    tasks = _renamed(SOLO_MOCK[:2]) + [_renamed(SOLO_MOCK[:1])[0]]
    with pytest.raises(ValueError, match=r"task 'my_update_task_1' \(#2\): id: duplicate id: task #0 has the same id"):
        load_task_file("mock", _write(tmp_path / "dup.json", tasks))
    tasks = _renamed(SOLO_MOCK[:2]) + [{"id": "x"}]
    with pytest.raises(ValueError, match=r"task 'x' \(#2\): user_scenario: Field required"):
        load_task_file("mock", _write(tmp_path / "third.json", tasks))
    tasks = _renamed(SOLO_MOCK[:2]) + [{"id": "x"}]
    with pytest.raises(ValueError, match=r"task 'x' \(#2, line 3\): user_scenario"):
        load_task_file("mock", _write(tmp_path / "third.jsonl", tasks, jsonl=True))


def test_every_problem_is_listed_up_to_a_bound(tmp_path):
    tasks = [{"id": f"t{i}"} for i in range(task_file.MAX_PROBLEMS_SHOWN + 3)]
    with pytest.raises(TaskFileError) as e:
        load_task_file("mock", _write(tmp_path / "many.json", tasks))
    assert len(e.value.problems) == task_file.MAX_PROBLEMS_SHOWN
    assert f"{task_file.MAX_PROBLEMS_SHOWN + 3} problems" in str(e.value) and "and 3 more problem(s)" in str(e.value)
    # the checks against the domain stop at the bound, and say so
    tasks = _renamed(["create_task_1"] * (task_file.MAX_PROBLEMS_SHOWN + 2))
    for i, t in enumerate(tasks):
        t["id"] = f"t{i}"
        t["evaluation_criteria"]["actions"][0]["name"] = "crate_task"
    with pytest.raises(TaskFileError) as e:
        load_task_file("mock", _write(tmp_path / "many_tools.json", tasks))
    assert len(e.value.problems) == task_file.MAX_PROBLEMS_SHOWN
    assert "tasks after #9 were not checked against the domain" in str(e.value), str(e.value)


@pytest.mark.parametrize("name,content,text", [
    ("syntax.json", '[{"id": "a",}]', "invalid JSON at line 1 column 13"),
    ("syntax_multiline.json", '[\n {"id": "a"},\n {"id": "b"\n]', "invalid JSON at line 4 column 1"),
    ("syntax_lines.jsonl", '{"id": "a"}\n{"id": "b", oops}\n', "line 2 (task #1): invalid JSON at line 1 column 13"),
    ("empty.json", "  \n", "is empty"),
    ("empty_list.json", "[]", "holds no tasks"),
    ("one_object.json", '{\n "id": "a"\n}', "holds a JSON object, not a list of tasks"),
    ("a_string.json", '"tasks"', "holds a JSON string, not a list"),
    ("latin1.json", b'[{"id": "caf\xe9"}]', "is not UTF-8 text (byte 12, line 1"),
    ("huge_int.json", '[{"id": "a", "ticket": ' + "9" * 5000 + "}]", "a number that cannot be read"),
])
def test_a_bad_file_is_refused_naming_file_and_place(tmp_path, name, content, text):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as e:
        gym.make("tau2/mock-v0", tasks_path=str(path))
    assert name in str(e.value) and text in str(e.value), str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        gym.make("tau2/mock-v0", tasks_path=str(tmp_path / "nope.json"))
    assert isinstance(e.value, ValueError) and isinstance(e.value, TaskFileNotFoundError)
    assert "nope.json (domain 'mock'): no such file" in str(e.value)
    with pytest.raises(ValueError, match="is a directory"):
        gym.make("tau2/mock-v0", tasks_path=str(tmp_path))
    with pytest.raises(ValueError, match="tasks_path must be a file path"):
        load_task_file("mock", 3)
    with pytest.raises(ValueError, match="unknown tau2 domain 'bank'"):
        load_task_file("bank", str(tmp_path / "nope.json"))


def test_a_task_the_configuration_cannot_play_is_refused_at_construction(tmp_path):
    tasks = _renamed(SOLO_MOCK[:2] + ["update_task_with_message_history"])
    tasks[1].pop("ticket")
    tasks[2]["ticket"] = "Update the task as the customer said."
    path = _write(tmp_path / "solo.json", tasks)
    with pytest.raises(ValueError) as e:
        gym.make("tau2/mock-v0", user="solo", tasks_path=path)
    msg = str(e.value)
    assert "solo.json" in msg and "2 of 3 tasks cannot be played" in msg
    assert "task #1: tau2 task 'my_create_task_1' of 'mock' has no ticket" in msg
    assert "task #2: tau2 task 'my_update_task_with_message_history' has customer messages" in msg
    assert gym.make("tau2/mock-v0", user="scripted", tasks_path=path).unwrapped.num_tasks == 3


# ---------------------------------------------------------------------------------------------------------------
# hostile-ish files: refused before they are read or parsed
# ---------------------------------------------------------------------------------------------------------------
def test_a_file_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_TASK_FILE_BYTES + 1)  # sparse: the size is there, the bytes are not
    monkeypatch.setattr(task_file, "_read_text", lambda *a: pytest.fail("a file over the bound was read"))
    with pytest.raises(ValueError, match=rf"huge.json.*{MAX_TASK_FILE_BYTES + 1} bytes, over the "
                                         rf"{MAX_TASK_FILE_BYTES}-byte bound"):
        gym.make("tau2/mock-v0", tasks_path=str(path))


@pytest.mark.parametrize("name,text", [
    ("deep.json", "[" * 200_000 + "]" * 200_000),
    ("deep_task.json", '[{"id": "a", "ticket": ' + "[" * 5000 + "]" * 5000 + "}]"),
    ("deep.jsonl", json.dumps(_mock("create_task_1")) + "\n" + '{"a": ' * 3000 + "1" + "}" * 3000 + "\n"),
    ("deep_unclosed.json", "[" * 1_000_000),
])
def test_deep_nesting_is_refused_before_parsing(tmp_path, monkeypatch, name, text):
    (tmp_path / name).write_text(text)
    real_loads = json.loads

    def loads(s, *a, **k):
        assert s.count("[") + s.count("{") <= 2 * MAX_TASK_FILE_DEPTH + 1000, "json.loads on a deeply nested text"
        return real_loads(s, *a, **k)

    monkeypatch.setattr(task_file.json, "loads", loads)
    with pytest.raises(ValueError, match=rf"{name}.*nested deeper than {MAX_TASK_FILE_DEPTH} levels"):
        load_task_file("mock", str(tmp_path / name))


def test_lone_surrogates_become_replacement_characters(tmp_path):
    t = _renamed(["create_task_1"])[0]
    t["ticket"] = "Create a task \ud800 called 'Important Meeting' for user_1."
    path = tmp_path / "sur.json"
    path.write_text(json.dumps([t]))  # json.dumps writes the lone surrogate as the escape \ud800
    env = gym.make("tau2/mock-v0", user="solo", tasks_path=str(path))
    obs, _ = env.reset(options={"index": 0})
    assert "\ufffd" in obs[0]["content"] and "\ud800" not in obs[0]["content"]
    obs[0]["content"].encode("utf-8")


def test_malformed_model_calls_on_file_tasks_are_answered_and_change_nothing(tmp_path):
    env = gym.make("tau2/mock-v0", user="solo", tasks_path=_write(tmp_path / "t.json", _renamed(["create_task_1"])))
    u = env.unwrapped
    env.reset(options={"index": 0})
    before = u.domain.agent_snapshot.delta(u.tau2_environment.tools.db)
    call = '<tool_call>{"name": "create_task", "arguments": {"user_id": "user_1", "title": "x"}}</tool_call>'
    for action in ['<tool_call>{"name": "create_task", "arguments": {"user_id": </tool_call>',  # bad JSON
                   '<tool_call>{"name": "drop_tables", "arguments": {}}</tool_call>',  # unknown tool
                   '<tool_call>{"name": "create_task", "arguments": {"user_id": 1, "title": "x"}}</tool_call>',
                   '<tool_call>{"name": "create_task", "arguments": ' + '{"a": ' * 100 + "1" + "}" * 100
                   + "}</tool_call>",  # nested past the bound
                   call * 17]:  # more calls than one action may make: none runs
        obs, reward, term, trunc, info = env.step(action)
        assert not (term or trunc) and reward == 0.0 and info["action_error"]
        assert obs and all(m["role"] == "tool" and m["content"].startswith("Error") for m in obs), obs
    assert u.domain.agent_snapshot.delta(u.tau2_environment.tools.db) == before
    assert _play(env, u.demonstration({"index": 0})) == 1.0


# ---------------------------------------------------------------------------------------------------------------
# the same keyword everywhere an env is made
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def solo_file(tmp_path):
    return _write(tmp_path / "solo_tasks.json", _renamed(SOLO_MOCK[:3]))


def test_torchrl_env_serves_the_file(solo_file):
    import torch
    from tensordict import NonTensorStack, TensorDict

    from envs.adapters.torchrl_env import make_torchrl_env

    env = make_torchrl_env("tau2/mock-v0", batch_size=2, user="solo", tasks_path=solo_file)
    td = env.reset(TensorDict({"task_index": torch.tensor([2, 0])}, batch_size=[2]))
    infos = list(td["info"])
    assert [i["task_id"] for i in infos] == ["my_update_task_with_initialization_actions", "my_update_task_1"]
    assert {i["split"] for i in infos} == {"file:solo_tasks.json"}
    gold = [e.unwrapped.demonstration({"index": i}) for e, i in zip(env.envs, (2, 0))]
    rewards = [0.0, 0.0]
    for t in range(max(map(len, gold))):
        acts = [g[min(t, len(g) - 1)] for g in gold]
        td = env.step(TensorDict({"action": NonTensorStack(*acts)}, batch_size=[2]))
        for b in range(2):
            if t == len(gold[b]) - 1:
                rewards[b] = float(td["next", "reward"][b])
    assert rewards == [1.0, 1.0]
    env.close()


def test_trl_environment_factory_and_dataset_serve_the_file(solo_file):
    from envs.adapters.trl_env import dataset, environment_factory

    cls = environment_factory("tau2/mock-v0", user="solo", tasks_path=solo_file)
    rows = dataset("tau2/mock-v0", user="solo", tasks_path=solo_file)
    assert [r["task_id"] for r in rows] == ["my_" + t for t in SOLO_MOCK[:3]]
    for row in rows:
        inst = cls()
        inst.reset(**row)
        assert inst.env.unwrapped.split == "file:solo_tasks.json"
        for msg in inst.env.unwrapped.demonstration({"task_id": row["task_id"]}):
            for call in msg.get("tool_calls") or []:
                if call["function"]["name"] != "done":
                    args = call["function"]["arguments"]
                    getattr(inst, call["function"]["name"])(**(json.loads(args) if isinstance(args, str) else args))
        assert inst.get_reward() == 1.0, row["task_id"]


def test_server_env_kwargs_serve_the_file(solo_file, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("openenv")
    from tests.served import serve_app, serve_process

    from envs.serve import build_app

    env = gym.make("tau2/mock-v0", user="solo", tasks_path=solo_file)
    gold = env.unwrapped.demonstration({"task_id": "my_create_task_1"})
    kwargs = json.dumps({"user": "solo", "tasks_path": solo_file})
    with serve_process("tau2/mock-v0", "--env-kwargs", kwargs, timeout_s=600) as url:  # a loaded machine: minutes
        with httpx.Client(base_url=url, timeout=600) as c:
            sid = c.post("/sessions").json()["session_id"]
            r = c.post(f"/sessions/{sid}/reset", json={"task_id": "my_create_task_1"})
            assert r.status_code == 200, r.text
            assert r.json()["observation"]["info"]["split"] == "file:solo_tasks.json"
            for a in gold:
                r = c.post(f"/sessions/{sid}/step", json={"action": {"content": a.get("content"),
                                                                      "tool_calls": a.get("tool_calls")}})
                assert r.status_code == 200, r.text
            assert r.json()["done"] and r.json()["reward"] == 1.0
            assert c.get(f"/sessions/{sid}/state").json()["task_id"] == "my_create_task_1"
    bad = _write(tmp_path / "bad.json", [{"id": "x"}])
    with serve_app(build_app("tau2/mock-v0", {"tasks_path": bad})) as (url, _):
        r = httpx.post(url + "/sessions", timeout=600)
        assert r.status_code == 500 and "bad.json" in r.text and "user_scenario" in r.text, r.text


def test_grpo_config_to_env_through_the_family(solo_file, tmp_path):
    from omegaconf import OmegaConf

    from torchrl_grpo.assembly.environments import check_data, env_kwargs_from_config
    from torchrl_grpo.config import GRPOConfig

    test_file = _write(tmp_path / "held_out.json", _renamed(SOLO_MOCK[3:], prefix="test_"))
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), {"econfig": {"env_id": "tau2/mock-v0",
                                                                         "tasks_path": solo_file}})
    env_id, kw = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path)
    assert env_id == "tau2/mock-v0" and kw["tasks_path"] == solo_file and kw["user"] == "solo"
    assert gym.make(env_id, **kw).unwrapped.task_ids == ["my_" + t for t in SOLO_MOCK[:3]]
    assert check_data(cfg) == {"train_dataset": f"{os.path.realpath(solo_file)} (3 tasks)",
                               "valid_dataset": f"{os.path.realpath(solo_file)} (3 tasks)"}
    # a dataset's own path names its file: held-out tasks for evaluation
    cfg.valid_dataset.path = test_file
    _, kw = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path)
    assert gym.make(env_id, **kw).unwrapped.task_ids == ["test_" + t for t in SOLO_MOCK[3:]]
    assert check_data(cfg)["valid_dataset"] == f"{os.path.realpath(test_file)} (2 tasks)"
    # a bad file fails in check_data, before any model loads
    cfg.econfig.tasks_path = _write(tmp_path / "bad.json", [{"id": "x"}])
    with pytest.raises(ValueError, match=r"bad.json.*task 'x' \(#0\): user_scenario: Field required"):
        check_data(cfg)
    # env_id=tau2 + econfig.domain
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), {"econfig": {"env_id": "tau2", "domain": "mock",
                                                                         "tasks_path": solo_file}})
    assert env_kwargs_from_config(cfg, "train")[1]["tasks_path"] == solo_file
