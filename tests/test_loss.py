"""Tests for torchrl_grpo.objectives.loss: hand-computed values, parity with TorchRL's GRPOLoss, padding, gradients.

Layout of the batches used here: ``tokens [B, T]``; position ``t`` of a log-prob tensor holds
``log p(tokens[t] | tokens[<t])`` (position 0 has no context and is 0), as :func:`token_log_probs` returns.
"""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from transformers import LlamaConfig, LlamaForCausalLM

from torchrl_grpo.objectives.loss import AGGREGATIONS, GRPOLoss, masked_aggregate, token_log_probs, total_loss

torch.set_num_threads(2)


# ======================================================================================================================
# 1. Hand-computed example with a stub model whose per-token probabilities are chosen by the test
# ======================================================================================================================
class StubLM(torch.nn.Module):
    """A "causal LM" that ignores its input and returns a fixed, learnable logits table [B, T, V].

    ``token_log_probs`` reads ``logits[:, t - 1]`` to score ``tokens[:, t]``; the table is built so that the
    probability of every response token is a number chosen by the test.
    """

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        assert input_ids.shape == self.table.shape[:2]
        return SimpleNamespace(logits=self.table)


# Two-token vocabulary. Rows: list of (t, token, p_cur, p_behav, p_ref, p_old) for the response tokens.
# Row 0: 4 response tokens (t = 2..5), no padding.
# Row 1: 3 response tokens (t = 1..3), positions 4, 5 are right padding.
# Row 2: no response token at all (a prompt-only row): must not count in any aggregate.
T_HAND = 6
HAND_ROWS = [
    dict(A=1.5, attn=[1, 1, 1, 1, 1, 1], tokens=[0, 1, 0, 1, 1, 0],
         resp=[(2, 0, 0.50, 0.40, 0.45, 0.42), (3, 1, 0.30, 0.50, 0.35, 0.40),
               (4, 1, 0.90, 0.60, 0.80, 0.75), (5, 0, 0.55, 0.50, 0.50, 0.60)]),
    dict(A=-0.8, attn=[1, 1, 1, 1, 0, 0], tokens=[1, 0, 1, 0, 0, 0],
         resp=[(1, 0, 0.20, 0.30, 0.25, 0.28), (2, 1, 0.70, 0.50, 0.60, 0.45), (3, 0, 0.45, 0.45, 0.40, 0.50)]),
    dict(A=0.3, attn=[1, 1, 1, 1, 1, 1], tokens=[1, 1, 0, 0, 1, 0], resp=[]),
]


def _hand_batch(with_old=False, with_ref=True):
    """Build the stub model + TensorDict for HAND_ROWS. Non-response logits are random (they must not matter)."""
    g = torch.Generator().manual_seed(0)
    B, T, V = len(HAND_ROWS), T_HAND, 2
    table = torch.randn(B, T, V, generator=g)
    tokens = torch.tensor([r["tokens"] for r in HAND_ROWS])
    attn = torch.tensor([r["attn"] for r in HAND_ROWS], dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)
    behav, ref, old = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T)
    for b, row in enumerate(HAND_ROWS):
        for t, tok, pc, pb, pr, po in row["resp"]:
            assert tokens[b, t] == tok
            # logits [log p, log(1-p)] for token 0 (swapped for token 1): softmax gives exactly p to `tok`
            table[b, t - 1, tok] = math.log(pc)
            table[b, t - 1, 1 - tok] = math.log(1 - pc)
            resp[b, t] = True
            behav[b, t], ref[b, t], old[b, t] = math.log(pb), math.log(pr), math.log(po)
    td = TensorDict(
        tokens=tokens, attention_mask=attn, response_mask=resp, sample_log_probs=behav,
        advantage=torch.tensor([r["A"] for r in HAND_ROWS]), batch_size=[B],
    )
    if with_ref:
        td["ref_log_probs"] = ref
    if with_old:
        td["old_log_probs"] = old
    return StubLM(table), td


def _agg_py(rows_vals, mode, max_tokens):
    """Aggregate per-token python floats; rows_vals: one list per row (only response tokens)."""
    nonempty = [v for v in rows_vals if v]
    if mode == "token_mean":
        flat = [x for v in nonempty for x in v]
        return sum(flat) / len(flat)
    if mode == "seq_mean_token_mean":
        return sum(sum(v) / len(v) for v in nonempty) / len(nonempty)
    if mode == "seq_mean_token_sum_norm":
        return sum(sum(v) / max_tokens for v in nonempty) / len(nonempty)
    raise AssertionError(mode)


