"""Generated tau2 mock tasks (issue 48, item 1): envs/tau2/generated_tasks.py, split="generated_train" /
"generated_test": sizes, bit-identical regeneration (digests), composition rules, train/test disjointness, and the
reward: every gold replay 1.0, doing nothing 0.0, a dropped write < 1.0, our reward equal to tau2's evaluator on
perturbed trajectories; hostile model text on generated tasks."""
from __future__ import annotations

import json
import random

import gymnasium as gym
import pytest

import envs
from envs.tau2.generated_tasks import (GENERATED_SPLITS, SPLIT_DIGESTS, SPLIT_SIZES, generate_split, split_digest,
                                       split_json)

gym.register_envs(envs)

WRITES = {"create_task", "update_task_status"}


def _env(split, user="solo", **kw):
    return gym.make("tau2/mock-v0", split=split, user=user, max_steps=12, **kw)


def _play(env, i, actions):
    env.reset(options={"index": i})
    reward, info = 0.0, {}
    for a in actions:
        _, reward, term, trunc, info = env.step(a)
        if term or trunc:
            break
    return reward, info


@pytest.mark.parametrize("split", GENERATED_SPLITS)
def test_splits_regenerate_bit_identically_and_have_their_sizes(split):
    assert len(generate_split(split)) == SPLIT_SIZES[split]
    assert split_digest(split) == SPLIT_DIGESTS[split]  # the committed seed gives the committed set
    doc = json.loads(split_json(split))
    assert [t["id"] for t in doc] == _env(split).unwrapped.task_ids  # the env serves them in this order


def test_composition_rules_hold_on_every_task():
    for split in GENERATED_SPLITS:
        ids = [t["id"] for t in generate_split(split)]
        assert len(set(ids)) == len(ids)
        for t in generate_split(split):
            db = t["initial_state"]["initialization_data"]["agent_data"]
            assert 2 <= len(db["users"]) <= 5
            assert sorted(db["tasks"], key=lambda k: int(k.split("_")[1])) == [f"task_{i + 1}" for i in range(len(db["tasks"]))]
            owned = [tid for u in db["users"].values() for tid in u["tasks"]]
            assert sorted(owned) == sorted(db["tasks"])  # each task has exactly one owner
            crit = t["evaluation_criteria"]
            assert crit["reward_basis"] == ["DB"] and not crit["nl_assertions"]
            names = [a["name"] for a in crit["actions"]]
            assert WRITES & set(names), t["id"]  # every gold writes
            if "transfer_to_human_agents" in names:
                assert names[-1] == "transfer_to_human_agents"
            k = len(t["description"]["purpose"].split("(")[1].rstrip(")").split("+"))
            assert 1 <= k <= 3
            assert t["ticket"] and t["user_scenario"]["instructions"]["reason_for_call"] == t["ticket"]


def test_test_split_is_held_out_from_train():
    train, test = generate_split("generated_train"), generate_split("generated_test")
    assert not {t["ticket"] for t in train} & {t["ticket"] for t in test}

    def vocab(tasks):
        names, titles = set(), set()
        for t in tasks:
            db = t["initial_state"]["initialization_data"]["agent_data"]
            names |= {u["name"] for u in db["users"].values()}
            titles |= {x["title"] for x in db["tasks"].values()}
            titles |= {a["arguments"]["title"] for a in t["evaluation_criteria"]["actions"] if a["name"] == "create_task"}
        return names, titles

    (n1, t1), (n2, t2) = vocab(train), vocab(test)
    assert not n1 & n2 and not t1 & t2
    first1, first2 = {n.split()[0] for n in n1}, {n.split()[0] for n in n2}
    assert not first1 & first2


@pytest.mark.parametrize("user", ["solo", "scripted"])
def test_gold_scores_one_doing_nothing_zero_and_a_dropped_write_less(user):
    env = _env("generated_test", user)
    u = env.unwrapped
    for i in range(u.num_tasks):
        gold = u.demonstration({"index": i})
        assert _play(env, i, gold)[0] == 1.0, u.task_ids[i]
        assert _play(env, i, [u.do_nothing_action])[0] == 0.0, u.task_ids[i]
        writes = [j for j, a in enumerate(gold) if a.get("tool_calls") and a["tool_calls"][0]["function"]["name"] in WRITES]
        dropped = [a for j, a in enumerate(gold) if j != writes[-1]]
        assert _play(env, i, dropped)[0] < 1.0, u.task_ids[i]


