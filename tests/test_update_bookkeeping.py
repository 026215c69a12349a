"""GRPOUpdate's bookkeeping beside the algorithm (torchrl_grpo.training.update): data-parallel minibatch sizing
(_plan) and the FSDP lockstep padding of a minibatch's passes (_lockstep), on a fake two-rank group (no process
group: the collectives are stubbed)."""
from __future__ import annotations

import torch

import torchrl_grpo.training.update as update_mod
from torchrl_grpo.distributed.data_parallel import DataParallel
from torchrl_grpo.training.update import GRPOUpdate


class TwoRanks(DataParallel):
    """Rank 0 of two; the other rank holds ``other`` episodes and ``extra`` more passes than this one."""

    def __init__(self, other: int = 0, extra: int = 0) -> None:
        super().__init__(rank=0, world_size=2)
        self.other, self.extra = other, extra

    def _all_reduce(self, value, op):
        return value + self.other if op == "sum" else value + self.extra

    def lockstep(self, passes, model):
        return list(passes) + [None] * self.extra  # as DataParallel.lockstep pads an FSDP model's passes


def _update(dp=None, *, minibatch_size=0, ppo_epochs=1):
    upd = GRPOUpdate(torch.nn.Linear(1, 1), None, None, reference=None, device=torch.device("cpu"),
                     autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=ppo_epochs,
                     minibatch_size=minibatch_size, micro_batch_size=1, max_tokens_per_mb=0, max_grad_norm=1.0,
                     anchor="behaviour", exact_log_probs=True, seed=0, dp=dp)
    idle: list[bool] = []
    upd.idle_pass = lambda model, *, backward, device=None: idle.append(backward)
    return upd, idle


def test_plan_sizes_minibatches_over_all_ranks():
    assert _update()[0]._plan(5) == (1, 5, False)  # one process, the whole batch: one optimizer step
    assert _update(minibatch_size=2)[0]._plan(5) == (3, 2, True)
    assert _update(ppo_epochs=2)[0]._plan(5) == (1, 5, True)
    # 5 + 5 episodes over two ranks, global minibatch 4: 3 minibatches, each with ceil(5 / 3) = 2 of this rank's rows
    assert _update(TwoRanks(other=5), minibatch_size=4)[0]._plan(5) == (3, 2, True)
    # this rank holds nothing: it still runs the other rank's minibatch count (with empty minibatches)
    assert _update(TwoRanks(other=3), minibatch_size=0)[0]._plan(0) == (1, 1, False)


def _run(upd, passes, *, stop_after: int | None = None, backward: bool = True):
    got: list = []
    stop = (lambda: len(got) >= stop_after) if stop_after is not None else (lambda: False)
    for item in upd._lockstep(passes, upd.model, backward=backward, stop=stop):
        got.append(item)
    return got


def test_lockstep_runs_idle_passes_for_the_padding_and_after_a_stop_under_fsdp(monkeypatch):
    monkeypatch.setattr(update_mod, "is_fsdp", lambda model: True)
    upd, idle = _update(TwoRanks(extra=2))
    assert _run(upd, ["a", "b"]) == ["a", "b"] and idle == [True, True]
    idle.clear()
    # a non-finite loss after the first micro-batch: its other passes and the padding all run idle (no-grad: eval)
    assert _run(upd, ["a", "b", "c"], stop_after=1, backward=False) == ["a"] and idle == [False] * 4


def test_lockstep_without_fsdp_pads_nothing_and_a_stop_ends_the_passes():
    upd, idle = _update(TwoRanks(extra=2))  # data parallel, not sharded: DataParallel.lockstep would not pad
    upd.dp.extra = 0
    assert _run(upd, ["a", "b", "c"], stop_after=1) == ["a"] and idle == []
    assert _run(_update()[0], ["a", "b"]) == ["a", "b"]
