"""processed_logits: temperature, top-k, nucleus rules by hand; vLLM's formulation of the same rules; the sampler
draws from and reports exactly this distribution."""
from __future__ import annotations

import pytest
import torch

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.transformers_backend import sample_next_token
from torchrl_grpo.objectives.sampling import processed_logits


def _kept(x: torch.Tensor) -> list[int]:
    return torch.isfinite(x).nonzero().flatten().tolist()


def test_temperature_only_is_a_plain_division():
    z = torch.randn(3, 11)
    torch.testing.assert_close(processed_logits(z, temperature=0.5), z / 0.5)
    assert processed_logits(z) is z


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p():
    z = torch.tensor([[0.3, 0.5, 0.2]]).log()  # probabilities 0.3, 0.5, 0.2
    # token 0: mass before it 0.5 < 0.7 -> kept; token 2: 0.8 >= 0.7 -> dropped
    assert _kept(processed_logits(z, top_p=0.7)[0]) == [0, 1]
    assert _kept(processed_logits(z, top_p=0.85)[0]) == [0, 1, 2]
    assert _kept(processed_logits(z, top_p=0.4)[0]) == [1]  # the most likely token is always kept
    assert _kept(processed_logits(z, top_p=1e-6)[0]) == [1]
    out = processed_logits(z, top_p=0.7)
    torch.testing.assert_close(out.log_softmax(-1)[0, :2].exp(), torch.tensor([0.375, 0.625]))


def test_top_k_keeps_ties_at_the_kth_value_and_precedes_top_p():
    z = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.0]])
    assert _kept(processed_logits(z, top_k=2)[0]) == [0, 1, 2]
    assert _kept(processed_logits(z, top_k=1)[0]) == [0]
    assert _kept(processed_logits(z, top_k=5)[0]) == [0, 1, 2, 3, 4]
    assert _kept(processed_logits(z, top_k=50)[0]) == [0, 1, 2, 3, 4]
    # top-p on the top-k-renormalised distribution: over {0, 1, 2} token 0 has e^3/(e^3+2e^2) = 0.576
    assert _kept(processed_logits(z, top_k=3, top_p=0.55)[0]) == [0]
    # the nucleus ends inside the tied pair: both are kept (no dependence on how a sort orders them)
    assert _kept(processed_logits(z, top_k=3, top_p=0.6)[0]) == [0, 1, 2]
    assert _kept(processed_logits(z, top_p=0.45)[0]) == [0]
    zt = torch.tensor([[1.0, 1.0, 1.0, 1.0, -5.0]])  # four equal tokens
    assert _kept(processed_logits(zt, top_p=0.3)[0]) == [0, 1, 2, 3]


def test_bad_arguments_raise():
    z = torch.randn(2, 5)
    for kw in (dict(temperature=0.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)):
        with pytest.raises(ValueError):
            processed_logits(z, **kw)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=-1)


def _vllm_style_keep(z: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """vLLM's formulation (apply_top_k_top_p, PyTorch path), restated: ascending sort; top-k masks values below
    the k-th largest; top-p masks where the ascending cumulative mass is <= 1 - p, never the largest token."""
    zs, idx = z.sort(-1)
    if k:
        zs = zs.masked_fill(zs < zs[:, -k, None], float("-inf"))  # zs[:, -k]: the k-th largest value
    if p < 1:
        mask = zs.softmax(-1).cumsum(-1) <= 1 - p
        mask[:, -1] = False
        zs = zs.masked_fill(mask, float("-inf"))
    return torch.isfinite(torch.empty_like(z).scatter(-1, idx, zs))


@pytest.mark.parametrize("k,p,V,scale", [(0, 0.7, 100, 3.0), (0, 0.95, 100, 3.0), (10, 1.0, 100, 3.0),
                                         (10, 0.8, 100, 3.0), (40, 0.5, 100, 3.0),
                                         (0, 0.9, 5000, 0.5), (3000, 0.9, 5000, 0.5)])  # nuclei of ~1000s of tokens
def test_same_kept_set_as_vllm_formulation(k, p, V, scale):
    z = torch.randn(64, V, generator=torch.Generator().manual_seed(k + int(100 * p))) * scale
    ours = torch.isfinite(processed_logits(z, temperature=0.9, top_p=p, top_k=k))
    theirs = _vllm_style_keep(z / 0.9, k, p)
    assert torch.equal(ours, theirs)
    assert (ours.sum(-1) < V).all()


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.8, 0.7, 0), (1.0, 1.0, 4), (1.3, 0.9, 20)])
def test_sampler_draws_from_and_reports_the_processed_distribution(temperature, top_p, top_k):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1)) * 2
    cfg = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    ref = processed_logits(logits, temperature=temperature, top_p=top_p, top_k=top_k).log_softmax(-1)
    g = torch.Generator().manual_seed(0)
    seen = torch.zeros(4, 50, dtype=torch.bool)
    for _ in range(300):
        tok, lp = sample_next_token(logits, cfg, g)
        torch.testing.assert_close(lp, ref.gather(-1, tok[:, None]).squeeze(-1))
        seen[torch.arange(4), tok] = True
    assert not (seen & torch.isinf(ref)).any()  # never a dropped token
