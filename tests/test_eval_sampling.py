"""Evaluation's sampling settings and its split over data-parallel ranks (issue 25, items C4 and C5).

* C4: the sampled pass@k episodes are drawn with the run's one sampling config (``gconfig.temperature``, ``top_p``,
  ``top_k``, ``max_new_tokens``), the greedy ones with the same config at temperature 0.
* C5: under torchrun every rank evaluates its share of the eval tasks (no rank idles in a collective while rank 0
  evaluates alone) and the shares are gathered into the metrics a single process computes.
"""
from __future__ import annotations

import threading

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.rollout import evaluation as evaluation
from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.assembly import build_trainer


def test_sampled_evaluation_uses_gconfig_top_p_top_k_and_greedy_is_temperature_0(tmp_path):
    """C4: the pass@k episodes' SamplingConfig carries gconfig's temperature / top_p / top_k / max_new_tokens."""
    cfg = make_cfg(gconfig={"n_samples": 2, "max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9, "top_k": 5},
                   train={"batch_size": 1}, eval={"n_problems": 2, "pass_k": 2, "greedy": True})
    trainer = build_trainer(cfg, tmp_path)
    seen: list[tuple[int, SamplingConfig]] = []
    real = trainer.eval_collector.collect

    def spy(tasks, n, **kw):
        seen.append((n, kw.get("sampling")))
        return real(tasks, n, **kw)

    trainer.eval_collector.collect = spy
    try:
        out = trainer.evaluate()
    finally:
        trainer.close()
    assert "eval/pass@2" in out
    greedy = [s for n, s in seen if n == 1]
    sampled = [s for n, s in seen if n == 2]
    assert greedy and sampled
    for s in greedy:
        assert s.temperature == 0.0 and s.max_new_tokens == 6
    for s in sampled:
        assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens) == (0.7, 0.9, 5, 6)
        assert s.seed is not None  # a fixed seed: the same checkpoint gets the same pass@k


def test_sampled_evaluation_of_a_greedy_run_samples_at_temperature_1():
    """gconfig.temperature=0 (greedy training rollouts): pass@k needs samples, so it samples at T=1 with the
    run's top_p / top_k (the rule the trainer used before, kept in one place)."""
    col = FakeEvalCollector()
    evaluation.evaluate(col, task_indices=[0, 1], sampling=SamplingConfig(max_new_tokens=4, temperature=0.0,
                                                                          top_p=0.8, top_k=3), pass_k=2)
    (g, s) = col.samplings
    assert g.temperature == 0.0
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens) == (1.0, 0.8, 3, 4)


# ---------------------------------------------------------------------------------------------------- C5: shares
class FakeEvalCollector:
    """A collector whose episodes have a known reward: task i, sample j -> 1.0 when (i + j) % 3 == 0, else 0.25
    (so tasks differ in their number of successes); records the task indices and sampling configs it was given."""

    def __init__(self):
        self.seen: list[int] = []
        self.samplings: list[SamplingConfig] = []
        self.last_stats = {"rollout/generated_tokens": 10.0, "rollout/generate_time_s": 0.5}

    def collect(self, tasks, n, *, step=0, sampling=None):
        self.samplings.append(sampling)
        idx = [t["index"] for t in tasks for _ in range(n)]
        self.seen.extend(t["index"] for t in tasks)
        rew = [1.0 if (t["index"] + j) % 3 == 0 else 0.25 for t in tasks for j in range(n)]
        N = len(idx)
        td = TensorDict({"reward": torch.tensor(rew), "num_turns": torch.ones(N, dtype=torch.long),
                         "response_tokens": torch.full((N,), 3), "action_errors": torch.zeros(N, dtype=torch.long),
                         "length_truncated": torch.zeros(N, dtype=torch.bool),
                         "context_truncated": torch.zeros(N, dtype=torch.bool),
                         "infra_error": torch.zeros(N, dtype=torch.bool)}, batch_size=[N])
        td["task"] = NonTensorStack(*[{"index": i} for i in idx])
        td["info"] = NonTensorStack(*[{"task_id": str(i)} for i in idx])
        return td


