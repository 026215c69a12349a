"""Group-relative advantages for GRPO.

A *group* is the set of ``n_samples`` episodes rolled out from the same prompt / task. GRPO replaces a
learned value baseline with the group's mean reward.

Formulas (per episode ``i`` in group ``g`` with rewards ``r``):

* ``scale="group"`` — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Sec. 4.1.2, outcome supervision:
  ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``.
* ``scale="none"`` — Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783),
  Eq. (3): ``A_i = r_i - mean_g(r)`` (no std normalisation, which biases towards easy/hard questions).
* ``scale="batch"`` — group-mean baseline, batch std: ``A_i = (r_i - mean_g(r)) / (std_batch(A) + eps)``, the
  "group-level mean, batch-level std" normalisation of Liu et al., 2025 ("Part I: Tricks or Traps? A Deep Dive into
  RL for LLM Reasoning", arXiv:2508.08221, Sec. 4.1; batch-level normalisation itself from REINFORCE++, Hu 2025,
  arXiv:2501.03262). The *batch* is the whole step's batch: under data parallelism
  (:mod:`torchrl_grpo.distributed.data_parallel`) the union of every rank's shard, its std from the all-reduced count, sum and
  sum of squares of the centred advantages; episodes outside ``stats_mask`` do not enter it: the trainer passes
  the episodes it trains, so the groups it drops (an infrastructure failure; zero reward variance under
  ``loss.filter_zero_variance_groups``, as DAPO's dynamic sampling never puts them in the batch) are left out, and
  unfiltered zero-variance groups (advantage 0, trained) count.
* ``baseline="loo"`` — leave-one-out mean (RLOO, Ahmadian et al., 2024, arXiv:2402.14740, Eq. 5):
  ``mean_{g \\ i}(r)`` instead of ``mean_g(r)``.

``std`` is the unbiased (Bessel-corrected) sample std, as in DeepSeekMath / TRL.
"""
from __future__ import annotations

from typing import Callable

import torch

#: Accepted ``scale=`` (config ``loss.adv_scale``) and ``baseline=`` (config ``loss.adv_baseline``) values of
#: :func:`group_advantages`, defined once in :mod:`torchrl_grpo.config.choices`.
from torchrl_grpo.config.choices import BASELINES, SCALES

__all__ = ["group_advantages", "group_reward_std", "SCALES", "BASELINES"]


def _group_index(group_id: torch.Tensor) -> tuple[torch.Tensor, int]:
    uniq, inverse = torch.unique(group_id, return_inverse=True)
    return inverse, int(uniq.numel())


def group_reward_std(reward: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """Per-episode std of its group's rewards (unbiased; 0 for a group of one).

    Args:
        reward: float tensor [B].
        group_id: integer tensor [B]; equal ids form a group.

    Returns:
        float tensor [B].
    """
    inverse, n_groups = _group_index(group_id)
    reward = reward.double()
    count = torch.zeros(n_groups, dtype=torch.double).index_add_(0, inverse, torch.ones_like(reward))
    total = torch.zeros(n_groups, dtype=torch.double).index_add_(0, inverse, reward)
    mean = total / count
    sq = torch.zeros(n_groups, dtype=torch.double).index_add_(0, inverse, (reward - mean[inverse]) ** 2)
    var = torch.where(count > 1, sq / (count - 1).clamp_min(1), torch.zeros_like(sq))
    return var.sqrt()[inverse].float()


def group_advantages(
    reward: torch.Tensor,
    group_id: torch.Tensor,
    *,
    scale: str = "group",
    baseline: str = "mean",
    eps: float = 1e-6,
    stats_mask: torch.Tensor | None = None,
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Group-relative advantage of every episode.

    Args:
        reward: float tensor [B] (or [B, 1]), one scalar reward per episode.
        group_id: integer tensor [B] (or [B, 1]); episodes with equal ids form a group.
        scale: ``"group"`` (divide by group std, GRPO), ``"none"`` (Dr. GRPO), ``"batch"`` (divide by batch std).
        baseline: ``"mean"`` (group mean, GRPO) or ``"loo"`` (leave-one-out mean, RLOO).
        eps: added to the std to avoid division by zero.
        stats_mask: optional bool [B] (``scale="batch"`` only): the episodes whose centred advantages enter the
            batch std (default: all). Every episode is still scaled by it.
        sum_over_ranks: optional ``float64 [3] -> float64 [3]`` element-wise sum over the data-parallel ranks
            (:meth:`torchrl_grpo.distributed.data_parallel.DataParallel.sum_tensor`), with ``scale="batch"``: the batch std is then
            that of the union of the ranks' (whole-group) shards, ``std = sqrt((S2 - S1^2 / N) / (N - 1))`` from the
            summed count ``N``, sum ``S1`` and sum of squares ``S2`` (unbiased, as ``torch.std``; 0 for ``N <= 1``).
            A collective: every rank calls it, an empty shard too. None: this process's batch only.

    Returns:
        float32 tensor [B]. A group whose rewards are all equal gets advantage 0 everywhere.

    Raises:
        ValueError: shape mismatch, non-finite rewards, or an unknown ``scale`` / ``baseline``.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; expected one of {SCALES}")
    if baseline not in BASELINES:
        raise ValueError(f"unknown advantage baseline {baseline!r}; expected one of {BASELINES}")
    reward = reward.reshape(-1)
    group_id = group_id.reshape(-1)
    if reward.shape != group_id.shape:
        raise ValueError(f"reward {tuple(reward.shape)} and group_id {tuple(group_id.shape)} must have the same length")
    if stats_mask is not None and stats_mask.reshape(-1).shape != reward.shape:
        raise ValueError(f"stats_mask {tuple(stats_mask.shape)} and reward {tuple(reward.shape)} must have the same length")
    if not torch.isfinite(reward).all():
        raise ValueError("rewards must be finite; got NaN/inf")
    inverse, n_groups = _group_index(group_id)
    r = reward.double()
    count = torch.zeros(n_groups, dtype=torch.double).index_add_(0, inverse, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=torch.double).index_add_(0, inverse, r)
    if baseline == "mean":
        base = (total / count)[inverse]
    else:
        n = count[inverse]
        base = torch.where(n > 1, (total[inverse] - r) / (n - 1).clamp_min(1), r)
    adv = r - base
    if scale == "group":
        adv = adv / (group_reward_std(reward, group_id).double() + eps)
    elif scale == "batch":
        a = adv if stats_mask is None else adv[stats_mask.reshape(-1).bool()]
        stats = torch.stack([a.new_tensor(float(a.numel())), a.sum(), (a * a).sum()])
        if sum_over_ranks is not None:
            stats = sum_over_ranks(stats)
        n, s1, s2 = (float(x) for x in stats)
        var = max(0.0, (s2 - s1 * s1 / n) / (n - 1)) if n > 1 else 0.0
        adv = adv / (var ** 0.5 + eps)
    return adv.float()