def _hand_expected(eps_low, eps_high, mode, max_tokens, kl_coef, ent_coef, cap=None, temperature=1.0,
                   decoupled=None, weight_mode="truncate"):
    """Every output of GRPOLoss computed with plain python floats from HAND_ROWS. ``decoupled``: the batch has
    old_log_probs (defaults to ``cap is not None`` as in the tests that pass a cap)."""
    decoupled = cap is not None if decoupled is None else decoupled
    masked = []
    surr, kl, ent, ratios, iw, log_beh_minus_cur, bw = [], [], [], [], [], [], []
    for row in HAND_ROWS:
        A = row["A"]
        s_row, k_row, e_row = [], [], []
        for _t, _tok, pc, pb, pr, po in row["resp"]:
            if temperature != 1.0:  # p ∝ exp(logit / τ) with logits (log p, log(1-p))
                a, b = pc ** (1 / temperature), (1 - pc) ** (1 / temperature)
                pc = a / (a + b)
            anchor = po if decoupled else pb  # the PPO anchor: the old (proximal) log-probs when given
            r = pc / anchor
            r_clip = min(max(r, 1 - eps_low), 1 + eps_high)
            s = min(r * A, r_clip * A)
            if decoupled:
                w = po / pb
                if cap is not None and weight_mode == "truncate":
                    w = min(w, cap)
                elif cap is not None:
                    masked.append(w > cap)
                    w = 0.0 if w > cap else w
                s *= w
                bw.append(w)
            s_row.append(s)
            k_row.append(pr / pc - math.log(pr / pc) - 1)  # k3
            e_row.append(-(pc * math.log(pc) + (1 - pc) * math.log(1 - pc)))  # binary entropy
            ratios.append(r)
            iw.append(pc / pb)  # importance weight vs the behaviour policy (ESS)
            log_beh_minus_cur.append(math.log(pb) - math.log(pc))
        surr.append(s_row)
        kl.append(k_row)
        ent.append(e_row)
    n = len(ratios)
    below = sum(r < 1 - eps_low for r in ratios)
    above = sum(r > 1 + eps_high for r in ratios)
    return {
        "loss_objective": -_agg_py(surr, mode, max_tokens),
        "loss_kl": kl_coef * _agg_py(kl, mode, max_tokens),
        "loss_entropy": -ent_coef * _agg_py(ent, mode, max_tokens),
        "kl_ref": _agg_py(kl, "token_mean", None),  # the logged metrics: nats per response token (issue 43)
        "entropy": _agg_py(ent, "token_mean", None),
        "ess": sum(iw) ** 2 / (n * sum(w * w for w in iw)),
        "clip_fraction": (below + above) / n,
        "clip_fraction_low": below / n,
        "clip_fraction_high": above / n,
        "kl_behaviour": sum(log_beh_minus_cur) / n,
        "ratio_mean": sum(ratios) / n,
        "ratio_max": max(ratios),
        "num_tokens": float(n),
        "behaviour_weight_mean": sum(bw) / n if bw else 1.0,
        "behaviour_weight_masked": sum(masked) / n if masked else 0.0,
    }


def test_hand_numbers_sanity():
    """Pin a few values worked out on paper, so the python reference above is itself checked."""
    e = _hand_expected(0.2, 0.28, "token_mean", None, 0.0, 0.0)
    # ratios: 1.25, 0.6, 1.5, 1.1 | 0.6667, 1.4, 1.0 ; bounds [0.8, 1.28]
    # surrogates: 1.875, min(0.9, 1.2)=0.9, min(2.25, 1.92)=1.92, 1.65 | min(-.5333,-.64)=-.64, min(-1.12,-1.024)=-1.12, -.8
    assert e["loss_objective"] == pytest.approx(-(1.875 + 0.9 + 1.92 + 1.65 - 0.64 - 1.12 - 0.8) / 7)
    assert e["clip_fraction_low"] == pytest.approx(2 / 7) and e["clip_fraction_high"] == pytest.approx(2 / 7)
    assert e["ratio_max"] == pytest.approx(1.5)


CLIPS = [(0.2, 0.28), (0.2, 0.2), (0.1, 0.45)]  # no ratio sits on a clip boundary


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("eps", CLIPS)
def test_hand_computed_example(aggregation, eps):
    model, td = _hand_batch()
    max_tokens = 5 if aggregation == "seq_mean_token_sum_norm" else None
    loss = GRPOLoss(model, clip_eps_low=eps[0], clip_eps_high=eps[1], kl_coef=0.3, entropy_coef=0.05,
                    aggregation=aggregation, max_tokens=max_tokens)
    out = loss(td)
    exp = _hand_expected(eps[0], eps[1], aggregation, max_tokens, 0.3, 0.05)
    for k, v in exp.items():
        assert out[k].item() == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert total_loss(out).item() == pytest.approx(exp["loss_objective"] + exp["loss_kl"] + exp["loss_entropy"],
                                                   rel=1e-5)


def test_hand_aggregations_are_distinct():
    """The three modes give three different numbers here (so the test above discriminates them);
    seq_mean_token_sum_norm divides by its constant (here the padded length T)."""
    model, td = _hand_batch()
    vals = {m: GRPOLoss(model, aggregation=m, max_tokens=T_HAND)(td)["loss_objective"].item() for m in AGGREGATIONS}
    assert len({round(v, 6) for v in vals.values()}) == 3
    exp = _hand_expected(0.2, 0.28, "seq_mean_token_sum_norm", T_HAND, 0.0, 0.0)
    assert vals["seq_mean_token_sum_norm"] == pytest.approx(exp["loss_objective"], rel=1e-5)


