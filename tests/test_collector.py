"""Collector: token-in/token-out multi-turn episodes, assistant mask, behaviour log-probs, truncation."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.rollout.chat_tokens import ChatRenderer
from torchrl_grpo.rollout.collector import GroupCollector
from torchrl_grpo.objectives.loss import token_log_probs

REPLIES = ["Let me look that up.", "Found it: 42.", "Anything else?"]


class ScriptedChatEnv(gym.Env):
    """Three assistant turns: after turn 1 a tool result, after turn 2 a user reply, turn 3 ends it."""

    def __init__(self, split="train"):
        self.observation_space = gym.spaces.Text(4096)
        self.action_space = gym.spaces.Text(4096)
        self.num_tasks = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        self.messages = [{"role": "system", "content": "You are a helpful agent."},
                         {"role": "user", "content": f"Question {options.get('index', 0)}?"}]
        return list(self.messages), {"messages": list(self.messages)}

    def step(self, action):
        self.messages.append({"role": "assistant", "content": action})
        self.turn += 1
        if self.turn == 1:
            new = [{"role": "tool", "content": '{"result": 42}', "tool_call_id": "c1"}]
        elif self.turn == 2:
            new = [{"role": "user", "content": "Thanks! One more thing."}]
        else:
            return [], 1.0, True, False, {"messages": list(self.messages), "termination_reason": "agent_stop"}
        self.messages += new
        return new, 0.0, False, False, {"messages": list(self.messages)}


class ScriptedBackend(RolloutBackend):
    """Returns the tokenisation of REPLIES[turn] + eos, with fake log-probs -(position+1)/100."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.calls = 0
        self.policy_version = 7

    def generate(self, prompts, sampling):
        text = REPLIES[self.calls % len(REPLIES)]
        self.calls += 1
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return [Generation(ids, [-(i + 1) / 100 for i in range(len(ids))], "stop") for _ in prompts]

    def load_weights(self, weights=None):
        self.policy_version += 1


def test_mask_covers_exactly_assistant_tokens_and_matches_fresh_render(tok):
    be = ScriptedBackend(tok)
    col = GroupCollector(ScriptedChatEnv, be, tok, SamplingConfig(max_new_tokens=32), max_turns=5)
    td = col.collect([{"index": 0}], n_samples=2)
    assert td.shape == (2,)
    L = int(td["attention_mask"][0].sum())
    ids = td["tokens"][0, :L].tolist()
    mask = td["response_mask"][0, :L].tolist()
    # the accumulated ids equal a fresh render of the final conversation
    msgs = td["info"][0]["messages"]
    fresh = ChatRenderer(tok)._render(msgs, add_generation_prompt=False)
    assert ids == fresh[: len(ids)] and len(fresh) - len(ids) == len(ChatRenderer(tok).assistant_suffix)
    # masked tokens are exactly the three generated replies (each + eos), in order
    expected = []
    for r in REPLIES:
        expected += tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]
    assert [t for t, m in zip(ids, mask) if m] == expected
    # behaviour log-probs sit on masked tokens only
    lp = td["sample_log_probs"][0, :L]
    assert torch.all(lp[~td["response_mask"][0, :L]] == 0)
    assert torch.all(lp[td["response_mask"][0, :L]] < 0)
    assert td["num_turns"].tolist() == [3, 3]
    assert td["reward"].tolist() == [1.0, 1.0]
    assert td["policy_version"].tolist() == [7, 7]
    assert td["terminated"].all() and not td["truncated"].any()
    assert td["info"][0]["termination_reason"] == "agent_stop"


def test_context_limit_truncates_with_flag(tok):
    be = ScriptedBackend(tok)
    col = GroupCollector(ScriptedChatEnv, be, tok, SamplingConfig(max_new_tokens=32), max_turns=5,
                         max_context_tokens=60)
    td = col.collect([{"index": 1}], n_samples=1)
    assert bool(td["context_truncated"][0])
    assert int(td["attention_mask"][0].sum()) <= 60
    assert td["reward"][0].item() == 0.0


def test_prompt_over_the_limit_ends_unplayed_with_a_warning(tok, caplog):
    col = GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=32), max_turns=5,
                         max_context_tokens=8)
    with caplog.at_level("WARNING"):
        td = col.collect([{"index": 1}], n_samples=2)
    assert td["context_truncated"].all() and not td["response_mask"].any() and (td["reward"] == 0).all()
    assert "max_context_tokens=8" in caplog.text and "2 of 2 episodes" in caplog.text


