"""Partial rollouts (issue 12 t.3): the decoupled objective on an episode whose tokens were sampled by two policy
versions. The generation comes from the transformers backend interrupted by a weight update; the loss must weight
each token by its own π_prox / π_behav (AReaL Eq. 5), i.e. pre-update tokens by π_new / π_old and post-update tokens
by 1."""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.objectives.loss import GRPOLoss, token_log_probs


@pytest.fixture(scope="module")
def models(tiny_llama):
    old = tiny_llama(512)
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return old, new


def test_decoupled_loss_weights_each_token_by_its_own_version(models):
    old, new = models
    be = TransformersBackend(copy.deepcopy(old), pad_token_id=0, share_module=False)
    be.weight_update_hook = lambda: be.load_weights(new.state_dict()) if be.policy_version == 0 else None
    be.partial_rollout_chunk = 5
    prompts = [[3, 4, 5, 6], [3, 4, 5, 6], [7, 8]]
    gens = be.generate(prompts, SamplingConfig(max_new_tokens=12, temperature=1.0, seed=2))
    B, T = len(prompts), max(len(p) + len(g.token_ids) for p, g in zip(prompts, gens))
    tokens = torch.zeros(B, T, dtype=torch.long)
    attn, resp = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
    behav, vers = torch.zeros(B, T), torch.full((B, T), -1)
    for i, (p, g) in enumerate(zip(prompts, gens)):
        n, L = len(p), len(p) + len(g.token_ids)
        tokens[i, :L] = torch.tensor(p + g.token_ids)
        attn[i, :L] = True
        resp[i, n:L] = True
        behav[i, n:L] = torch.tensor(g.logprobs)
        vers[i, n:L] = torch.tensor(g.versions)
    assert set(vers[resp].tolist()) == {0, 1}  # mixed-version episodes
    lp_old, _ = token_log_probs(old, tokens, attn)
    lp_new, _ = token_log_probs(new, tokens, attn)
    # behaviour log-probs are per token those of the version that sampled it
    expect_behav = torch.where(vers == 0, lp_old, lp_new)
    torch.testing.assert_close(behav[resp], expect_behav[resp], atol=1e-4, rtol=0)
    # the decoupled loss with the trainer's anchor recompute (π_prox = new) and the actor = new (first update)
    adv = torch.tensor([1.0, -0.5, 0.25])
    td = TensorDict({"tokens": tokens, "attention_mask": attn, "response_mask": resp, "sample_log_probs": behav,
                     "advantage": adv, "old_log_probs": lp_new.detach()}, batch_size=[B])
    out = GRPOLoss(new, behaviour_weight_cap=None)(td)
    w = torch.where(vers == 0, (lp_new - lp_old).exp(), torch.ones_like(lp_new))  # π_new/π_old before, 1 after
    # ratio π_θ/π_prox = 1 at the first update, so the surrogate is w * A per token; token-mean over the batch
    expect_obj = -(w * adv[:, None])[resp].mean()
    torch.testing.assert_close(out["loss_objective"], expect_obj, atol=1e-4, rtol=0)
    torch.testing.assert_close(out["behaviour_weight_mean"], w[resp].mean(), atol=1e-4, rtol=0)
    assert (w[resp & (vers == 0)] - 1).abs().max() > 1e-3  # the pre-update tokens really are re-weighted
