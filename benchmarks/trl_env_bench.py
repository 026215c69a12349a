"""TRL's rollout loop over our tau2 env vs over tau2's own ``AgentGymEnv``, wrapped the same way, in one process.

Both sides are TRL environment classes with the same tool methods (:func:`envs.adapters.trl_env.environment_factory`); the
``tau2`` side replaces the env under them by tau2's ``tau2.gym.AgentGymEnv`` (thread per episode, 10 ms polling;
scripted customer as in ``benchmarks/env_bench.py``), each call sent as tau2's action string (JSON tool call,
plain text for the customer). One rollout batch = ``GRPOTrainer._generate_and_score_completions`` on the tasks'
rows: TRL's real loop (prompt rendering, tool-call parsing, tool execution, reward, old log-probs with the tiny
model) with the model's ``generate`` replaced by a script that writes each task's gold actions, then a plain
answer (so both sides replay identical episodes; the model's generation time is left out of both).

steps/s = tool calls executed / wall time of the rollout batch. Batches alternate between sides (same load).

``--mode overlap`` (see :func:`overlap`): episodes/s with an LLM customer of fixed latency, sync vs async tool
classes, in GRPOTrainer's loop and in TRL's async rollout worker.

Usage::

    python benchmarks/trl_env_bench.py --domain mock --tasks 4 --repeats 3
    python benchmarks/trl_env_bench.py --mode overlap --tasks 4 --latency 0.5 --messages 2 --repeats 2
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import envs  # noqa: E402
from envs.adapters.trl_env import SEND_MESSAGE_TOOL, dataset, environment_factory, gold_tool_call_texts  # noqa: E402

gym.register_envs(envs)


def tau2_side(cls, domain: str, solo: bool):
    """``cls`` (our TRL env class) with tau2's AgentGymEnv under the same tool methods."""
    from env_bench import make_tau2_gym_env

    class OnAgentGymEnv(cls):
        def reset(self, **row):
            self._agym = make_tau2_gym_env(domain, str(row["task_id"]), solo)
            obs, _ = self._agym.reset()
            self.actions, self.info, self.reward, self.ended, self._started = [], {}, None, False, True
            return None if solo else obs.rsplit("user: ", 1)[-1]

        def get_reward(self):
            if not self.ended:
                self._step({"role": "assistant", "content": None,
                            "tool_calls": [{"function": {"name": "done", "arguments": {}}}]})
            return float(self.reward)

        def _step(self, action):
            self.actions.append(copy.deepcopy(action))
            if action.get("tool_calls"):
                f = action["tool_calls"][0]["function"]
                text = json.dumps({"name": f["name"], "arguments": f["arguments"]})
                if f["name"] == "done" and not solo:
                    text = "###STOP###"
            else:
                text = action["content"]
            obs, reward, term, trunc, info = self._agym.step(text)
            self.info = {"termination_reason": info.get("termination_reason")} if isinstance(info, dict) else {}
            if term or trunc:
                self.ended, self.reward = True, float(reward)
                if self._agym._orchestrator_thread is not None:
                    self._agym._orchestrator_thread.join(timeout=5)
            role = "user" if action.get("content") else "tool"
            return [{"role": role, "content": obs}]

    OnAgentGymEnv.__name__ = cls.__name__
    return OnAgentGymEnv


def scripted_generate(tok, plans):
    """A ``generate`` (model.generate's signature: ``input_ids``/``attention_mask`` ``[batch, seq]`` -> ``[batch,
    seq + new]``, right-padded with the pad token) that plays ``plans[k]`` (list of completion texts, one per turn) for
    the k-th rollout of the batch: its first turn is tagged ``[k]`` (rows in input order), later turns find the tag
    in the conversation after the last system message; turn = number of tool responses so far. Raises ``IndexError``
    when a rollout asks for more turns than its plan has. Also used by tests/test_trl_env.py."""

    def generate(input_ids=None, attention_mask=None, **kwargs):
        outs = []
        for b in range(input_ids.shape[0]):
            text = tok.decode(input_ids[b][attention_mask[b].bool()])
            tail = text.rsplit("<|im_start|>system", 1)[-1]
            if "<|im_start|>assistant\n[" in tail:
                k = int(tail.split("<|im_start|>assistant\n[", 1)[1].split("]", 1)[0])
                say = plans[k][text.count("<tool_response>")]
            else:  # first turn: rows in input order
                k = generate.next_row
                generate.next_row += 1
                say = f"[{k}]" + plans[k][0]
            outs.append(tok.encode(say + "<|im_end|>", add_special_tokens=False))
        width = max(map(len, outs))
        gen = torch.tensor([o + [tok.pad_token_id] * (width - len(o)) for o in outs])
        return torch.cat([input_ids, gen], dim=1)

    generate.next_row = 0
    return generate




