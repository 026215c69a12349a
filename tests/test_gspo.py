"""GSPO (Zheng et al., 2025, arXiv:2507.18071): ``loss.importance_level=sequence``.

The loss's log-probs are replaced by hand-made ones (``token_log_probs`` patched in objectives/loss.py), so the
sequence ratio, the clipped objective, its gradient and the metrics are compared with the paper's formulas written
out by hand, row by row in plain Python: Eq. (7) s_i = exp(mean over the response tokens of log pi_theta - log
pi_old), Eq. (5) mean_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i). Rows are right- and left-padded,
of different lengths, with prompt tokens and junk log-probs off the response mask (which must not count).
"""
from __future__ import annotations

import copy
import math
from contextlib import nullcontext

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

import torchrl_grpo.objectives.loss as loss_mod
from torchrl_grpo.config import validate_config
from torchrl_grpo.objectives.loss import GRPOLoss
from torchrl_grpo.training.update import GRPOUpdate

EPS = (3e-4, 4e-4)  # the paper's clipping range

# 3 episodes, T = 8. Row 0: right-padded, prompt 2, response 4 (cols 2-5). Row 1: left-padded (2 pads), prompt 1,
# response 5 (cols 3-7). Row 2: right-padded, prompt 3, response 2 (cols 3-4).
RESP = [[2, 3, 4, 5], [3, 4, 5, 6, 7], [3, 4]]
REAL = [range(0, 6), range(2, 8), range(0, 5)]
ADV = [1.0, -0.5, 2.0]


def _cols(rows):
    m = torch.zeros(3, 8, dtype=torch.bool)
    for i, cols in enumerate(rows):
        m[i, list(cols)] = True
    return m


def _hand_batch(seed=0):
    """Log-probs on the response tokens; junk (5.0 / -7.0) elsewhere, which a correct loss never reads."""
    g = torch.Generator().manual_seed(seed)
    rm, am = _cols(RESP), _cols(REAL)
    junk = torch.full((3, 8), 5.0)
    old = torch.where(rm, -torch.rand(3, 8, generator=g) - 0.2, junk)
    behav = torch.where(rm, old - 0.05 * torch.randn(3, 8, generator=g), torch.full((3, 8), -7.0))
    # pi_theta: per row a shift of a few 1e-4 (inside / outside the tight clip range) plus per-token noise
    shift = torch.tensor([[2e-4], [-9e-4], [1.5e-3]])
    cur = torch.where(rm, old + shift + 1e-4 * torch.randn(3, 8, generator=g), junk)
    td = TensorDict(tokens=torch.arange(24).reshape(3, 8), attention_mask=am, response_mask=rm,
                    sample_log_probs=behav, old_log_probs=old, advantage=torch.tensor(ADV), batch_size=[3])
    return td, cur


def _run(monkeypatch, td, cur, **kw):
    """GRPOLoss on hand-made current log-probs ``cur`` (a leaf with gradient); returns (output, d loss / d cur)."""
    logp = cur.clone().requires_grad_(True)
    monkeypatch.setattr(loss_mod, "token_log_probs", lambda *a, **k: (logp, None))
    out = GRPOLoss(torch.nn.Linear(1, 1), **kw)(td)
    out["loss_objective"].backward()
    return out, logp.grad


def _s(cur, old, i):
    """Eq. (7), by hand: exp of the mean over row i's response tokens of log pi_theta - log pi_old."""
    return math.exp(sum(float(cur[i, t] - old[i, t]) for t in RESP[i]) / len(RESP[i]))


