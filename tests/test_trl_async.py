"""envs.adapters.trl_env in TRL's advanced modes: pickling (TRL's async rollout worker spawns a process and pickles the factory and
the reward functions) and async tool classes (``environment_factory(..., asynchronous=True)``).

TRL's own loops: ``trl.experimental.async_grpo.AsyncRolloutWorker`` (the rollout side of TRL 1.16's
``AsyncGRPOTrainer``: spawned child, pickled kwargs, asyncio rollouts, tool execution, ``get_reward``, scoring)
against a stand-in of vLLM's ``/v1/completions`` that writes each task's gold actions (no vLLM on CPU CI; the
worker's only vLLM use is that HTTP route), and ``GRPOTrainer.train`` with the tiny random model whose ``generate``
is scripted the same way. Rewards are checked against ``gym.make`` replays of the same calls.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
import pickle
import queue
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

trl = pytest.importorskip("trl", reason="envs.adapters.trl_env is tested against the optional extra [trl] (pip install -e '.[trl]')")

import gymnasium as gym
import torch

import envs
from envs.adapters.trl_env import EnvReward, dataset, environment_factory, gold_tool_call_texts, reward_function
from tests.trl_tiny import save_tiny_for_trl, trl_tokenizer

gym.register_envs(envs)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")




def mock_rows(n: int):
    """``n`` tau2/mock-v0 rows whose customer openings differ (the scripted model tells tasks apart by them) and whose
    gold actions score 1.0: create_task_1, update_task_1, impossible_task_1."""
    return dataset("tau2/mock-v0").select([0, 3, 8][:n])


def _replay(env_id, task_id, actions) -> float:
    env = gym.make(env_id, disable_env_checker=True)
    env.reset(options={"task_id": task_id})
    for a in actions:
        _, r, term, trunc, _ = env.step(copy.deepcopy(a))
    assert term or trunc
    return float(r)


# ------------------------------------------------------------------------------------------------ pickling
def test_factory_classes_and_reward_functions_pickle():
    """Before: ``pickle.dumps(environment_factory("tau2/mock-v0"))`` raised ``PicklingError: attribute lookup
    Tau2MockV0Env on envs.adapters.trl_env failed`` and reward_function's closure could not be pickled either."""
    for kw in ({}, {"asynchronous": True}, {"user": "solo"}):
        cls = environment_factory("tau2/mock-v0", **kw)
        back = pickle.loads(pickle.dumps(cls))
        assert back is cls  # one class per recipe and process: TRL routes rewards by `type(env) is cls`
        assert environment_factory("tau2/mock-v0", **kw) is cls
    fn = reward_function("GSM8K-v1", split="test")
    back = pickle.loads(pickle.dumps(fn))
    assert isinstance(back, EnvReward) and back.__name__ == "GSM8K-v1" and back._env is None
    row = dataset("GSM8K-v1", "test", limit=1)[0]
    _, info = gym.make("GSM8K-v1", split="test").reset(options={"task_id": row["task_id"]})
    texts = [f"Reasoning.\n#### {info['answer']}", "#### -987654321"]
    assert back(completions=texts, task_id=[row["task_id"]] * 2) == fn(completions=texts, task_id=[row["task_id"]] * 2) == [1.0, 0.0]


def test_a_subclass_defined_in_a_module_pickles_by_reference():
    assert pickle.loads(pickle.dumps(_ModuleLevelSubclass)) is _ModuleLevelSubclass


_ModuleLevelSubclass = type("_ModuleLevelSubclass", (environment_factory("tau2/mock-v0"),), {"__module__": __name__})


# ------------------------------------------------------------------------------------------------ async tools
def test_async_class_has_async_tools_and_same_schemas():
    from transformers.utils import get_json_schema

    sync_cls, async_cls = environment_factory("tau2/mock-v0"), environment_factory("tau2/mock-v0", asynchronous=True)
    assert async_cls is not sync_cls
    names = [n for n, _ in inspect.getmembers(sync_cls, inspect.isfunction) if not n.startswith("_")]
    assert names == [n for n, _ in inspect.getmembers(async_cls, inspect.isfunction) if not n.startswith("_")]
    a, s = async_cls(), sync_cls()
    for n in names:
        assert inspect.iscoroutinefunction(getattr(async_cls, n)) == (n != "reset"), n
        if n not in ("reset", "get_reward"):
            assert get_json_schema(getattr(a, n)) == get_json_schema(getattr(s, n))