def test_max_turns_truncates(tok):
    col = GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=32), max_turns=2)
    td = col.collect([{"index": 0}], n_samples=1)
    assert td["num_turns"].item() == 2 and bool(td["truncated"][0]) and not bool(td["terminated"][0])


def test_behaviour_log_probs_match_trainer_recompute(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    be = TransformersBackend(model, pad_token_id=tok.pad_token_id)
    col = GroupCollector(ScriptedChatEnv, be, tok, SamplingConfig(max_new_tokens=12, temperature=1.0), max_turns=3)
    td = col.collect([{"index": 0}, {"index": 1}], n_samples=3, step=5)
    lp, _ = token_log_probs(model, td["tokens"], td["attention_mask"])
    m = td["response_mask"]
    assert m.sum() > 0
    assert torch.allclose(lp[m], td["sample_log_probs"][m], atol=1e-4)
    # groups: 2 tasks x 3 samples, task-major
    assert td["group_id"].tolist() == [0, 0, 0, 1, 1, 1]
    # same step -> same samples (seeds derive from step), another step -> different
    td2 = col.collect([{"index": 0}, {"index": 1}], n_samples=3, step=5)
    assert torch.equal(td["tokens"], td2["tokens"])


def test_env_exception_ends_episode_without_crash(tok):
    class Broken(ScriptedChatEnv):
        def step(self, action):
            raise RuntimeError("boom")

    col = GroupCollector(Broken, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=3)
    td = col.collect([{"index": 0}], n_samples=1)
    assert td["info"][0]["termination_reason"] == "env_error"
    assert "boom" in td["info"][0]["error"]
    assert td["reward"].item() == 0.0


def test_collector_is_a_torchrl_collector_over_text_env(tok):
    """Issue 9: a torchrl BaseCollector that drives envs.adapters.torchrl_env.TextEnv; iterating yields the documented batch for
    tasks(step), with the env seeds of the step; state_dict / set_seed / shutdown as for any TorchRL collector."""
    from torchrl.collectors import BaseCollector

    from envs.adapters.torchrl_env import TextEnv

    seen = []

    class SeedRecordingEnv(ScriptedChatEnv):
        def reset(self, *, seed=None, options=None):
            seen.append(seed)
            return super().reset(seed=seed, options=options)

    col = GroupCollector(SeedRecordingEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=5,
                         seed=11, tasks=lambda step: [{"index": step}, {"index": step + 1}], n_samples=2,
                         total_batches=2)
    assert isinstance(col, BaseCollector)
    batches = list(col)
    assert len(batches) == 2 and all(b.batch_size == torch.Size([4]) for b in batches)
    assert [t["index"] for t in batches[1]["task"]] == [1, 1, 2, 2]
    assert batches[0]["group_id"].tolist() == [0, 0, 1, 1]
    assert batches[0]["reward"].tolist() == [1.0] * 4 and batches[0]["num_turns"].tolist() == [3] * 4
    assert seen == [11 + i for i in range(4)] + [11 + 100_003 + i for i in range(4)]
    assert isinstance(col._text_envs[4], TextEnv)
    # the conversation reaches the batch's info (TextEnv keeps it under "messages")
    assert batches[0]["info"][0]["messages"][-1] == {"role": "assistant", "content": REPLIES[2]}
    assert col.state_dict() == {"seed": 11, "batches": 2}
    col.load_state_dict({"seed": 5, "batches": 0})
    assert col.set_seed(9) == 9 and col.seed == 9
    col.shutdown()
    assert col._pool == []
    with pytest.raises(RuntimeError, match="tasks="):
        next(iter(GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8))))


def test_update_policy_weights_syncs_the_backend(tok):
    class Recording(ScriptedBackend):
        def sync_from(self, model, *, probe=None):
            self.synced = (model, probe)

    be = Recording(tok)
    col = GroupCollector(ScriptedChatEnv, be, tok, SamplingConfig(max_new_tokens=8))
    m = torch.nn.Linear(1, 1)
    col.update_policy_weights_(m, probe=[1, 2])
    assert be.synced == (m, [1, 2])
    with pytest.raises(TypeError, match="nn.Module"):
        col.update_policy_weights_({"w": torch.zeros(1)})