class ThreadRanks:
    """``world`` simulated ranks in threads; ``all_gather_object(obj)`` is an all-gather (every rank gets the list of every
    rank's object, in rank order) built on a barrier, as ``torch.distributed.all_gather_object`` behaves."""

    def __init__(self, world: int):
        self.world, self.box = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def rank(self, r: int):
        ranks = self

        class DP:
            rank, world_size, enabled, is_main = r, ranks.world, ranks.world > 1, r == 0

            @staticmethod
            def all_gather_object(obj):
                ranks.box[r] = obj
                ranks.barrier.wait()
                out = list(ranks.box)
                ranks.barrier.wait()  # nobody overwrites its slot before every rank has read the list
                return out

        return DP()


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_evaluates_its_share_and_the_gathered_metrics_equal_one_process(world):
    tasks = [5, 1, 4, 2, 0, 7, 3]
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0)
    single_rows: list = []
    single = evaluation.evaluate(FakeEvalCollector(), task_indices=tasks, sampling=sampling, pass_k=3,
                                 episodes=single_rows)
    ranks, cols = ThreadRanks(world), [FakeEvalCollector() for _ in range(world)]
    outs, rows, errors = [None] * world, [[] for _ in range(world)], []

    def run(r):
        try:
            outs[r] = evaluation.evaluate(cols[r], task_indices=tasks, sampling=sampling, pass_k=3,
                                          episodes=rows[r], dp=ranks.rank(r))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads), errors
    for r in range(world):  # each rank rolled out its round-robin share, greedy then sampled, nothing else
        share = tasks[r::world]
        assert cols[r].seen == share + share
    for r in range(world):
        for k in ("eval/accuracy", "eval/reward", "eval/pass@3", "eval/pass^3", "eval/pass@1"):
            assert outs[r][k] == pytest.approx(single[k]), (r, k)
        # tokens of every rank over the longest rank's generation time: one collect call of 10 tokens in 0.5 s each
        assert outs[r]["eval/tokens_per_s"] == pytest.approx(world * 10.0 / 0.5)
    # rank 0 holds every episode row, in the single process's order
    key = [(x["mode"], x["task"]["index"], x["sample"], x["reward"]) for x in single_rows]
    assert [(x["mode"], x["task"]["index"], x["sample"], x["reward"]) for x in rows[0]] == key


def test_trainer_evaluates_on_a_non_main_rank_and_returns_nothing_to_log(tmp_path):
    """A rank other than 0 runs its share of the evaluation (it used to return at once and wait in the next
    collective for as long as rank 0 evaluated: a tau2 eval of ~48 min against a 10-30 min collective timeout)."""
    cfg = make_cfg(gconfig={"n_samples": 2, "max_new_tokens": 4}, train={"batch_size": 1}, eval={"n_problems": 4})
    trainer = build_trainer(cfg, tmp_path)
    seen: list = []
    real = trainer.eval_collector.collect
    trainer.eval_collector.collect = lambda tasks, n, **kw: seen.extend(t["index"] for t in tasks) or real(tasks, n,
                                                                                                            **kw)
    gathered: list = []

    class Rank1:
        rank, world_size, enabled, is_main = 1, 2, True, False

        @staticmethod
        def all_gather_object(obj):  # rank 0's share is the same size here (4 tasks, 2 ranks): stand its part in with a copy
            gathered.append(obj)
            return [obj, obj]

        def __getattr__(self, name):  # the rest of the DataParallel interface: as one process
            from torchrl_grpo.distributed.data_parallel import SINGLE

            return getattr(SINGLE, name)

    trainer.components.dp = Rank1()
    try:
        out = trainer.evaluate()
    finally:
        trainer.close()
    tasks = trainer.components.env_side.eval_tasks()
    assert seen == tasks[1::2]
    assert gathered and out == {}