def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--domain", default="mock")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", choices=["steps", "overlap"], default="steps",
                   help="steps: ours vs AgentGymEnv (steps/s); overlap: sync vs async classes with an LLM customer")
    p.add_argument("--latency", type=float, default=0.5, help="overlap: seconds per LLM-customer call")
    p.add_argument("--messages", type=int, default=2, help="overlap: send_message_to_user calls per episode")
    p.add_argument("--inflight", type=int, default=8, help="overlap: the async worker's max_inflight_tasks")
    args = p.parse_args(argv)
    if args.mode == "overlap":
        return overlap(args)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from torchrl_grpo.model_store import load_model_and_tokenizer

    env_id = f"tau2/{args.domain}-v0"
    ours = environment_factory(env_id)
    solo = ours().env.unwrapped.solo
    rows = dataset(env_id, limit=args.tasks)
    tasks = {t: ours().env.unwrapped.tasks[ours().env.unwrapped.tasks.index_of(t)] for t in rows["task_id"]}
    tmp = tempfile.mkdtemp()
    model, tok = load_model_and_tokenizer("tiny-random")
    # tau2 prompts with their tool schemas are ~10-25k tokens in tiny-random's byte-level vocabulary: lift the 4096
    # limit (RoPE, random weights) so that TRL's overlong check does not cut the gold episodes
    model.config.max_position_embeddings = 1 << 16
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    trainers = {}
    for side, cls in (("ours", ours), ("tau2", tau2_side(ours, args.domain, solo))):
        tk = AutoTokenizer.from_pretrained(tmp)
        tk.response_template = qwen3_template
        cfg = GRPOConfig(output_dir=os.path.join(tmp, side), per_device_train_batch_size=2 * len(rows), num_generations=2,
                         max_completion_length=4096, report_to=[], use_cpu=True, use_vllm=False, max_steps=1,
                         max_tool_calling_iterations=64, save_strategy="no")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainers[side] = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tmp), processing_class=tk,
                                         args=cfg, train_dataset=rows, environment_factory=cls)
    inputs = [dict(r) for r in rows for _ in range(2)]  # a group of 2 rollouts per task (TRL's minimum)
    plans = [gold_tool_call_texts(tasks[r["task_id"]], solo) for r in inputs]
    times = {"ours": [], "tau2": []}
    rewards, calls = {}, {}
    for _rep in range(args.repeats):
        for side, tr in trainers.items():
            tr.model.generate = scripted_generate(tr.processing_class, plans)
            t0 = time.perf_counter()
            tr._generate_and_score_completions(copy.deepcopy(inputs))
            times[side].append(time.perf_counter() - t0)
            rewards[side] = [e.reward for e in tr.environments]
            calls[side] = sum(len(e.actions) for e in tr.environments)
    load = os.getloadavg()
    print(f"# TRL rollout loop, {env_id}, {len(rows)} tasks x 2 rollouts x {args.repeats} repeats, {calls['ours']} env steps per batch "
          f"(tool calls + get_reward's done; tau2 side: {calls['tau2']}), load average {load[0]:.1f}")
    for side in times:
        med = statistics.median(times[side])
        print(f"{side:5s}: median batch {med:.3f} s, {calls[side] / med:.1f} steps/s, rewards {rewards[side]}")
    print(f"ratio ours/tau2 steps/s: {statistics.median(times['tau2']) / statistics.median(times['ours']):.2f}")


