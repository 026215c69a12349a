"""Issue 25 C2/C3 on one process: ``loss.adv_scale=batch`` leaves groups dropped for an infrastructure failure out
of the batch std, and :class:`~torchrl_grpo.objectives.loss.LossMetrics` merged over (simulated) ranks gives the metrics of one
process on all their micro-batches. The 2-rank gloo versions: tests/test_distributed.py."""
from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

import tests.toy_envs  # noqa: F401  (registers ToyFlaky-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.objectives.advantage import group_advantages
from torchrl_grpo.objectives.loss import LossMetrics
from torchrl_grpo.assembly import build_trainer


def test_batch_scale_leaves_dropped_infra_groups_out_of_the_std(tmp_path, monkeypatch):
    """ToyFlaky: task 1 raises (env_error), task 3 ends with user_error; their groups are dropped. With
    ``loss.adv_scale=batch`` the kept episodes' advantages are divided by the std of the kept episodes' centred
    advantages only. Before: the dropped groups' zeros entered the std (more episodes, smaller std)."""
    cfg = make_cfg(econfig={"env_id": "ToyFlaky-v0"}, train={"steps": 1, "batch_size": 4},
                   gconfig={"n_samples": 2, "max_new_tokens": 8}, loss={"adv_scale": "batch"})
    trainer = build_trainer(cfg, tmp_path)
    batch = trainer.collector.collect([{"index": i} for i in range(4)], 2)
    seen = []
    update = trainer.updater.__call__
    monkeypatch.setattr(type(trainer.updater), "__call__", lambda self, b, **kw: (seen.append(b.clone()), update(b, **kw))[1])
    trainer._learn(batch)
    trainer.close()
    healthy = ~torch.isin(batch["group_id"], batch["group_id"][batch["infra_error"]])
    assert int(healthy.sum()) == 4 and len(seen) == 1
    kept = batch[healthy]
    expected = group_advantages(kept["reward"], kept["group_id"], scale="batch")
    with_dropped = group_advantages(batch["reward"], batch["group_id"], scale="batch")[healthy]
    assert float(expected.abs().max()) > 0.1
    assert not torch.allclose(expected, with_dropped, rtol=1e-3)  # the defect is visible on this batch
    torch.testing.assert_close(seen[0]["advantage"], expected, rtol=1e-5, atol=1e-6)


def _losses(value: float, ratio_max: float, lw: list[float]) -> TensorDict:
    w = torch.tensor(lw, dtype=torch.float64)
    return TensorDict({"loss_objective": torch.tensor(value), "loss_kl": torch.tensor(0.0),
                       "clip_fraction": torch.tensor(value / 10), "kl_ref": torch.tensor(float("nan")),
                       "ratio_max": torch.tensor(ratio_max), "num_tokens": torch.tensor(float(len(lw))),
                       "ess": torch.tensor(0.5), "ess_log_sum_w": torch.logsumexp(w, 0).float(),
                       "ess_log_sum_w2": torch.logsumexp(2 * w, 0).float()}, batch_size=[])


class _FakeGroup:
    """A two-rank group seen from one rank: ``all_gather_object`` returns both ranks' accumulators."""

    enabled = True

    def __init__(self, other: LossMetrics) -> None:
        self.other = other

    def all_gather_object(self, obj):
        return [obj, self.other._state()]


def test_loss_metrics_reduced_over_ranks_equal_one_process():
    """Issue 25 C3, unit level: rank 0 with micro-batches (3 tokens, 1 token), rank 1 with one of 4 tokens; each
    metric reduced as loss.REDUCTIONS declares equals one process on the three micro-batches: token-weighted means,
    ``num_tokens`` and ``loss/total`` summed, ``ratio_max`` the maximum, ``ess`` over all 8 tokens."""
    mbs = [(_losses(0.3, 1.2, [0.1, -0.2, 0.0]), 3, 0.1), (_losses(-0.5, 1.5, [0.4]), 1, -0.05),
           (_losses(0.1, 1.1, [0.0, 0.3, -0.1, 0.2]), 4, 0.04)]
    one, r0, r1 = LossMetrics(), LossMetrics(), LossMetrics()
    for i, (losses, tokens, scaled) in enumerate(mbs):
        share = scaled / float(losses["loss_objective"])  # the micro-batch's share of the minibatch (issue 43)
        one.add(losses, tokens=tokens, scaled_loss=scaled, share=share)
        (r0 if i < 2 else r1).add(losses, tokens=tokens, scaled_loss=scaled, share=share)
    want = one.finish(1)
    got = r0.finish(1, _FakeGroup(r1))
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    assert got["num_tokens"] == 8.0 and got["loss/total"] == pytest.approx(0.09)
    assert got["loss_objective"] == pytest.approx(got["loss/total"])  # loss terms weighted by share, as the total
    assert got["ratio_max"] == pytest.approx(1.5) and "kl_ref" not in got
    w = torch.tensor([0.1, -0.2, 0.0, 0.4, 0.0, 0.3, -0.1, 0.2], dtype=torch.float64).exp()
    assert got["ess"] == pytest.approx(float(w.sum() ** 2 / (8 * (w * w).sum())), rel=1e-6)
    assert math.isfinite(got["ess"])
