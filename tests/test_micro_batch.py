"""torchrl_grpo.training.micro_batch: the one "micro-batch has a scored token" predicate the update and its no-grad
recomputes filter micro-batches with."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from torchrl_grpo.training.micro_batch import has_scored_token


def _mb(response_mask, attention_mask):
    rm, am = torch.tensor(response_mask, dtype=torch.bool), torch.tensor(attention_mask, dtype=torch.bool)
    return TensorDict(response_mask=rm, attention_mask=am, batch_size=[rm.shape[0]])


def test_a_response_token_among_the_real_tokens_is_scored():
    assert has_scored_token(_mb([[0, 0, 1, 0]], [[1, 1, 1, 0]]))
    assert has_scored_token(_mb([[0, 0, 0, 0], [0, 1, 0, 0]], [[1, 1, 0, 0], [1, 1, 1, 1]]))


def test_prompt_only_episodes_and_masked_response_columns_are_not():
    assert not has_scored_token(_mb([[0, 0, 0, 0], [0, 0, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]]))  # prompt only
    assert not has_scored_token(_mb([[0, 0, 0, 1]], [[1, 1, 1, 0]]))  # a response column that is padding
    assert not has_scored_token(_mb(torch.zeros(0, 3).tolist(), torch.zeros(0, 3).tolist()))  # an empty shard


# ------------------------------------------------------------------ issue 35 item 2: the plan and the auto budget
import pytest  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from torchrl_grpo.training.micro_batch import (  # noqa: E402
    CPU_ACTIVATION_BYTES, UNKNOWN_MODEL_BYTES_PER_TOKEN, activation_bytes_per_token, auto_token_budget,
    decoder_positions, plan_micro_batches)


def test_sorting_by_length_is_kept_when_it_computes_less_padding():
    lengths = [50, 10, 50, 10]  # long, short, long, short; two per micro-batch
    assert decoder_positions([[0, 1], [2, 3]], lengths) == 200
    plan = plan_micro_batches(lengths, 2)
    assert plan == [[0, 2], [1, 3]] and decoder_positions(plan, lengths) == 120
    # everything fits one micro-batch: batch order, one pass (no count limit, no budget)
    assert plan_micro_batches(lengths, 0) == [[0, 1, 2, 3]]
    assert plan_micro_batches(lengths, 0, max_tokens=200) == [[0, 1, 2, 3]]
    # a token budget: sorted rows pack tighter (100 padded tokens: [50, 50] and [10, 10])
    assert plan_micro_batches(lengths, 0, max_tokens=100) == [[0, 2], [1, 3]]
    assert sorted(sum(plan_micro_batches([7, 3, 9, 1, 4], 2, 12), [])) == [0, 1, 2, 3, 4]


def test_batch_order_is_kept_when_groups_share_their_prompts():
    """Two groups of two whose rows share a 40-token prompt: sorting by length splits the groups and loses the
    per-micro-batch prompt sharing, which saves more than the padding it adds."""
    lengths, key, cols = [60, 45, 58, 44], [0, 0, 1, 1], [40, 40, 40, 40]
    consecutive = decoder_positions([[0, 1], [2, 3]], lengths, key, cols)
    assert consecutive == 2 * 60 - 40 + 2 * 58 - 40
    assert decoder_positions([[0, 2], [1, 3]], lengths, key, cols) > consecutive
    assert plan_micro_batches(lengths, 2, 0, key, cols) == [[0, 1], [2, 3]]
    assert plan_micro_batches(lengths, 2) == [[0, 2], [1, 3]]  # without the sharing, sorting wins


def test_plan_refuses_negative_limits():
    with pytest.raises(ValueError, match="max_count"):
        plan_micro_batches([1], -1)
    with pytest.raises(ValueError, match="max_tokens"):
        plan_micro_batches([1, 2], 1, -1)


class _Model(torch.nn.Module):
    def __init__(self, **dims):
        super().__init__()
        self.config = LlamaConfig(**dims)


def test_activation_estimate_matches_the_measured_qwen_slope_and_sets_the_cpu_budget():
    qwen = _Model(num_hidden_layers=24, hidden_size=896, intermediate_size=4864, num_attention_heads=14)
    per_token = activation_bytes_per_token(qwen)
    # benchmarks/results/microbatch_memory_fp32_nogc.md: 2.93 GB per 1k padded tokens measured
    assert 2.8e9 <= per_token * 1000 <= 3.2e9
    smol = _Model(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9)
    assert auto_token_budget(smol, torch.device("cpu"), 400) == CPU_ACTIVATION_BYTES // activation_bytes_per_token(smol)
    assert 2500 <= auto_token_budget(smol, torch.device("cpu"), 400) <= 3200
    # an episode longer than the budget still gets its own micro-batch; a model without dimensions: the fallback
    assert auto_token_budget(qwen, torch.device("cpu"), 10**6) == 10**6
    assert activation_bytes_per_token(torch.nn.Linear(2, 2)) == UNKNOWN_MODEL_BYTES_PER_TOKEN


# ------------------------------------------------------------------ issue 43 (3): logged loss terms and the plan
import copy  # noqa: E402
import contextlib  # noqa: E402

from torchrl_grpo.objectives.log_probs import token_log_probs  # noqa: E402
from torchrl_grpo.objectives.loss import AGGREGATIONS, GRPOLoss  # noqa: E402
from torchrl_grpo.training.update import GRPOUpdate  # noqa: E402
from tests.test_update_syncs import _gsm8k_like_batch, policy  # noqa: E402,F401  (a fixture, used by name)

#: the logged terms of the loss: each must not depend on how the batch is cut into micro-batches
LOSS_TERMS = ("loss_objective", "loss_kl", "loss_entropy", "kl_ref", "entropy", "loss/total")


def _term_update(model, aggregation, *, micro_batch_size, max_tokens_per_mb, minibatch_size=0, anchor="recompute"):
    """A GRPO update with KL (to a perturbed copy) and entropy on, lr 0 (the model stays put: every minibatch sees
    the same policy, so the terms can be checked against one independent forward)."""
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loss = GRPOLoss(model, kl_coef=0.05, entropy_coef=0.01, aggregation=aggregation, max_tokens=48)
    return GRPOUpdate(model, loss, torch.optim.SGD(model.parameters(), lr=0.0),
                      reference=lambda: contextlib.nullcontext(ref), device=torch.device("cpu"),
                      autocast=contextlib.nullcontext, ppo_epochs=1, minibatch_size=minibatch_size,
                      micro_batch_size=micro_batch_size, max_tokens_per_mb=max_tokens_per_mb, max_grad_norm=1e9,
                      anchor=anchor, exact_log_probs=True, seed=0)


@pytest.mark.parametrize("aggregation", [a if a == "token_mean" else pytest.param(a, marks=pytest.mark.slow)
                                         for a in AGGREGATIONS])  # 11-14 s each at load ~4: one in the unit stage
def test_logged_loss_terms_do_not_depend_on_the_micro_batch_plan(policy, aggregation):  # noqa: F811
    """Issue 43 (3): under the seq-mean aggregations the terms were combined weighted by response tokens (kl_ref
    0.1155 in one pass, 0.1083 one episode per pass) and no longer added up to ``loss/total``. Now: every plan logs
    the same terms (1e-5), ``loss_objective + loss_kl + loss_entropy == loss/total`` (also over two minibatches,
    where the terms are the mean of the minibatches' own, as ``loss/total`` is), and ``entropy`` / ``kl_ref`` are
    nats per response token (a token mean, whatever the aggregation and the minibatches), computed here from one
    independent forward."""
    batch = _gsm8k_like_batch(seed=1)
    longest = int(batch["attention_mask"].sum(-1).max())
    plans = {"one pass": (0, 0, 0), "one episode each": (1, 0, 0), "3 episodes": (3, 0, 0),
             "token budget": (0, 2 * longest, 0), "two minibatches of 8, 3 each": (3, 0, 8)}
    logged = {}
    for name, (size, budget, mb) in plans.items():
        upd = _term_update(copy.deepcopy(policy), aggregation, micro_batch_size=size, max_tokens_per_mb=budget,
                           minibatch_size=mb)
        td = batch.clone()
        logged[name] = upd(td, step=1)
    ref = logged["one pass"]
    for name, m in logged.items():
        for k in LOSS_TERMS if "minibatches" not in name else ("kl_ref", "entropy"):  # another objective
            assert m[k] == pytest.approx(ref[k], abs=1e-5), (name, k)
        assert m["loss_objective"] + m["loss_kl"] + m["loss_entropy"] == pytest.approx(m["loss/total"], abs=1e-6), name
    mask = td["response_mask"] & td["attention_mask"]
    with torch.no_grad():
        logp, ent = token_log_probs(policy, td["tokens"], td["attention_mask"], with_entropy=True, response_mask=mask)
    d = torch.where(mask, td["ref_log_probs"] - logp, torch.zeros_like(logp))
    k3 = d.exp() - d - 1
    assert ref["entropy"] == pytest.approx(float(ent[mask].mean()), rel=1e-4)
    assert ref["kl_ref"] == pytest.approx(float(k3[mask].mean()), rel=1e-4)