# ---------------------------------------------------------------------------------------------------------------
# --mode overlap: episodes/s with an LLM customer of fixed latency, sync vs async tool classes, in TRL's two loops
# ---------------------------------------------------------------------------------------------------------------
def customer_stand_in(latency_s: float):
    """An OpenAI-compatible ``/v1/chat/completions`` that answers "Okay, thanks." after ``latency_s`` seconds (the
    LLM customer's latency; tau2's LLM user calls it through litellm). Returns ``(base_url, server)``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency_s)
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "stand-in",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "Okay, thanks."}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1", server


def completions_stand_in(tok, plan: list[str]):
    """vLLM's ``/v1/completions`` for TRL's async rollout worker: answers ``plan[turn]`` (turn = tool responses so far)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            turn = tok.decode(body["prompt"]).count("<tool_response>")
            ids = tok.encode(plan[min(turn, len(plan) - 1)] + "<|im_end|>", add_special_tokens=False)
            out = json.dumps({"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-1.0] * len(ids)}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def overlap(args) -> None:
    """Episodes/s of tau2/mock-v0 with an LLM customer of fixed latency (``--latency``): each episode = reset (the
    customer's opening: 1 call), ``--messages`` send_message_to_user calls (1 call each), then an answer
    (get_reward's ``done``), so ``messages + 1`` customer calls. Sync vs async class in GRPOTrainer's rollout loop
    (one batch of ``--tasks`` x 2 rollouts, ``_generate_and_score_completions``, model scripted) and in TRL's
    async rollout worker (spawned child, ``--inflight`` rollouts in flight; rate over the samples after the first
    ``--tasks`` x 2)."""
    import queue

    from accelerate.state import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from trl.experimental.async_grpo import async_rollout_worker as arw

    from torchrl_grpo.model_store import load_model_and_tokenizer

    base_url, customer = customer_stand_in(args.latency)
    kw = {"user": "llm", "user_llm": "openai/stand-in", "user_llm_base_url": base_url}
    os.environ.setdefault("OPENAI_API_KEY", "stand-in")
    rows = dataset("tau2/mock-v0", limit=args.tasks, **kw)
    plan = [f'<tool_call>\n{{"name": "{SEND_MESSAGE_TOOL}", "arguments": {{"content": "Message {i}."}}}}\n</tool_call>'
            for i in range(args.messages)] + ["Done."]
    tmp = tempfile.mkdtemp()
    model, tok = load_model_and_tokenizer("tiny-random")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tk = AutoTokenizer.from_pretrained(tmp)
    tk.response_template = qwen3_template
    results = {}
    n = 2 * len(rows)
    calls = args.messages + 1
    for asynchronous in (False, True):
        cls = environment_factory("tau2/mock-v0", asynchronous=asynchronous, **kw)
        cfg = GRPOConfig(output_dir=os.path.join(tmp, str(asynchronous)), per_device_train_batch_size=n, num_generations=2,
                         max_completion_length=2048, report_to=[], use_cpu=True, use_vllm=False, max_steps=1,
                         max_tool_calling_iterations=16, save_strategy="no")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tr = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tmp), processing_class=tk, args=cfg,
                             train_dataset=rows, environment_factory=cls)

        def generate(input_ids=None, attention_mask=None, **k):
            outs = []
            for b in range(input_ids.shape[0]):
                turn = tk.decode(input_ids[b][attention_mask[b].bool()]).count("<tool_response>")
                outs.append(tk.encode(plan[turn] + "<|im_end|>", add_special_tokens=False))
            width = max(map(len, outs))
            return torch.cat([input_ids, torch.tensor([o + [tk.pad_token_id] * (width - len(o)) for o in outs])], dim=1)

        tr.model.generate = generate
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tr._generate_and_score_completions([dict(r) for r in rows for _ in range(2)])
            times.append(time.perf_counter() - t0)
            assert all(len(e.actions) == args.messages + 1 for e in tr.environments), [len(e.actions) for e in tr.environments]
        results[("GRPOTrainer", asynchronous)] = n / statistics.median(times)

        PartialState()
        url, vllm = completions_stand_in(tk, plan)
        saved, arw.is_vllm_available = arw.is_vllm_available, (lambda: True)
        try:
            worker = arw.AsyncRolloutWorker(
                model_name="tiny", dataset=rows, reward_funcs=[], processing_class=tk,
                eos_token_ids=[tk.convert_tokens_to_ids("<|im_end|>")], environment_factory=cls, num_generations=2,
                max_inflight_tasks=args.inflight, vllm_server_url=url, max_tokens=256, max_tool_calling_iterations=16)
        finally:
            arw.is_vllm_available = saved
        stamps = []
        try:
            worker.start()
            while len(stamps) < n * (args.repeats + 1):
                worker.check_health(stale_after_s=600)
                try:
                    worker.rollout_buffer.get(timeout=1.0)
                    stamps.append(time.perf_counter())
                except queue.Empty:
                    pass
        finally:
            worker.stop()
            vllm.shutdown()
        results[("AsyncRolloutWorker", asynchronous)] = (len(stamps) - n) / (stamps[-1] - stamps[n - 1])
    customer.shutdown()
    load = os.getloadavg()
    print(f"# tau2/mock-v0, LLM customer stand-in {args.latency:.2f} s per call, {calls} calls per episode "
          f"(sequential bound {1 / (calls * args.latency):.2f} episodes/s), {len(rows)} tasks x 2 rollouts, "
          f"async worker {args.inflight} in flight; load average {load[0]:.1f}")
    print("| loop | sync class, episodes/s | async class, episodes/s |")
    print("|---|---:|---:|")
    for loop in ("GRPOTrainer", "AsyncRolloutWorker"):
        print(f"| {loop} | {results[(loop, False)]:.2f} | {results[(loop, True)]:.2f} |")


if __name__ == "__main__":
    main()