def test_sequence_ratio_and_clipped_objective_equal_the_papers_formulas(monkeypatch):
    td, cur = _hand_batch()
    old = td["old_log_probs"]
    out, grad = _run(monkeypatch, td, cur, clip_eps_low=EPS[0], clip_eps_high=EPS[1],
                     aggregation="seq_mean_token_mean", importance_level="sequence", behaviour_weight_cap=None)
    s = [_s(cur, old, i) for i in range(3)]
    w = [math.exp(sum(float(old[i, t] - td["sample_log_probs"][i, t]) for t in RESP[i]) / len(RESP[i]))
         for i in range(3)]  # the sequence-level behaviour weight (module docstring)
    clip = [min(max(x, 1 - EPS[0]), 1 + EPS[1]) for x in s]
    per_seq = [w[i] * min(s[i] * ADV[i], clip[i] * ADV[i]) for i in range(3)]
    assert float(out["loss_objective"].detach()) == pytest.approx(-sum(per_seq) / 3, rel=1e-6)  # Eq. (5), mean over the group
    # metrics at the sequence level, each episode counted once per response token
    n = [len(r) for r in RESP]
    clipped = [x < 1 - EPS[0] or x > 1 + EPS[1] for x in s]
    assert clipped == [False, True, True]  # the hand-made shifts: inside, below, above the range
    assert float(out["clip_fraction"]) == pytest.approx(sum(c * k for c, k in zip(clipped, n)) / sum(n))
    assert float(out["clip_fraction_low"]) == pytest.approx(n[1] / sum(n))
    assert float(out["ratio_mean"]) == pytest.approx(sum(x * k for x, k in zip(s, n)) / sum(n), rel=1e-6)
    assert float(out["ratio_max"]) == pytest.approx(max(s), rel=1e-6)
    assert float(out["behaviour_weight_mean"]) == pytest.approx(sum(x * k for x, k in zip(w, n)) / sum(n), rel=1e-6)
    # gradient of Eq. (5): d s_i / d log pi(y_t) = s_i / |y_i| on row i's response tokens, 0 where the clip is active
    # (row 1: A < 0 and s below 1 - eps: min takes the clipped branch; row 2: A > 0 and s above 1 + eps: likewise)
    assert torch.isfinite(grad).all()
    for i in range(3):
        expect = 0.0 if clipped[i] else -w[i] * ADV[i] * s[i] / n[i] / 3
        for t in range(8):
            want = expect if t in RESP[i] else 0.0
            assert float(grad[i, t]) == pytest.approx(want, rel=1e-5, abs=1e-9), (i, t)


def test_sequence_level_behaviour_weight_caps_whole_episodes(monkeypatch):
    td, cur = _hand_batch(seed=3)
    td["sample_log_probs"] = td["old_log_probs"] - torch.tensor([[0.5], [0.01], [-0.2]])  # w_i = e^0.5, e^0.01, e^-0.2
    old = td["old_log_probs"]
    s = [_s(cur, old, i) for i in range(3)]
    n = [len(r) for r in RESP]
    kw = dict(clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_mean_token_mean", importance_level="sequence",
              behaviour_weight_cap=1.2)
    trunc, _ = _run(monkeypatch, td, cur, **kw)
    w = [min(math.exp(0.5), 1.2), math.exp(0.01), math.exp(-0.2)]
    assert float(trunc["loss_objective"].detach()) == pytest.approx(-sum(w[i] * s[i] * ADV[i] for i in range(3)) / 3, rel=1e-5)
    masked, _ = _run(monkeypatch, td, cur, **kw, behaviour_weight_mode="mask")
    w = [0.0, math.exp(0.01), math.exp(-0.2)]  # episode 0 (w = e^0.5 > 1.2) masked whole
    assert float(masked["loss_objective"].detach()) == pytest.approx(-sum(w[i] * s[i] * ADV[i] for i in range(3)) / 3, rel=1e-5)
    assert float(masked["behaviour_weight_masked"]) == pytest.approx(n[0] / sum(n))


def test_token_aggregation_weights_each_sequence_by_its_length_and_the_token_level_is_unchanged(monkeypatch):
    td, cur = _hand_batch()
    old = td["old_log_probs"]
    wide = dict(clip_eps_low=0.2, clip_eps_high=0.28, behaviour_weight_cap=None)
    td_plain = td.exclude("old_log_probs")  # behaviour anchor: no behaviour weight
    seq, _ = _run(monkeypatch, td_plain, cur, importance_level="sequence", aggregation="token_mean", **wide)
    s = [math.exp(sum(float(cur[i, t] - td["sample_log_probs"][i, t]) for t in RESP[i]) / len(RESP[i]))
         for i in range(3)]
    n = [len(r) for r in RESP]
    assert float(seq["loss_objective"].detach()) == pytest.approx(-sum(k * x * a for k, x, a in zip(n, s, ADV)) / sum(n),
                                                         rel=1e-6)
    tok, _ = _run(monkeypatch, td, cur, **wide)  # default token level: GRPO's per-token ratio, as before
    ratios = [[math.exp(float(cur[i, t] - old[i, t])) for t in RESP[i]] for i in range(3)]
    assert float(tok["ratio_max"]) == pytest.approx(max(max(r) for r in ratios), rel=1e-6)


def test_importance_level_is_a_validated_config_choice():
    from torchrl_grpo.assembly.optimisation import loss_settings
    from torchrl_grpo.config import GRPOConfig

    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), {"loss": {"importance_level": "sequence"}})
    validate_config(cfg)
    assert loss_settings(cfg.loss)["importance_level"] == "sequence"
    cfg.loss.importance_level = "episode"
    with pytest.raises(ValueError, match="loss.importance_level"):
        validate_config(cfg)
    with pytest.raises(ValueError, match="importance_level must be one of"):
        GRPOLoss(torch.nn.Linear(1, 1), importance_level="episode")


