"""Issue 37: the declared loss interface (objectives/loss_interface.py) and the update's penalties list.

* GRPOLoss and SFTLoss declare the settings the update reads (scoring, ``normaliser``) and take the PPO anchor per
  call (``anchor=``): no mutable flag on the loss; the update refuses a loss that lacks a piece.
* Penalties (continual EWC) are the update's list, each its own ``loss_penalty_<name>`` entry and metric, instead
  of a transparent proxy around the loss that folded them into ``loss_kl``: the same gradient and step as that old
  fold, on a hand-made batch (the old behaviour is replayed here by a loss that folds the penalty as it did).
"""
from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
from tensordict import TensorDict

from torchrl_grpo.objectives.loss import GRPOLoss
from torchrl_grpo.objectives.loss_interface import NORMALISERS, Penalty, PolicyLoss, check_policy_loss
from torchrl_grpo.objectives.sft_loss import SFTLoss
from torchrl_grpo.training.update import GRPOUpdate
from tests.test_update_syncs import policy  # noqa: F401 (fixture: the tiny model, fp32, dropout off)




def _batch(n=4, T=12, seed=0, vocab=500):
    """Right-padded rows: a 4-token prompt, responses of different lengths, behaviour log-probs off by up to 0.3."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (n, T), generator=g)
    lengths = [T - 2 * i for i in range(n)]
    am = torch.zeros(n, T, dtype=torch.bool)
    rm = torch.zeros(n, T, dtype=torch.bool)
    for i, L in enumerate(lengths):
        am[i, :L], rm[i, 4:L] = True, True
    behav = torch.where(rm, -torch.rand(n, T, generator=g) - 0.5, torch.zeros(n, T))
    return TensorDict(tokens=tokens, attention_mask=am, response_mask=rm, sample_log_probs=behav,
                      advantage=torch.tensor([1.0, -0.5, 0.25, -0.75][:n]), response_tokens=rm.sum(-1),
                      batch_size=[n])


def _update(model, loss, anchor="behaviour"):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    return GRPOUpdate(model, loss, opt, reference=None, device=torch.device("cpu"), autocast=nullcontext,
                      ppo_epochs=1, minibatch_size=0, micro_batch_size=0, max_tokens_per_mb=0, max_grad_norm=1e9,
                      anchor=anchor, exact_log_probs=True, seed=0)


def test_losses_declare_the_interface_and_hold_no_anchor_flag(policy):
    grpo, sft = GRPOLoss(policy, temperature=0.7, top_p=0.9), SFTLoss(policy)
    for loss in (grpo, sft):
        assert isinstance(loss, PolicyLoss) and loss.normaliser in NORMALISERS
        check_policy_loss(loss)
        assert not hasattr(loss, "anchor_current")
    assert (grpo.temperature, grpo.top_p, grpo.top_k, grpo.normaliser) == (0.7, 0.9, 0, "token")
    assert GRPOLoss(policy, aggregation="seq_mean_token_mean").normaliser == "episode"
    assert (sft.temperature, sft.top_p, sft.top_k, sft.normaliser) == (1.0, 1.0, 0, "token")

    class NoNormaliser:
        temperature, top_p, top_k = 1.0, 1.0, 0

        def __call__(self, td, **kw):
            return td

    with pytest.raises(TypeError, match="normaliser"):
        _update(policy, NoNormaliser())
    bad = NoNormaliser()
    bad.normaliser = "sequence"
    with pytest.raises(TypeError, match="normaliser must be one of"):
        _update(policy, bad)


def test_the_anchor_is_a_per_call_argument(policy):
    td = _batch()
    loss = GRPOLoss(policy, behaviour_weight_cap=None)
    with torch.no_grad():
        plain = loss(td)  # no old_log_probs: the behaviour anchor, no weight
        current = loss(td, anchor="current")
        td_old = td.clone()
        from torchrl_grpo.objectives.log_probs import token_log_probs

        td_old["old_log_probs"], _ = token_log_probs(policy, td["tokens"], td["attention_mask"],
                                                     response_mask=td["response_mask"])
        recomputed = loss(td_old)  # None: old_log_probs present -> recomputed
        explicit = loss(td_old, anchor="recomputed")
        behaviour = loss(td_old, anchor="behaviour")  # π_old := π_behav even when old_log_probs are there
    assert float(plain["behaviour_weight_mean"]) == 1.0 and float(plain["ratio_mean"]) != pytest.approx(1.0)
    assert float(current["ratio_mean"]) == 1.0  # anchored at its own detached log-probs
    for k in ("loss_objective", "behaviour_weight_mean", "ratio_mean", "clip_fraction"):
        assert torch.allclose(current[k], recomputed[k], rtol=1e-6, atol=1e-7), k
        assert torch.equal(recomputed[k], explicit[k]) and torch.equal(behaviour[k], plain[k]), k
    with pytest.raises(ValueError, match="needs 'old_log_probs'"):
        loss(td, anchor="recomputed")
    with pytest.raises(ValueError, match="anchor must be one of"):
        loss(td, anchor="proximal")
    with pytest.raises(ValueError, match="needs 'old_log_probs'"):
        SFTLoss(policy)(td, anchor="recomputed")


@pytest.mark.parametrize("anchor,expected", [("auto", "current"), ("recompute", "recomputed"),
                                             ("behaviour", "behaviour")])
def test_the_update_passes_each_loss_call_its_anchor(policy, anchor, expected):
    upd = _update(policy, GRPOLoss(policy), anchor=anchor)
    upd.exact_log_probs = False  # auto: one optimizer step, a sampler with other numerics -> the current policy
    seen = []
    fwd = upd.loss_fn.forward

    def recorder(td, **kw):
        seen.append(kw.get("anchor"))
        return fwd(td, **kw)

    upd.loss_fn.forward = recorder
    m = upd(_batch(), step=0)
    assert seen and set(seen) == {expected}
    assert m["train/anchor_current"] == float(expected == "current")


class _OldFold(torch.nn.Module):
    """The behaviour before issue 37 (``PenalisedLoss``): the penalty folded into the loss's ``loss_kl`` entry and
    its detached value logged under its name."""

    def __init__(self, base: GRPOLoss, penalty, name: str) -> None:
        super().__init__()
        self.base, self.penalty, self.name = base, penalty, name
        self.temperature, self.top_p, self.top_k, self.normaliser = base.temperature, base.top_p, base.top_k, "token"

    def forward(self, td, **kw):
        out = self.base(td, **kw)
        p = self.penalty()
        out["loss_kl"] = out["loss_kl"] + p
        out[self.name] = p.detach()
        return out


def _l2_pull(model, seed=1):
    """0.5 Σ (θ − θ*)² to a perturbed copy θ* of the weights: a penalty with a gradient on every parameter."""
    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    star = [(p.detach() + 0.01 * torch.randn(p.shape, generator=g)) for p in params]
    return lambda: 0.5 * sum(((p - s) ** 2).sum() for p, s in zip(params, star))


def test_penalties_sum_and_log_like_the_old_fold_on_a_hand_made_batch(policy):
    """Same update as the old wrapper: equal weights after the step (the penalty's gradient reaches every parameter
    the same way), the same ``loss/total`` up to float addition order, and the penalty now logged under its own
    ``loss_penalty_ewc`` instead of inside ``loss_kl`` (which keeps the KL term's value: 0 without a reference)."""
    batch = _batch()
    old_model, new_model = copy.deepcopy(policy), copy.deepcopy(policy)
    old_upd = _update(old_model, _OldFold(GRPOLoss(old_model, kl_coef=0.0), _l2_pull(old_model), "ewc_penalty"))
    new_upd = _update(new_model, GRPOLoss(new_model, kl_coef=0.0))
    new_upd.add_loss_penalty(_l2_pull(new_model), "ewc")
    pen_before = float(new_upd.penalties[0]().detach())
    assert pen_before > 0
    m_old, m_new = old_upd(batch.clone(), step=0), new_upd(batch.clone(), step=0)
    for (n, a), b in zip(old_model.named_parameters(), new_model.parameters()):
        assert torch.equal(a, b), n
    assert m_new["grad_norm"] == m_old["grad_norm"]
    assert m_new["loss/total"] == pytest.approx(m_old["loss/total"], rel=1e-6)
    assert m_new["loss_penalty_ewc"] == pytest.approx(m_old["ewc_penalty"], rel=1e-6)
    assert m_new["loss_penalty_ewc"] == pytest.approx(pen_before, rel=1e-6)
    assert m_new["loss_kl"] == 0.0 and m_old["loss_kl"] == pytest.approx(pen_before, rel=1e-6)
    assert "ewc_penalty" not in m_new and m_new["loss_objective"] == m_old["loss_objective"]


def test_penalty_names_are_checked():
    with pytest.raises(ValueError, match="penalty name"):
        Penalty("", lambda: torch.zeros(()))
    with pytest.raises(ValueError, match="penalty name"):
        Penalty("a-b", lambda: torch.zeros(()))
    with pytest.raises(TypeError, match="callable"):
        Penalty("l2", 3.0)
    assert Penalty("l2", lambda: torch.ones(())).key == "loss_penalty_l2"


def test_every_loss_config_key_reaches_the_loss_or_is_read_elsewhere():
    """build_optimisation passes ``loss.*`` to GRPOLoss by name (assembly/optimisation.loss_settings): a loss option
    is added in the config section and the loss's arguments only. A key that is neither is refused at build time."""
    from omegaconf import OmegaConf

    from torchrl_grpo.assembly.optimisation import LOSS_KEYS_ELSEWHERE, loss_settings
    from torchrl_grpo.config.schema import LossConfig

    section = OmegaConf.structured(LossConfig())
    got = loss_settings(section)
    assert set(got) | set(LOSS_KEYS_ELSEWHERE) == set(section.keys())
    GRPOLoss(torch.nn.Linear(1, 1), **got)  # every value is accepted as is
    with pytest.raises(ValueError, match="loss.clip_eps"):
        loss_settings({**OmegaConf.to_container(section), "clip_eps": 0.1})
