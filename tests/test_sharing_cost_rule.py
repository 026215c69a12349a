"""Prompt sharing in the update is one more decoder pass: on CUDA, where small-model passes are launch-bound, it runs
only when the tokens it saves are worth that pass (objectives/shared_prefix.sharing_pays); on CPU any saving pays."""
from __future__ import annotations

import torch

from torchrl_grpo.objectives.shared_prefix import CUDA_MIN_SAVED_TOKEN_PARAMS, sharing_pays
from tests.test_update_syncs import _gsm8k_like_batch, _update


class _Params(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n), requires_grad=False)


def test_rule_by_device():
    m = _Params(135_000_000 // 1000)  # scaled: the rule is on tokens x parameters
    n = sum(p.numel() for p in m.parameters())
    gsm8k = 80 * 63  # an 80-token prompt shared by 64 episodes
    tau2 = 10_000 * 63  # a 10k-token tau2 prompt
    assert sharing_pays(gsm8k, m, "cpu") and sharing_pays(1, m, "cpu")
    assert not sharing_pays(0, m, "cpu")
    scale = 1000  # m has 1/1000 of SmolLM2's parameters
    assert not sharing_pays(gsm8k * scale, m, "cuda")
    assert sharing_pays(tau2 * scale, m, "cuda")
    assert sharing_pays(int(CUDA_MIN_SAVED_TOKEN_PARAMS // n) + 1, m, torch.device("cuda"))


def test_update_skips_a_short_shared_prefix_on_cuda_only(tiny_model_and_tokenizer):
    model = tiny_model_and_tokenizer[0]
    batch = _gsm8k_like_batch(groups=1, samples=8)  # one group: every episode shares the prompt
    upd = _update(model, micro_batch_size=2, max_tokens_per_mb=0)  # 4 passes: one prefix pass saves 3 prompt runs
    facts = upd.row_facts(batch)
    assert upd.shared_prefix_for(batch, model, torch.device("cpu"), facts=facts) is not None
    assert upd.shared_prefix_for(batch, model, torch.device("cuda"), facts=facts) is None  # never built: no CUDA use