def test_async_tools_play_the_same_episode():
    """The async class's awaited tools give the sync class's replies and reward on every mock task's gold actions."""
    import asyncio

    rows = dataset("tau2/mock-v0")
    sync_inst, async_inst = environment_factory("tau2/mock-v0")(), environment_factory("tau2/mock-v0", asynchronous=True)()

    async def play(inst, row, calls):
        inst.reset(**row)
        replies = [await getattr(inst, n)(**a) for n, a in calls]
        return replies, await inst.get_reward()

    for row in rows:
        task = sync_inst.env.unwrapped.tasks[sync_inst.env.unwrapped.tasks.index_of(row["task_id"])]
        calls = []
        for text in gold_tool_call_texts(task, solo=False)[:-1]:
            c = json.loads(text.split("\n")[1])
            calls.append((c["name"], c["arguments"]))
        sync_inst.reset(**row)
        expected = [getattr(sync_inst, n)(**a) for n, a in calls], sync_inst.get_reward()
        assert asyncio.run(play(async_inst, row, calls)) == expected
        assert async_inst.actions == sync_inst.actions


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_for_trl(tmp_path_factory.mktemp("tiny"))


def _tokenizer(tiny_dir):
    tok = trl_tokenizer(tiny_dir)
    tok.padding_side = "left"
    return tok


