"""Group-relative advantages for GRPO.

A *group* is the set of ``n_samples`` episodes rolled out from the same prompt / task. GRPO replaces a
learned value baseline with the group's mean reward.

Formulas (per episode ``i`` in group ``g`` with rewards ``r``):

* ``scale="group"`` — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Sec. 4.1.2, outcome supervision:
  ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``.
* ``scale="none"`` — Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783),
  Eq. (3): ``A_i = r_i - mean_g(r)`` (no std normalisation, which biases towards easy/hard questions).
* ``scale="batch"`` — group-mean baseline, batch std (REINFORCE++-style normalisation, Hu 2025):
  ``A_i = (r_i - mean_g(r)) / (std_batch(A) + eps)``.
* ``baseline="loo"`` — leave-one-out mean (RLOO, Ahmadian et al., 2024, arXiv:2402.14740, Eq. 5):
  ``mean_{g \\ i}(r)`` instead of ``mean_g(r)``.

``std`` is the unbiased (Bessel-corrected) sample std, as in DeepSeekMath / TRL.
"""
from __future__ import annotations

import torch

__all__ = ["group_advantages", "group_reward_std", "SCALES", "BASELINES"]

#: Accepted ``scale=`` values of :func:`group_advantages` (config ``loss.adv_scale``).
SCALES = ("group", "none", "batch")
#: Accepted ``baseline=`` values of :func:`group_advantages` (config ``loss.adv_baseline``).
BASELINES = ("mean", "loo")


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
) -> torch.Tensor:
    """Group-relative advantage of every episode.

    Args:
        reward: float tensor [B] (or [B, 1]), one scalar reward per episode.
        group_id: integer tensor [B] (or [B, 1]); episodes with equal ids form a group.
        scale: ``"group"`` (divide by group std, GRPO), ``"none"`` (Dr. GRPO), ``"batch"`` (divide by batch std).
        baseline: ``"mean"`` (group mean, GRPO) or ``"loo"`` (leave-one-out mean, RLOO).
        eps: added to the std to avoid division by zero.

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
        std = adv.std() if adv.numel() > 1 else adv.new_zeros(())
        adv = adv / (std + eps)
    return adv.float()