def test_hand_temperature():
    model, td = _hand_batch()
    out = GRPOLoss(model, temperature=2.0, entropy_coef=0.1, kl_coef=0.2)(td)
    exp = _hand_expected(0.2, 0.28, "token_mean", None, 0.2, 0.1, temperature=2.0)
    for k in ("loss_objective", "loss_kl", "entropy", "ess", "clip_fraction", "ratio_mean"):
        assert out[k].item() == pytest.approx(exp[k], rel=1e-5, abs=1e-6), k


def test_hand_decoupled_behaviour_correction():
    """AReaL: ratio vs old_log_probs, surrogate × min(π_old/π_behav, cap); ESS stays vs the behaviour policy."""
    model, td = _hand_batch(with_old=True)
    out = GRPOLoss(model, behaviour_weight_cap=1.2, kl_coef=0.1)(td)
    exp = _hand_expected(0.2, 0.28, "token_mean", None, 0.1, 0.0, cap=1.2)
    for k in ("loss_objective", "loss_kl", "ess", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
              "ratio_mean", "ratio_max", "behaviour_weight_mean", "kl_behaviour"):
        assert out[k].item() == pytest.approx(exp[k], rel=1e-5, abs=1e-6), k
    # some weights are really capped (0.75/0.6 = 1.25 > 1.2), so the cap is exercised
    assert any(po / pb > 1.2 for row in HAND_ROWS for *_x, pb, _pr, po in row["resp"])
    # without a cap: the anchor is still π_old and the weight π_old/π_behav is applied untruncated (issue 8
    # defect 5: old log-probs present never means "no off-policy correction")
    out_nocap = GRPOLoss(model)(td)
    exp_nocap = _hand_expected(0.2, 0.28, "token_mean", None, 0.0, 0.0, decoupled=True)
    for k in ("loss_objective", "ratio_mean", "behaviour_weight_mean"):
        assert out_nocap[k].item() == pytest.approx(exp_nocap[k], rel=1e-5, abs=1e-6), k
    assert exp_nocap["behaviour_weight_mean"] != pytest.approx(1.0, abs=1e-3)


def test_hand_behaviour_weight_mask_mode():
    """AReaL's cap: tokens whose weight exceeds c are masked (weight 0, still counted), not truncated to c."""
    model, td = _hand_batch(with_old=True)
    out = GRPOLoss(model, behaviour_weight_cap=1.2, behaviour_weight_mode="mask")(td)
    exp = _hand_expected(0.2, 0.28, "token_mean", None, 0.0, 0.0, cap=1.2, weight_mode="mask")
    for k in ("loss_objective", "behaviour_weight_mean", "behaviour_weight_masked", "ratio_mean"):
        assert out[k].item() == pytest.approx(exp[k], rel=1e-5, abs=1e-6), k
    assert exp["behaviour_weight_masked"] > 0
    trunc = GRPOLoss(model, behaviour_weight_cap=1.2)(td)
    assert out["loss_objective"].item() != pytest.approx(trunc["loss_objective"].item(), abs=1e-4)
    with pytest.raises(ValueError, match="behaviour_weight_mode"):
        GRPOLoss(model, behaviour_weight_mode="clip")


def test_hand_gradient_wrt_logits():
    """d loss_objective / d logits, by the chain rule on paper: token_mean over N tokens,
    dL/dlogp_t = -A r_t / N when the unclipped branch is the min (or r inside the clip range), else 0;
    dlogp/dlogit_j = 1[j = token] - p_j."""
    model, td = _hand_batch(with_ref=False)
    eps_low, eps_high = 0.2, 0.28
    out = GRPOLoss(model, clip_eps_low=eps_low, clip_eps_high=eps_high)(td)
    out["loss_objective"].backward()
    expected = torch.zeros_like(model.table)
    n = sum(len(r["resp"]) for r in HAND_ROWS)
    n_zero = 0
    for b, row in enumerate(HAND_ROWS):
        A = row["A"]
        for t, tok, pc, pb, *_ in row["resp"]:
            r = pc / pb
            r_clip = min(max(r, 1 - eps_low), 1 + eps_high)
            active = r_clip == r or r * A < r_clip * A
            g = -A * r / n if active else 0.0
            n_zero += not active
            for j in range(2):
                pj = pc if j == tok else 1 - pc
                expected[b, t - 1, j] = g * ((1.0 if j == tok else 0.0) - pj)
    assert n_zero == 2  # the example has two tokens whose clipped branch is active (zero gradient)
    torch.testing.assert_close(model.table.grad, expected, rtol=1e-5, atol=1e-7)


