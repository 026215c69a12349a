"""Tests for torchrl_grpo.objectives.advantage: group-relative advantages against a plain numpy reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchrl_grpo.objectives.advantage import group_advantages, group_reward_std

EPS = 1e-6


# ----------------------------------------------------------------------------------------------------------------------
# numpy reference (one group at a time, written from the formulas in the module docstring)
# ----------------------------------------------------------------------------------------------------------------------
def np_reference(reward, group_id, scale="group", baseline="mean", eps=EPS):
    r = np.asarray(reward, dtype=np.float64)
    g = np.asarray(group_id)
    adv = np.zeros_like(r)
    for gid in np.unique(g):
        idx = np.flatnonzero(g == gid)
        rg = r[idx]
        n = len(rg)
        if baseline == "mean":
            base = np.full(n, rg.mean())
        else:  # leave-one-out mean; a group of one has no "others": baseline = own reward
            base = (rg.sum() - rg) / (n - 1) if n > 1 else rg.copy()
        a = rg - base
        if scale == "group":
            std = rg.std(ddof=1) if n > 1 else 0.0
            a = a / (std + eps)
        adv[idx] = a
    if scale == "batch":
        std = adv.std(ddof=1) if len(adv) > 1 else 0.0
        adv = adv / (std + eps)
    return adv


def _random_batch(seed, n_groups=5, group_size=6, binary=False):
    rng = np.random.default_rng(seed)
    gid = np.repeat(np.arange(n_groups), group_size)
    if binary:
        r = rng.integers(0, 2, size=gid.size).astype(np.float64)
    else:
        r = rng.normal(size=gid.size) * 2.0 + 0.5
    return r, gid


# ----------------------------------------------------------------------------------------------------------------------
def test_hand_example_one_group():
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(((.5)^2 * 4) / 3) = sqrt(1/3) -> A = ±0.5 * sqrt(3) = ±0.866
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), eps=0.0)
    expected = [math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # Dr. GRPO: just r - mean
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), scale="none")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5], abs=1e-7)
    # RLOO baseline, no scaling: r_i - mean of the 3 others: 1 - 1/3, 0 - 2/3
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), scale="none", baseline="loo")
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-6)


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_group_normalisation_matches_numpy(seed, binary):
    r, gid = _random_batch(seed, binary=binary)
    adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid))
    ref = np_reference(r.astype(np.float32), gid)
    assert adv.dtype == torch.float32 and adv.shape == (r.size,)
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5, atol=1e-5)
    # within every non-degenerate group: zero mean, unit (unbiased) std
    for g in np.unique(gid):
        a = adv.numpy()[gid == g].astype(np.float64)
        assert abs(a.mean()) < 1e-5
        if r[gid == g].std() > 0:
            assert a.std(ddof=1) == pytest.approx(1.0, abs=1e-4)


def test_dr_grpo_scale_none_matches_numpy():
    r, gid = _random_batch(3)
    adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale="none")
    ref = np_reference(r.astype(np.float32), gid, scale="none")
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5, atol=1e-6)
    # not rescaled: the spread is the raw reward spread, different from the std-normalised version
    grp = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale="group")
    assert not torch.allclose(adv, grp, atol=1e-3)


def test_batch_scale_matches_numpy():
    r, gid = _random_batch(4)
    adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale="batch")
    ref = np_reference(r.astype(np.float32), gid, scale="batch")
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_loo_baseline_matches_numpy(scale):
    r, gid = _random_batch(5, n_groups=4, group_size=5)
    adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale=scale, baseline="loo")
    ref = np_reference(r.astype(np.float32), gid, scale=scale, baseline="loo")
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5, atol=1e-5)
    # RLOO identity: r_i - mean_{-i} = n/(n-1) * (r_i - mean) within a group of n
    mean_adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale=scale)
    torch.testing.assert_close(adv, mean_adv * 5 / 4, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("baseline", ["mean", "loo"])
@pytest.mark.parametrize("scale", ["group", "none", "batch"])
def test_zero_variance_groups_get_zero(scale, baseline):
    # groups 0 and 2 are degenerate (all-equal rewards), group 1 is not
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.3, 0.3, 0.3])
    gid = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    adv = group_advantages(r, gid, scale=scale, baseline=baseline)
    assert torch.isfinite(adv).all()
    assert adv[gid != 1].abs().max().item() < 1e-6
    assert adv[gid == 1].abs().max().item() > 0.1
    np.testing.assert_allclose(adv.numpy(), np_reference(r.numpy(), gid.numpy(), scale, baseline), rtol=1e-5, atol=1e-6)


def test_all_groups_degenerate_and_singletons():
    # every group constant -> all zeros, no NaN even for scale="batch" (std 0) and groups of one
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.7])
    gid = torch.tensor([0, 0, 1, 1, 2])
    for scale in ("group", "none", "batch"):
        for baseline in ("mean", "loo"):
            adv = group_advantages(r, gid, scale=scale, baseline=baseline)
            assert torch.equal(adv, torch.zeros(5)), (scale, baseline, adv)


def test_non_contiguous_group_ids():
    rng = np.random.default_rng(7)
    gid = np.array([42, -3, 42, 7, 1000, -3, 7, 42, 1000, -3, 7, 1000])
    r = rng.normal(size=gid.size)
    adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid))
    np.testing.assert_allclose(adv.numpy(), np_reference(r.astype(np.float32), gid), rtol=1e-5, atol=1e-5)
    # same as computing it on the batch sorted by group: permutation equivariance
    perm = np.argsort(gid, kind="stable")
    adv_sorted = group_advantages(torch.tensor(r[perm], dtype=torch.float32), torch.tensor(gid[perm]))
    torch.testing.assert_close(adv_sorted, adv[torch.as_tensor(perm)])
    # relabelling the groups changes nothing
    relabel = {42: 0, -3: 1, 7: 2, 1000: 3}
    adv_relab = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor([relabel[g] for g in gid]))
    torch.testing.assert_close(adv_relab, adv)


def test_unequal_group_sizes():
    gid = np.array([0, 0, 1, 1, 1, 1, 1, 2, 2, 2])
    r = np.array([0.0, 1.0, 0.2, 0.9, 0.4, 0.4, 1.0, 3.0, -1.0, 0.5])
    for scale in ("group", "none", "batch"):
        for baseline in ("mean", "loo"):
            adv = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid), scale=scale, baseline=baseline)
            np.testing.assert_allclose(adv.numpy(), np_reference(r.astype(np.float32), gid, scale, baseline),
                                       rtol=1e-5, atol=1e-5)


def test_column_shaped_inputs():
    r, gid = _random_batch(8, n_groups=2, group_size=4)
    flat = group_advantages(torch.tensor(r, dtype=torch.float32), torch.tensor(gid))
    col = group_advantages(torch.tensor(r, dtype=torch.float32)[:, None], torch.tensor(gid)[:, None])
    assert col.shape == (8,)
    torch.testing.assert_close(col, flat)


def test_group_reward_std_matches_numpy():
    gid = np.array([3, 3, 3, 9, 9, 5])  # group 5 is a singleton -> std 0
    r = np.array([0.0, 1.0, 1.0, 2.0, -2.0, 4.0])
    std = group_reward_std(torch.tensor(r, dtype=torch.float32), torch.tensor(gid))
    expected = [np.std(r[gid == g], ddof=1) if (gid == g).sum() > 1 else 0.0 for g in gid]
    np.testing.assert_allclose(std.numpy(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_reward_raises(bad):
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([1.0, bad, 0.0]), torch.tensor([0, 0, 0]))


def test_bad_arguments_raise():
    r, g = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="scale"):
        group_advantages(r, g, scale="std")
    with pytest.raises(ValueError, match="baseline"):
        group_advantages(r, g, baseline="median")
    with pytest.raises(ValueError, match="same length"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), g)


def test_batch_scale_over_ranks_equals_the_union_of_the_shards():
    """``sum_over_ranks`` (an all-reduce under DDP): two shards of whole groups, each scaled with the summed
    count / sum / sum of squares of both, get the advantages of the union scaled on one process; an empty shard
    contributes zeros; ``stats_mask`` leaves episodes out of the std but still scales them."""
    r, gid = _random_batch(6, n_groups=4, group_size=3)
    r, gid = torch.tensor(r, dtype=torch.float32), torch.tensor(gid)
    shards = [torch.isin(gid, torch.tensor([0, 2])), torch.isin(gid, torch.tensor([1, 3])), gid < 0]  # 3rd empty
    local = []
    for m in shards:  # each rank's own statistics
        group_advantages(r[m], gid[m], scale="batch", sum_over_ranks=lambda t: local.append(t.clone()) or t)
    total = sum(local)
    assert float(local[2].abs().sum()) == 0.0
    union = group_advantages(r, gid, scale="batch")
    for m in shards:
        got = group_advantages(r[m], gid[m], scale="batch", sum_over_ranks=lambda t: total)
        torch.testing.assert_close(got, union[m], rtol=1e-6, atol=1e-7)
    keep = gid != 1
    masked = group_advantages(r, gid, scale="batch", stats_mask=keep)
    torch.testing.assert_close(masked[keep], group_advantages(r[keep], gid[keep], scale="batch"), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="stats_mask"):
        group_advantages(r, gid, scale="batch", stats_mask=keep[:-1])