def test_a_gspo_update_on_a_tiny_model_runs(tiny_model_and_tokenizer):
    from tests.test_update_syncs import _gsm8k_like_batch

    model = copy.deepcopy(tiny_model_and_tokenizer[0]).float().train()
    before = [p.detach().clone() for p in model.parameters()]
    loss = GRPOLoss(model, clip_eps_low=EPS[0], clip_eps_high=EPS[1], aggregation="seq_mean_token_mean",
                    importance_level="sequence")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    upd = GRPOUpdate(model, loss, opt, reference=None, device=torch.device("cpu"), autocast=nullcontext,
                     ppo_epochs=2, minibatch_size=4, micro_batch_size=3, max_tokens_per_mb=0, max_grad_norm=1.0,
                     anchor="auto", exact_log_probs=True, seed=0)
    m = upd(_gsm8k_like_batch(groups=2, samples=4, vocab=500), step=0)
    assert m["train/optimizer_steps"] == 4 and m["train/skipped_minibatches"] == 0
    for k in ("loss/total", "grad_norm", "ess", "ratio_mean", "clip_fraction"):
        assert math.isfinite(m[k]), k
    assert 0.0 < m["ess"] <= 1.0 + 1e-6 and 0.0 <= m["clip_fraction"] <= 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("config", ["grpo_gsm8k", "grpo_tau2", "grpo_cl"])
def test_sequence_level_takes_the_papers_clip_range_unless_the_user_set_one(config, caplog):
    """Issue 43 (5): ``loss.importance_level=sequence`` kept GRPO's 0.2 / 0.28 and token_mean silently. With the clip
    range and aggregation unset (null, as every shipped config leaves them) it now takes GSPO's 3e-4 / 4e-4 and the
    sequence mean (Eq. 5); the token level keeps DAPO's 0.2 / 0.28 and token_mean; a value the user sets is kept, and a
    GRPO-sized clip range at the sequence level is warned about."""
    from torchrl_grpo.assembly.optimisation import loss_settings

    def built(overrides):
        cfg = _compose_named(config, overrides)
        validate_config(cfg)
        return GRPOLoss(torch.nn.Linear(1, 1), **loss_settings(cfg.loss), max_tokens=64)

    seq = built(["loss.importance_level=sequence"])
    assert (seq.clip_eps_low, seq.clip_eps_high, seq.aggregation) == (3e-4, 4e-4, "seq_mean_token_mean")
    tok = built([])
    assert (tok.clip_eps_low, tok.clip_eps_high, tok.aggregation) == (0.2, 0.28, "token_mean")
    caplog.clear()
    mine = built(["loss.importance_level=sequence", "loss.clip_eps_low=0.1", "loss.clip_eps_high=0.15",
                  "loss.aggregation=token_mean"])
    assert (mine.clip_eps_low, mine.clip_eps_high, mine.aggregation) == (0.1, 0.15, "token_mean")
    assert any("rarely clips" in r.getMessage() for r in caplog.records)
    half = built(["loss.importance_level=sequence", "loss.clip_eps_high=5e-4"])  # one set, the other the paper's
    assert (half.clip_eps_low, half.clip_eps_high) == (3e-4, 5e-4)
    with pytest.raises(ValueError, match="loss.clip_eps_low"):
        built(["loss.clip_eps_low=1.5"])


def _compose_named(name, overrides):
    from hydra import compose, initialize_config_dir

    from tests.test_config_cli import REPO
    from torchrl_grpo.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def test_library_defaults_follow_the_importance_level():
    """The same rule for a library caller of GRPOLoss (no config)."""
    lin = torch.nn.Linear(1, 1)
    g = GRPOLoss(lin, importance_level="sequence")
    assert (g.clip_eps_low, g.clip_eps_high, g.aggregation, g.normaliser) == (3e-4, 4e-4, "seq_mean_token_mean",
                                                                              "episode")
    t = GRPOLoss(lin)
    assert (t.clip_eps_low, t.clip_eps_high, t.aggregation, t.normaliser) == (0.2, 0.28, "token_mean", "token")
    kept = GRPOLoss(lin, importance_level="sequence", clip_eps_low=1e-3, aggregation="token_mean")
    assert (kept.clip_eps_low, kept.clip_eps_high, kept.aggregation) == (1e-3, 4e-4, "token_mean")