def test_masked_aggregate_direct():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [100.0, 100.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert masked_aggregate(x, m, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert masked_aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)  # empty row skipped
    assert masked_aggregate(x, m, "seq_mean_token_sum_norm", max_tokens=10).item() == pytest.approx((6 / 10 + 4 / 10) / 2)
    for mode in AGGREGATIONS:  # an all-empty mask gives 0, not NaN
        assert masked_aggregate(x, torch.zeros_like(m), mode, max_tokens=4).item() == 0.0
    with pytest.raises(ValueError, match="unknown aggregation"):
        masked_aggregate(x, m, "sum")


def test_disabled_terms_and_errors():
    model, td = _hand_batch(with_ref=False)
    out = GRPOLoss(model)(td)  # kl_coef = entropy_coef = 0: no ref needed, zero loss terms, NaN metrics
    assert out["loss_kl"].item() == 0.0 and out["loss_entropy"].item() == 0.0
    assert math.isnan(out["kl_ref"].item()) and math.isnan(out["entropy"].item())
    with pytest.raises(ValueError, match="ref_log_probs"):
        GRPOLoss(model, kl_coef=0.1)(td)
    with pytest.raises(ValueError, match="advantage"):
        GRPOLoss(model)(td.exclude("advantage"))
    bad = TensorDict(dict(td.items()), batch_size=[])
    bad["advantage"] = torch.ones(2)  # 3 rows of tokens
    with pytest.raises(ValueError, match="advantage has 2 rows"):
        GRPOLoss(model)(bad)
    bad = TensorDict(dict(td.items()), batch_size=[])
    bad["sample_log_probs"] = td["sample_log_probs"][:, :-1]
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        GRPOLoss(model)(bad)
    for kw in (dict(clip_eps_low=1.0), dict(clip_eps_low=-0.1), dict(clip_eps_high=-0.1), dict(aggregation="sum"),
               dict(kl_coef=-1.0), dict(entropy_coef=-1.0), dict(temperature=0.0), dict(behaviour_weight_cap=0.0)):
        with pytest.raises(ValueError):
            GRPOLoss(model, **kw)


# ======================================================================================================================
# Tiny HF Llama (vocabulary of the tiny-random tokenizer), fixed seed
# ======================================================================================================================
@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      initializer_range=0.1, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval()


def _hf_batch(model, tok, *, lengths=(10, 7, 9, 5), prompt=(3, 2, 4, 2), T=None, noise=0.4, seed=0):
    """Right-padded batch; behaviour log-probs = current ones + noise (so ratios spread over the clip bounds)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    T = T or max(lengths)
    V = model.config.vocab_size
    tokens = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)
    for b, (L, P) in enumerate(zip(lengths, prompt)):
        tokens[b, :L] = torch.randint(3, V, (L,), generator=g)
        attn[b, :L] = True
        resp[b, P:L] = True
    with torch.no_grad():
        cur, _ = token_log_probs(model, tokens, attn)
    behav = torch.where(resp, cur + noise * torch.randn(B, T, generator=g), torch.zeros(()))
    ref = torch.where(resp, cur + 0.3 * torch.randn(B, T, generator=g), torch.zeros(()))
    adv = torch.randn(B, generator=g)
    return TensorDict(tokens=tokens, attention_mask=attn, response_mask=resp, sample_log_probs=behav,
                      ref_log_probs=ref, advantage=adv, batch_size=[B])


# ======================================================================================================================
# 2. Parity with TorchRL 0.14.1's GRPOLoss
# ======================================================================================================================
# Two ways of running TorchRL's loss, both used below:
#  (a) end to end: TorchRL's own TransformersWrapper (input_mode="tokens", generate=False, pad_output=True) around
#      the same HF model, masking_strategy="rlhf" with ("masks", "all_assistant_mask") = our response mask. TorchRL
#      then computes the current log-probs itself, so the test also checks that both sides align token t with
#      logits[t-1] the same way. Their position 0 is scored against all-zero logits (-log V, not 0), so position 0
#      can never be in a shared mask: the masks coincide on response tokens only, and TorchRL's per-position means
#      (clip_fraction, kl_to_ref, entropy) are diluted by n_masked / (B*T).
#  (b) a GRPOLoss subclass whose `_get_cur_log_prob` returns our current log-probs and a mask covering every
#      position: the "every token is a response token, no padding" case, where the diluted means must equal ours.
PARITY_TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def trl_wrapper(model, tok):
    from torchrl.modules.llm import TransformersWrapper

    return TransformersWrapper(model, tokenizer=tok, input_mode="tokens", generate=False, pad_output=True)


def _to_torchrl_td(td):
    B, T = td["tokens"].shape
    return TensorDict(
        {
            "tokens": {"full": td["tokens"]},
            "masks": {"all_attention_mask": td["attention_mask"], "all_assistant_mask": td["response_mask"]},
            "log_probs": {"full": td["sample_log_probs"]},
            "next": {"ref_log_probs": {"full": td["ref_log_probs"]}},
            # TorchRL expects a per-token advantage [B, T, 1]
            "advantage": td["advantage"][:, None, None].expand(B, T, 1).clone(),
        },
        batch_size=[B],
    )


def _torchrl_loss(actor, eps, **kw):
    from torchrl.objectives.llm import GRPOLoss as TorchRLGRPOLoss

    return TorchRLGRPOLoss(actor, clip_epsilon=eps, masking_strategy="rlhf", **kw)


@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.4)])
def test_parity_torchrl_wrapper(model, tok, trl_wrapper, eps):
    td = _hf_batch(model, tok, lengths=(9, 9, 9, 9), prompt=(3, 2, 4, 2))  # no padding
    B, T = td["tokens"].shape
    theirs = _torchrl_loss(trl_wrapper, eps, entropy_bonus=True, entropy_coeff=0.07, kl_to_ref_coeff=0.4)(
        _to_torchrl_td(td))
    ours = GRPOLoss(model, clip_eps_low=eps[0], clip_eps_high=eps[1], kl_coef=0.4, entropy_coef=0.07)(td)
    # the clip really acts on this batch, on both sides of the range
    assert ours["clip_fraction_low"] > 0 and ours["clip_fraction_high"] > 0
    torch.testing.assert_close(ours["loss_objective"], theirs.loss_objective, **PARITY_TOL)
    torch.testing.assert_close(ours["ess"], theirs.ESS, **PARITY_TOL)
    torch.testing.assert_close(ours["loss_entropy"], theirs.loss_entropy, **PARITY_TOL)
    # TorchRL's kl_approx is a mean of log π_behav - log π_θ over all B*T positions (0 off the mask)
    dilution = td["response_mask"].sum() / (B * T)
    assert dilution < 1
    torch.testing.assert_close(ours["kl_behaviour"] * dilution, theirs.kl_approx, **PARITY_TOL)
    # per-position means on their side = our masked means × n_masked / (B*T)
    torch.testing.assert_close(ours["clip_fraction"] * dilution, theirs.clip_fraction, **PARITY_TOL)
    torch.testing.assert_close(ours["kl_ref"] * dilution, theirs.kl_to_ref, **PARITY_TOL)
    torch.testing.assert_close(ours["loss_kl"] * dilution, theirs.loss_kl_to_ref, **PARITY_TOL)
    torch.testing.assert_close(ours["entropy"] * dilution, theirs.entropy, **PARITY_TOL)
    # gradients of the objective agree too
    model.zero_grad()
    theirs.loss_objective.backward()
    g_theirs = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ours["loss_objective"].backward()
    for p, gt in zip(model.parameters(), g_theirs):
        torch.testing.assert_close(p.grad, gt, rtol=1e-4, atol=1e-7)
    model.zero_grad()


def test_parity_torchrl_padding_dilution(model, tok, trl_wrapper):
    """Right padding: same objective, but TorchRL's clip fraction is diluted by padding (and prompt) positions,
    and shrinks as padding columns are added, while ours stays the fraction of response tokens."""
    eps = (0.2, 0.28)
    td = _hf_batch(model, tok)  # rows of length 10, 7, 9, 5 -> right padding
    td_wide = _pad_right(td, 6, tok.pad_token_id)
    results = []
    for batch in (td, td_wide):
        theirs = _torchrl_loss(trl_wrapper, eps, entropy_bonus=False)(_to_torchrl_td(batch))
        ours = GRPOLoss(model, clip_eps_low=eps[0], clip_eps_high=eps[1])(batch)
        torch.testing.assert_close(ours["loss_objective"], theirs.loss_objective, **PARITY_TOL)
        torch.testing.assert_close(ours["ess"], theirs.ESS, **PARITY_TOL)
        n_resp = batch["response_mask"].sum().item()
        n_clipped = ours["clip_fraction"].item() * n_resp
        assert n_clipped >= 2
        assert theirs.clip_fraction.item() == pytest.approx(n_clipped / batch["tokens"].numel(), rel=1e-5)
        results.append((ours["clip_fraction"].item(), theirs.clip_fraction.item()))
    (ours_a, theirs_a), (ours_b, theirs_b) = results
    assert ours_a == pytest.approx(ours_b, abs=1e-7)  # ours: unchanged by padding
    assert theirs_b < theirs_a < ours_a  # theirs: diluted, more so with more padding


def test_parity_torchrl_all_tokens_masked_in(model, tok):
    """(b): every position is a response token and there is no padding: TorchRL's per-position means equal our
    masked ones exactly; objective, ESS and k3 KL-to-ref agree."""
    from torchrl.objectives.llm import GRPOLoss as TorchRLGRPOLoss

    td = _hf_batch(model, tok, lengths=(8, 8, 8), prompt=(0, 0, 0))
    td["response_mask"] = td["attention_mask"].clone()  # includes position 0 (log-prob 0 on both sides)
    assert td["response_mask"].all()
    cur, _ = token_log_probs(model, td["tokens"], td["attention_mask"])

    class GivenLogProbGRPOLoss(TorchRLGRPOLoss):
        # TorchRL only needs `dist.mask` from the distribution when the entropy bonus is off
        def _get_cur_log_prob(self, tensordict):
            return cur, SimpleNamespace(mask=td["response_mask"]), False

    for eps in [(0.2, 0.2), (0.2, 0.28)]:
        theirs = GivenLogProbGRPOLoss(None, clip_epsilon=eps, entropy_bonus=False, kl_to_ref_coeff=0.3)(
            _to_torchrl_td(td))
        ours = GRPOLoss(model, clip_eps_low=eps[0], clip_eps_high=eps[1], kl_coef=0.3)(td)
        assert ours["clip_fraction"] > 0
        torch.testing.assert_close(ours["loss_objective"], theirs.loss_objective, **PARITY_TOL)
        torch.testing.assert_close(ours["clip_fraction"], theirs.clip_fraction, **PARITY_TOL)
        torch.testing.assert_close(ours["ess"], theirs.ESS, **PARITY_TOL)
        torch.testing.assert_close(ours["kl_ref"], theirs.kl_to_ref, **PARITY_TOL)
        torch.testing.assert_close(ours["loss_kl"], theirs.loss_kl_to_ref, **PARITY_TOL)
        torch.testing.assert_close(ours["kl_behaviour"], theirs.kl_approx, **PARITY_TOL)


# ======================================================================================================================
# 3. Policy == behaviour
# ======================================================================================================================
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_on_policy_batch(model, tok, aggregation):
    td = _hf_batch(model, tok, noise=0.0)  # behaviour log-probs = token_log_probs of the same model
    out = GRPOLoss(model, aggregation=aggregation, max_tokens=12)(td)
    assert out["ess"].item() == pytest.approx(1.0, abs=1e-5)
    assert out["clip_fraction"].item() == 0.0
    assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert out["ratio_max"].item() == pytest.approx(1.0, abs=1e-5)
    assert abs(out["kl_behaviour"].item()) < 1e-6
    # ratio 1 everywhere: the objective is minus the aggregated advantage
    A = td["advantage"][:, None].expand_as(td["tokens"]).float()
    expected = -masked_aggregate(A, td["response_mask"] & td["attention_mask"], aggregation, 12)
    assert out["loss_objective"].item() == pytest.approx(expected.item(), abs=1e-5)


# ======================================================================================================================
# 4. Padding invariance
# ======================================================================================================================
def _pad_right(td, extra, pad_id):
    B, T = td["tokens"].shape
    out = {}
    for k, v in td.items():
        if v.ndim == 2:
            fill = pad_id if k == "tokens" else 0
            out[k] = torch.cat([v, torch.full((B, extra), fill, dtype=v.dtype)], 1)
        else:
            out[k] = v
    return TensorDict(out, batch_size=[B])


def _to_left_padding(td, extra, pad_id):
    """Move every row's real tokens to the right end of a [B, T + extra] tensor."""
    B, T = td["tokens"].shape
    T2 = T + extra
    out = {}
    lengths = td["attention_mask"].sum(-1)
    for k, v in td.items():
        if v.ndim != 2:
            out[k] = v
            continue
        fill = pad_id if k == "tokens" else 0
        new = torch.full((B, T2), fill, dtype=v.dtype)
        for b in range(B):
            L = int(lengths[b])
            new[b, T2 - L:] = v[b, :L]
        out[k] = new
    return TensorDict(out, batch_size=[B])


METRICS = ("loss_objective", "loss_kl", "loss_entropy", "ess", "clip_fraction", "clip_fraction_low",
           "clip_fraction_high", "kl_ref", "kl_behaviour", "entropy", "ratio_mean", "ratio_max", "num_tokens")


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_padding_invariance(model, tok, aggregation):
    td = _hf_batch(model, tok)
    # max_tokens fixed: with the default (max_tokens = padded T) seq_mean_token_sum_norm depends on padding
    loss = GRPOLoss(model, kl_coef=0.2, entropy_coef=0.01, aggregation=aggregation, max_tokens=16)
    base = loss(td)
    assert base["clip_fraction"] > 0
    right = loss(_pad_right(td, 5, tok.pad_token_id))
    for k in METRICS:
        torch.testing.assert_close(right[k], base[k], rtol=1e-6, atol=1e-6, msg=k)
    left = loss(_to_left_padding(td, 3, tok.pad_token_id))
    for k in METRICS:
        torch.testing.assert_close(left[k], base[k], rtol=1e-5, atol=1e-5, msg=k)
    # the values of padded tokens (attention_mask 0) do not matter
    junk = _pad_right(td, 5, tok.pad_token_id)
    pad = ~junk["attention_mask"]
    junk["tokens"] = torch.where(pad, torch.randint(3, 50, junk["tokens"].shape), junk["tokens"])
    junk["sample_log_probs"] = torch.where(pad, torch.full_like(junk["sample_log_probs"], -7.0), junk["sample_log_probs"])
    junk["response_mask"] = junk["response_mask"] | pad  # a response mask spilling onto padding is cut by attention_mask
    out = loss(junk)
    for k in METRICS:
        torch.testing.assert_close(out[k], base[k], rtol=1e-6, atol=1e-6, msg=k)


def test_left_padding_with_absolute_positions():
    """token_log_probs counts positions over real tokens only, so left padding also leaves a model with absolute
    position embeddings (GPT-2) unchanged (RoPE models like Llama are shift-invariant and would not notice)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                     initializer_range=0.2)).eval()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 64, (2, 7), generator=g)
    attn = torch.ones(2, 7, dtype=torch.long)
    attn[1, 5:] = 0
    right, _ = token_log_probs(gpt, tokens, attn)
    td = TensorDict(tokens=tokens, attention_mask=attn, batch_size=[2])
    left_td = _to_left_padding(td, 2, 0)
    left, _ = token_log_probs(gpt, left_td["tokens"], left_td["attention_mask"])
    # compare every real token after the first one of each row (the first has no context)
    for b, L in enumerate(attn.sum(-1).tolist()):
        torch.testing.assert_close(left[b, -L + 1:], right[b, 1:L], rtol=1e-5, atol=1e-5)


def test_token_log_probs_chunking_and_positions(model, tok):
    td = _hf_batch(model, tok)
    lp, ent = token_log_probs(model, td["tokens"], td["attention_mask"], with_entropy=True)
    lp2, ent2 = token_log_probs(model, td["tokens"], td["attention_mask"], with_entropy=True, logits_chunk=3)
    torch.testing.assert_close(lp2, lp)
    torch.testing.assert_close(ent2, ent)
    assert (lp[:, 0] == 0).all() and (lp[~td["attention_mask"]] == 0).all() and (ent[~td["attention_mask"]] == 0).all()
    # position t scores tokens[t] with the logits at t-1 (independent recomputation on row 0)
    L = int(td["attention_mask"][0].sum())
    with torch.no_grad():
        logits = model(input_ids=td["tokens"][:1, :L]).logits[0].double()
    ref = torch.log_softmax(logits[:-1], -1).gather(-1, td["tokens"][0, 1:L, None])[:, 0]
    torch.testing.assert_close(lp[0, 1:L].double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        token_log_probs(model, td["tokens"], td["attention_mask"][:, :-1])


# ======================================================================================================================
# 5. Gradients
# ======================================================================================================================
def test_backward_finite_grads(model, tok):
    m = copy.deepcopy(model)
    td = _hf_batch(m, tok)
    out = GRPOLoss(m, kl_coef=0.1, entropy_coef=0.01)(td)
    total_loss(out).backward()
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_sgd_step_moves_log_prob_with_advantage(model, tok, sign):
    m = copy.deepcopy(model)
    td = _hf_batch(m, tok, lengths=(8,), prompt=(7,), noise=0.0)  # a single response token: the last one
    td["advantage"] = torch.tensor([sign])
    mask = td["response_mask"]
    before, _ = token_log_probs(m, td["tokens"], td["attention_mask"])
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out = GRPOLoss(m)(td)
    total_loss(out).backward()
    opt.step()
    with torch.no_grad():
        after, _ = token_log_probs(m, td["tokens"], td["attention_mask"])
    delta = (after - before.detach())[mask].item()
    assert sign * delta > 1e-4, delta


# ======================================================================================================================
# 6. Truncated sampling (top-k / top-p): the ratio is taken over the processed distribution the sampler drew from
# ======================================================================================================================
def _rollout_td(model, tok, temperature, top_p, top_k, seed=1):
    from tests.test_log_probs import backend_rollout
    from torchrl_grpo.backends.base import SamplingConfig

    prompts = [[5, 6, 7, 8]] * 4 + [[30, 31, 32]] * 4
    sampling = SamplingConfig(max_new_tokens=10, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    tokens, am, rm, behav = backend_rollout(model, sampling, prompts, pad_id=tok.pad_token_id)
    adv = torch.randn(len(prompts), generator=torch.Generator().manual_seed(seed))
    return TensorDict(tokens=tokens, attention_mask=am.bool(), response_mask=rm, sample_log_probs=behav,
                      advantage=adv, batch_size=[len(prompts)])


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 0.7, 0), (0.8, 0.7, 0), (0.8, 1.0, 10), (1.2, 0.9, 50),
                                                     (0.6, 0.5, 20), (1.0, 1.0, 0)])
def test_on_policy_rollout_with_truncated_sampling(model, tok, temperature, top_p, top_k):
    """Behaviour log-probs from the transformers backend, scored by the same model: ratio 1, nothing clipped."""
    td = _rollout_td(model, tok, temperature, top_p, top_k)
    out = GRPOLoss(model, temperature=temperature, top_p=top_p, top_k=top_k)(td)
    assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-3)
    assert out["ratio_max"].item() == pytest.approx(1.0, abs=1e-3)
    assert out["clip_fraction"].item() == 0.0
    assert abs(out["kl_behaviour"].item()) < 1e-4
    if top_p < 1 or top_k > 0:  # scoring without the truncation (the defect) puts every ratio below 1
        plain = GRPOLoss(model, temperature=temperature)(td)
        assert plain["ratio_mean"].item() < 0.99


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_token_outside_the_nucleus_gives_finite_loss_and_gradients(model, tok, sign):
    """Off-policy, a sampled token can fall outside the current nucleus: its log-prob is the finite floor
    MASKED_LOG_PROB (not -inf), its ratio ~0, and loss, KL, entropy and every gradient stay finite."""
    from torchrl_grpo.objectives.log_probs import MASKED_LOG_PROB

    T, p = 0.8, 0.7
    m = copy.deepcopy(model)
    td = _rollout_td(m, tok, T, p, 0)
    b = 0
    t = int(td["response_mask"][b].nonzero()[0])
    with torch.no_grad():
        logits = m(input_ids=td["tokens"][b : b + 1, :t]).logits[0, -1]
    td["tokens"][b, t] = logits.argmin()  # the least likely token: far outside a 0.7 nucleus
    td["advantage"] = torch.full_like(td["advantage"], sign)
    td["ref_log_probs"] = td["sample_log_probs"].clone()
    with torch.no_grad():
        lp, _ = token_log_probs(m, td["tokens"], td["attention_mask"], temperature=T, top_p=p,
                                response_mask=td["response_mask"])
    assert lp[b, t].item() == MASKED_LOG_PROB
    assert torch.isfinite(lp).all() and (lp[td["response_mask"]] > MASKED_LOG_PROB).sum() > 0
    out = GRPOLoss(m, temperature=T, top_p=p, kl_coef=0.1, entropy_coef=0.01)(td)
    for k in ("loss_objective", "loss_kl", "loss_entropy", "ess", "kl_ref", "entropy", "ratio_mean"):
        assert torch.isfinite(out[k]), k
    assert out["clip_fraction_low"].item() > 0  # that token's ratio ~ exp(MASKED_LOG_PROB - behav) ~ 0
    total_loss(out).backward()
    grads = [q.grad for q in m.parameters() if q.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


def test_truncated_log_prob_gradient_is_the_renormalised_softmax_gradient():
    """d log pi(o_t) / d z_j = (1[j = o_t] - pi_j) / T over the kept tokens (pi = softmax over the kept set), 0 for
    dropped tokens; the kept set is computed here by hand (descending sort, drop once the preceding mass >= top_p,
    after keeping the top_k largest)."""
    g = torch.Generator().manual_seed(0)
    V, T, top_p, top_k = 8, 0.7, 0.8, 6
    table = torch.randn(1, 5, V, generator=g) * 2
    stub = StubLM(table)
    tokens = torch.zeros(1, 5, dtype=torch.long)
    attn = torch.ones(1, 5, dtype=torch.bool)
    expected = torch.zeros_like(table)
    for t in range(1, 5):
        z = (table[0, t - 1] / T).tolist()
        order = sorted(range(V), key=lambda j: -z[j])[:top_k]
        w = [math.exp(z[j]) for j in order]
        probs = [x / sum(w) for x in w]
        kept, mass = [], 0.0
        for j, pj in zip(order, probs):
            if mass >= top_p:
                break
            kept.append(j)
            mass += pj
        assert len(kept) < V
        tokens[0, t] = kept[-1]  # the least likely kept token
        zk = torch.tensor([z[j] for j in kept])
        pk = zk.softmax(0)
        for i, j in enumerate(kept):
            expected[0, t - 1, j] = ((1.0 if j == kept[-1] else 0.0) - pk[i].item()) / T
    lp, _ = token_log_probs(stub, tokens, attn, temperature=T, top_p=top_p, top_k=top_k)
    lp[0, 1:].sum().backward()
    torch.testing.assert_close(stub.table.grad, expected, rtol=1e-5, atol=1e-6)


def test_sum_norm_needs_its_constant():
    """Issue 43 (4): without ``max_tokens`` seq_mean_token_sum_norm divided by each call's own padded width, so the
    gradient depended on the micro-batch plan (rel. diff 0.89). Construction (and masked_aggregate) now refuse it."""
    model, td = _hand_batch()
    with pytest.raises(ValueError, match="max_tokens"):
        GRPOLoss(model, aggregation="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="max_tokens"):
        masked_aggregate(td["sample_log_probs"], td["response_mask"], "seq_mean_token_sum_norm")
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_tokens"):
            GRPOLoss(model, aggregation="seq_mean_token_sum_norm", max_tokens=bad)
    GRPOLoss(model, aggregation="seq_mean_token_mean")  # the other aggregations need no constant