def test_gold_scores_one_on_a_sample_of_train():
    env = _env("generated_train")
    u = env.unwrapped
    for i in random.Random(0).sample(range(u.num_tasks), 150):
        assert _play(env, i, u.demonstration({"index": i}))[0] == 1.0, u.task_ids[i]


def _perturbations(gold, rng):
    """gold, nothing, a write dropped, two writes swapped, an extra create, a wrong status."""
    calls = [a for a in gold if a.get("tool_calls") and a["tool_calls"][0]["function"]["name"] != "done"]
    done = gold[-1]
    out = [gold, [done]]
    writes = [j for j, a in enumerate(calls) if a["tool_calls"][0]["function"]["name"] in WRITES]
    out.append([a for j, a in enumerate(calls) if j != rng.choice(writes)] + [done])
    if len(writes) >= 2:
        a, b = rng.sample(writes, 2)
        sw = list(calls)
        sw[a], sw[b] = sw[b], sw[a]
        out.append(sw + [done])
    extra = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "create_task",
                                                      "arguments": json.dumps({"user_id": "user_1", "title": "Extra"})}}]}
    out.append(calls + [extra, done])
    flip = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "y", "type": "function", "function": {"name": "update_task_status",
                                                      "arguments": json.dumps({"task_id": "task_1", "status": "pending"})}}]}
    out.append(calls + [flip, done])
    return out


def test_our_reward_equals_tau2s_evaluator_on_perturbed_trajectories():
    fast, ref = _env("generated_test"), _env("generated_test", evaluator="tau2")
    rng = random.Random(1)
    n = 0
    for i in range(0, 200, 5):
        gold = fast.unwrapped.demonstration({"index": i})
        for traj in _perturbations(gold, rng):
            a, info_a = _play(fast, i, traj)
            b, info_b = _play(ref, i, traj)
            assert a == b, (fast.unwrapped.task_ids[i], a, b)
            n += 1
    assert n >= 200


def test_malformed_model_text_on_generated_tasks_is_an_error_observation():
    env = _env("generated_test")
    env.reset(options={"index": 0})
    for text in ['<tool_call>{"name": "create_task", "arguments": {"user_id": </tool_call>',
                 '<tool_call>{"name": "drop_table", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "update_task_status", "arguments": {"task_id": "task_1", "status": "gone"}}</tool_call>',
                 '<tool_call>' + '[' * 100_000 + '</tool_call>',
                 '{"name": "create_task", "arguments": {"user_id": "user_1", "title": "t", "owner": "x"}}']:
        obs, reward, term, trunc, info = env.step(text)
        assert not term and reward == 0.0
        assert obs and obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error"), (text[:40], obs)
    _, reward, term, _, info = env.step(env.unwrapped.do_nothing_action)
    assert term and reward == 0.0  # nothing reached the database


def test_solo_ticket_user_shares_the_system_prompt_and_keeps_every_reward():
    apart, inside = _env("generated_test", solo_ticket="user"), _env("generated_test")
    systems = set()
    for i in range(0, 200, 7):
        obs, _ = apart.reset(options={"index": i})
        ref, _ = inside.reset(options={"index": i})
        assert [m["role"] for m in obs] == ["system", "user"] and [m["role"] for m in ref] == ["system"]
        ticket = apart.unwrapped.tasks[i].ticket
        assert ticket in obs[1]["content"] and ticket not in obs[0]["content"] and ticket in ref[0]["content"]
        assert ref[0]["content"].startswith(obs[0]["content"])  # tau2's prompt up to its <ticket> block
        systems.add(obs[0]["content"])
        gold = apart.unwrapped.demonstration({"index": i})
        assert _play(apart, i, gold)[0] == _play(inside, i, gold)[0] == 1.0
        assert _play(apart, i, [apart.unwrapped.do_nothing_action])[0] == 0.0
    assert len(systems) == 1  # one system prompt for every task: a prefix the trainer computes once
    with pytest.raises(ValueError, match="solo_ticket"):
        _env("generated_test", solo_ticket="assistant")