def test_one_failing_env_ends_only_its_own_episode(tok):
    """TextEnv(catch_env_errors=True): env 1 raises on its second step, its episode ends as env_error with the data
    kept; the other episodes of the batch play to the end."""
    made = []

    class FailsOnce(ScriptedChatEnv):
        def __init__(self, **kw):
            super().__init__(**kw)
            made.append(self)

        def step(self, action):
            if self is made[1] and self.turn == 1:
                raise ConnectionError("simulator down")
            return super().step(action)

    col = GroupCollector(FailsOnce, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=5)
    td = col.collect([{"index": 0}], n_samples=3)
    assert td["infra_error"].tolist() == [False, True, False]
    assert td["num_turns"].tolist() == [3, 2, 3]
    assert td["reward"].tolist() == [1.0, 0.0, 1.0]
    assert "simulator down" in td["info"][1]["error"]


def test_evaluate_chunks_tasks_with_progress_and_counts_every_task(tok, monkeypatch):
    """evaluate() collects EVAL_CHUNK tasks per call (so a progress bar can advance) and scores every task once."""
    from torchrl_grpo.rollout import evaluation as evaluation

    monkeypatch.setattr(evaluation, "EVAL_CHUNK", 2)
    calls = []
    col = GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=5)
    real = col.collect
    monkeypatch.setattr(col, "collect", lambda tasks, n, **kw: calls.append((len(tasks), n)) or real(tasks, n, **kw))
    out = evaluation.evaluate(col, task_indices=[0, 1, 2, 3, 0], greedy=True, pass_k=2, progress=True)
    assert calls == [(2, 1), (2, 1), (1, 1), (2, 2), (2, 2), (1, 2)]
    assert out["eval/accuracy"] == 1.0 and out["eval/pass^2"] == 1.0 and out["eval/tokens_per_s"] > 0


def test_evaluate_records_one_row_per_episode_greedy_ones_with_their_conversation(tok):
    """evaluate(episodes=[]) appends a row per episode: greedy rows first (conversation without the system message),
    then the k sampled rows per task (no conversation), each with the task, sample index, reward and how it ended."""
    from torchrl_grpo.rollout import evaluation as evaluation

    col = GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=5)
    rows: list = []
    out = evaluation.evaluate(col, task_indices=[2, 0], greedy=True, pass_k=2, episodes=rows)
    assert out["eval/accuracy"] == 1.0
    assert [(r["mode"], r["task"]["index"], r["sample"]) for r in rows] == [
        ("greedy", 2, 0), ("greedy", 0, 0), ("sampled", 2, 0), ("sampled", 2, 1), ("sampled", 0, 0), ("sampled", 0, 1)]
    for r in rows:
        assert r["reward"] == 1.0 and r["num_turns"] == 3 and r["termination_reason"] == "agent_stop"
        assert r["response_tokens"] > 0 and r["action_errors"] == 0 and not r["length_truncated"]
        assert r["infra_error"] is False and r["context_truncated"] is False
    greedy = [r for r in rows if r["mode"] == "greedy"]
    assert all("messages" not in r for r in rows if r["mode"] == "sampled")
    msgs = greedy[0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert msgs[0]["content"] == "Question 2?" and [m["content"] for m in msgs if m["role"] == "assistant"] == REPLIES
    import json

    json.dumps(rows)  # JSON-ready as logged


def test_token_policy_version_records_each_sampled_tokens_version(tok):
    """Issue 12 t.3 (partial rollouts): ``token_policy_version`` holds the version of every sampled token (-1 off the
    response mask); a generation without ``versions`` gets the backend's version; ``policy_version`` is the oldest."""

    class Versioned(ScriptedBackend):
        def generate(self, prompts, sampling):
            gens = super().generate(prompts, sampling)
            if self.calls == 2:  # second turn: interrupted after 2 tokens by an update to version 8
                self.policy_version = 8
                return [Generation(g.token_ids, g.logprobs, g.finish_reason,
                                   versions=[7, 7] + [8] * (len(g.token_ids) - 2)) for g in gens]
            return gens  # no versions recorded: the backend's current version (7 on turn 1, 8 on turn 3)

    col = GroupCollector(ScriptedChatEnv, Versioned(tok), tok, SamplingConfig(max_new_tokens=32), max_turns=5)
    td = col.collect([{"index": 0}], n_samples=2)
    L = int(td["attention_mask"][0].sum())
    v, m = td["token_policy_version"][0, :L], td["response_mask"][0, :L]
    assert td["token_policy_version"].shape == td["tokens"].shape
    assert torch.all(v[~m] == -1)
    n = [len(tok.encode(r, add_special_tokens=False)) + 1 for r in REPLIES]
    assert v[m].tolist() == [7] * n[0] + [7, 7] + [8] * (n[1] - 2) + [8] * n[2]
    assert td["policy_version"].tolist() == [7, 7]