def test_grpo_trainer_awaits_async_tools_and_get_reward(tiny_dir, tmp_path):
    """GRPOTrainer (TRL's sync trainer) with the async class: its event loop awaits the tools and get_reward; the
    scripted model plays each mock task's gold actions in one rollout of each group and answers at once in the
    other; the logged rewards equal gym.make's replay of the recorded actions (gold: 1.0)."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    base = environment_factory("tau2/mock-v0", asynchronous=True)
    log = []

    class Recorded(base):
        async def get_reward(self):
            r = await base.get_reward(self)
            log.append((self.info["task_id"], copy.deepcopy(self.actions), r))
            return r

    Recorded.__name__ = base.__name__
    rows = mock_rows(2)
    probe = base().env.unwrapped
    plans = {r["task_id"]: gold_tool_call_texts(probe.tasks[probe.tasks.index_of(r["task_id"])], solo=False) for r in rows}
    openings = {}
    for r in rows:
        inst = base()
        openings[inst.reset(**r)] = r["task_id"]
    assert len(openings) == len(rows)
    tok = _tokenizer(tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                      max_completion_length=2000, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                      use_vllm=False, learning_rate=1e-4, seed=0, max_tool_calling_iterations=8, shuffle_dataset=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32),
                              processing_class=tok, args=args, train_dataset=rows, environment_factory=Recorded)
    assert trainer._has_async_funcs
    seen = []

    def generate(input_ids=None, attention_mask=None, **kw):
        outs = []
        for b in range(input_ids.shape[0]):
            text = tok.decode(input_ids[b][attention_mask[b].bool()])
            task_id = next(t for o, t in openings.items() if o in text)
            turn = text.count("<tool_response>")
            first = turn == 0 and sum(1 for t in seen if t == task_id) % 2 == 1
            if turn == 0:
                seen.append(task_id)
            say = "I cannot help." if first else plans[task_id][turn]
            outs.append(tok.encode(say + "<|im_end|>", add_special_tokens=False))
        width = max(map(len, outs))
        gen = torch.tensor([o + [tok.pad_token_id] * (width - len(o)) for o in outs])
        return torch.cat([input_ids, gen], dim=1)

    trainer.model.generate = generate
    trainer.train()
    assert len(log) == 4
    assert sorted(r for _, _, r in log).count(1.0) >= 2  # the gold rollouts (a do-nothing one may score 1.0 too)
    for task_id, actions, r in log:
        assert r == _replay("tau2/mock-v0", task_id, actions)
    logged = [h[f"rewards/{base.__name__}/mean"] for h in trainer.state.log_history if f"rewards/{base.__name__}/mean" in h]
    assert logged == [pytest.approx(sum(r for *_, r in log) / 4)]


# ------------------------------------------------------------------------------------------------ TRL's async worker
class _FakeVLLM:
    """vLLM's ``/v1/completions`` as TRL's async rollout worker calls it (``prompt`` = token ids, ``return_token_ids``,
    ``logprobs``): decodes the prompt, finds its task by the customer's opening, and answers the next text of that
    task's plan (turn = number of tool responses so far)."""

    def __init__(self, tok, plans_by_opening: dict[str, list[str]]):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = tok.decode(body["prompt"])
                plan = next(p for o, p in plans_by_opening.items() if o in text)
                ids = tok.encode(plan[text.count("<tool_response>")] + "<|im_end|>", add_special_tokens=False)
                fake.requests += 1
                out = json.dumps({"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out.encode())

        self.requests = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run_async_worker(cls, rows, tok, plans_by_opening, n_samples: int, max_inflight: int = 4, timeout_s: float = 300,
                     reward_funcs=()):
    """Run TRL's ``AsyncRolloutWorker`` (spawned child) over ``rows`` until ``n_samples`` scored samples arrive."""
    from accelerate.state import PartialState
    from trl.experimental.async_grpo import async_rollout_worker as arw

    PartialState()  # as AsyncGRPOTrainer's Accelerator does: the worker logs through accelerate
    fake = _FakeVLLM(tok, plans_by_opening)
    saved = arw.is_vllm_available
    arw.is_vllm_available = lambda: True  # the parent's guard only: the worker talks to vLLM over HTTP
    try:
        worker = arw.AsyncRolloutWorker(
            model_name="tiny", dataset=rows, reward_funcs=list(reward_funcs), processing_class=tok,
            eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")], environment_factory=cls, num_generations=2,
            max_inflight_tasks=max_inflight, vllm_server_url=fake.url, max_tokens=4096, max_tool_calling_iterations=16,
            request_timeout=60, child_ready_timeout=int(timeout_s))
    finally:
        arw.is_vllm_available = saved
    samples = []
    try:
        worker.start()
        deadline = time.monotonic() + timeout_s
        while len(samples) < n_samples:
            worker.check_health(stale_after_s=timeout_s)
            try:
                samples.append(worker.rollout_buffer.get(timeout=1.0))
            except queue.Empty:
                assert time.monotonic() < deadline, f"only {len(samples)} samples in {timeout_s} s"
    finally:
        worker.stop()
        fake.close()
    return samples


@pytest.mark.slow  # 22.7 s of the unit stage at load ~4 (issue 45): an end-to-end TRL async run
def test_trl_async_rollout_worker_runs_our_envs(tiny_dir):
    """TRL's async rollout worker spawns a child and pickles our classes and reward function into it (this failed
    before: PicklingError), and runs, in multi-environment mode, 2 concurrent rollouts per row of: tau2 mock with
    the sync class, tau2 mock with the async class (gold actions), GSM8K-v1 as a one-turn env (gold answer, scored
    by EnvReward on its rows only). Every tool reply equals the reply of a local class replaying the same calls;
    the env reward (column ``rewards/<class name>``) equals gym.make's (1.0); GSM8K's column is 1.0 on its rows and
    NaN (not applicable) on the others."""
    import math

    from datasets import Dataset

    from envs.adapters.trl_env import TRLOneTurnEnv, _one_turn_class

    sync_cls, async_cls = environment_factory("tau2/mock-v0"), environment_factory("tau2/mock-v0", asynchronous=True)
    assert async_cls.__name__ == "Tau2MockV0AsyncEnv" != sync_cls.__name__
    factories = {"sync": sync_cls, "async": async_cls, "gsm8k": _one_turn_class("GSM8K-v1", {"split": "test"})}
    assert issubclass(factories["gsm8k"], TRLOneTurnEnv)
    mock = mock_rows(2)
    rows = [{**r, "environment": name} for r, name in zip(mock, ["sync", "async"])]
    rows += [{**r, "environment": "async"} for r in mock.select([1])]
    gsm = dataset("GSM8K-v1", "test", limit=1, environment="gsm8k")
    rows.append(dict(gsm[0]))
    local = environment_factory("tau2/mock-v0")()
    plans, by_opening = {}, {}
    for r in rows[:3]:
        opening = local.reset(**{k: v for k, v in r.items() if k != "environment"})
        plans[opening], by_opening[opening] = gold_tool_call_texts(local.env.unwrapped.task, solo=False), r
    _, info = gym.make("GSM8K-v1", split="test").reset(options={"task_id": gsm[0]["task_id"]})
    question = gsm[0]["prompt"][-1]["content"]
    plans[question] = [f"Reasoning.\n#### {info['answer']}"]
    tok = _tokenizer(tiny_dir)
    grader = EnvReward("GSM8K-v1", environment="gsm8k", split="test")
    samples = run_async_worker(factories, Dataset.from_list(rows), tok, plans, n_samples=2 * len(rows),
                               reward_funcs=[grader])
    assert len(samples) == 2 * len(rows)
    seen = {"sync": 0, "async": 0, "gsm8k": 0}
    for s in samples:
        content = s.prompt[-1]["content"]
        if question in content:
            seen["gsm8k"] += 1
            assert s.metrics["rewards/gsm8k"] == 1.0 and s.metrics["reward"] == 1.0
            assert math.isnan(s.metrics[f"rewards/{sync_cls.__name__}"]) and math.isnan(s.metrics[f"rewards/{async_cls.__name__}"])
            continue
        opening = next(o for o in plans if o in content)
        row = by_opening[opening]
        name = row["environment"]
        seen[name] += 1
        calls = [(c["function"]["name"], c["function"]["arguments"])
                 for m in s.completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        replies = [m["content"] for m in s.completion if m["role"] == "tool"]
        local.reset(**{k: v for k, v in row.items() if k != "environment"})
        assert replies == [str(getattr(local, n)(**a)) for n, a in calls]
        expected = local.get_reward()
        assert expected == _replay("tau2/mock-v0", row["task_id"], local.actions) == 1.0
        own, other = (sync_cls, async_cls) if name == "sync" else (async_cls, sync_cls)
        assert s.metrics[f"rewards/{own.__name__}"] == expected
        assert math.isnan(s.metrics[f"rewards/{other.__name__}"]) and math.isnan(s.metrics["rewards/gsm8k"])
    assert seen == {"sync": 2, "async": 4, "gsm8k": 2}