def test_gold_reads_first_opens_every_demonstration_with_the_read_and_keeps_its_reward():
    """Tau2Env(gold_reads_first=["get_users"]): every demonstration calls get_users first, exactly once at its head
    (a gold that already opens with it is not given a second), the rest is the gold unchanged, and the replay scores
    1.0 (a read does not change the database)."""
    plain = _env("generated_test").unwrapped
    env = _env("generated_test", gold_reads_first=["get_users"])
    u = env.unwrapped
    opened_with_lookup = 0
    for i in range(0, u.num_tasks, 4):
        gold = plain.demonstration({"index": i})
        demo = u.demonstration({"index": i})
        names = [m["tool_calls"][0]["function"]["name"] for m in demo if m.get("tool_calls")]
        gold_names = [m["tool_calls"][0]["function"]["name"] for m in gold if m.get("tool_calls")]
        assert names[0] == "get_users"
        if gold_names[0] == "get_users":
            opened_with_lookup += 1
            assert demo == gold
        else:
            assert names[1:] == gold_names and demo[1:] == gold
            assert json.loads(demo[0]["tool_calls"][0]["function"]["arguments"]) == {}
        assert _play(env, i, demo)[0] == 1.0, u.task_ids[i]
    assert 0 < opened_with_lookup < len(range(0, u.num_tasks, 4))


@pytest.mark.parametrize("bad, match", [(["create_task"], "not a read-only agent tool"),
                                        (["nope"], "not a read-only agent tool"),
                                        ("get_users", "a list of tool names")])
def test_gold_reads_first_rejects_a_write_an_unknown_tool_or_a_bare_string(bad, match):
    with pytest.raises(ValueError, match=match):
        _env("generated_test", gold_reads_first=bad)


def test_gold_reads_first_rejects_a_read_that_needs_arguments():
    with pytest.raises(ValueError, match="requires arguments"):
        gym.make("tau2/airline-v0", split="test", gold_reads_first=["get_user_details"])


def test_select_tasks_keeps_the_range_and_the_short_tasks_and_the_cli_writes_a_servable_file(tmp_path, capsys):
    from envs.tau2.generated_tasks import intents, main, select_tasks

    chosen = select_tasks("generated_train", max_intents=1, start=256, stop=400)
    every = generate_split("generated_train")
    expected = [t for t in every[256:400] if "+" not in t["description"]["purpose"]]
    assert chosen == expected and 0 < len(chosen) < 144  # order kept, nothing else dropped
    assert {len(intents(t)) for t in chosen} == {1}
    assert {len(intents(t)) for t in every} == {1, 2, 3}
    assert main(["generated_train", "--max-intents", "1", "--start", "256", "--stop", "400"]) == 0
    path = tmp_path / "train.json"
    path.write_text(capsys.readouterr().out)
    env = gym.make("tau2/mock-v0", tasks_path=str(path), user="solo", max_steps=12)
    assert env.unwrapped.task_ids == [t["id"] for t in chosen]  # the file's tasks, in file order
    reward, _ = _play(env, 0, env.unwrapped.demonstration({"index": 0}))
    assert reward == 1.0  # a selected task keeps its gold


@pytest.mark.parametrize("kw, match", [({"max_intents": 0}, "max_intents"), ({"start": -1}, "start")])
def test_select_tasks_rejects_a_bad_selection(kw, match):
    from envs.tau2.generated_tasks import select_tasks

    with pytest.raises(ValueError, match=match):
        select_tasks("generated_train", **kw)


def test_the_cli_refuses_an_empty_selection_and_intents_refuses_a_foreign_task(capsys):
    from envs.tau2.generated_tasks import intents, main

    with pytest.raises(SystemExit) as e:
        main(["generated_test", "--start", "500"])
    assert e.value.code == 2 and "empty" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a generated mock task"):
        intents({"id": "0", "description": {"purpose": "a tau2 registry task"}})
