"""CL algorithms without a model: batch concatenation, replay's task draws and batch growth, KL anchor, registry."""
from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict

from torchrl_grpo.objectives.advantage import group_advantages
from torchrl_grpo.continual.algorithms import (
    ALGORITHMS,
    EWC,
    Joint,
    KLAnchor,
    Replay,
    Sequential,
    concat_batches,
)
from torchrl_grpo.assembly.continual_run import make_algorithm
from torchrl_grpo.rollout.episode_stats import non_tensor_list
from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer
from torchrl_grpo.training.update import GRPOUpdate


def batch(n_groups, G, T, rewards=None, domain="mock", first_task=0):
    n = n_groups * G
    tokens = torch.arange(n * T).reshape(n, T) + 1
    td = TensorDict({
        "tokens": tokens, "attention_mask": torch.ones(n, T, dtype=torch.bool),
        "response_mask": torch.zeros(n, T, dtype=torch.bool).index_fill_(1, torch.tensor([T - 1]), True),
        "sample_log_probs": torch.full((n, T), -0.5),
        "reward": torch.tensor(rewards if rewards is not None else [float(i % 2) for i in range(n)]),
        "group_id": torch.arange(n_groups).repeat_interleave(G),
        "num_turns": torch.ones(n, dtype=torch.long), "response_tokens": torch.ones(n, dtype=torch.long),
        "infra_error": torch.zeros(n, dtype=torch.bool),
    }, batch_size=[n])
    td["task"] = NonTensorStack(*[{"index": first_task + g} for g in range(n_groups) for _ in range(G)])
    td["info"] = NonTensorStack(*[{"domain": domain, "messages": []} for _ in range(n)])
    return td


def test_concat_pads_shifts_groups_and_keeps_advantages():
    a, b = batch(2, 2, 3), batch(1, 2, 5, rewards=[0.0, 1.0], domain="telecom")
    out = concat_batches([a, b], pad_token_id=-7)
    assert out.batch_size == torch.Size([6]) and out["tokens"].shape == (6, 5)
    assert (out["tokens"][:4, 3:] == -7).all() and torch.equal(out["tokens"][:4, :3], a["tokens"])
    assert not out["attention_mask"][:4, 3:].any() and not out["response_mask"][:4, 3:].any()
    assert (out["sample_log_probs"][:4, 3:] == 0).all() and torch.equal(out["tokens"][4:], b["tokens"])
    assert out["group_id"].tolist() == [0, 0, 1, 1, 2, 2]
    assert [i["domain"] for i in non_tensor_list(out, "info")] == ["mock"] * 4 + ["telecom"] * 2
    assert non_tensor_list(out, "task")[4] == {"index": 0}
    # replayed groups get their own group-relative advantages: the same as computed on each batch alone
    adv = group_advantages(out["reward"], out["group_id"])
    assert torch.allclose(adv, torch.cat([group_advantages(a["reward"], a["group_id"]),
                                          group_advantages(b["reward"], b["group_id"])]))
    assert concat_batches([a], 0) is a
    with pytest.raises(ValueError, match="at least one"):
        concat_batches([], 0)
    with pytest.raises(ValueError, match="different keys"):
        concat_batches([a, b.exclude("info")], 0)


class FakeCL:
    """What Replay uses of ContinualTrainer: domains, buffer, trainer.settings/step, pad id, collect."""

    def __init__(self, batch_size=2, G=2):
        self.domains = ["mock", "telecom", "airline"]
        self.buffer = TrajectoryBuffer()
        self.trainer = SimpleNamespace(settings=SimpleNamespace(batch_size=batch_size, n_samples=G), step=5)
        self.pad_token_id = 0
        self.calls = []
        self.G = G

    def past_domains(self, d):
        return self.domains[: self.domains.index(d)]

    def collect(self, domain, tasks):
        self.calls.append((domain, tasks))
        return batch(len(tasks), self.G, 4, domain=domain, first_task=tasks[0]["index"])


@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.5])
def test_replay_adds_past_domain_groups(ratio):
    cl = FakeCL(batch_size=2, G=2)
    cl.buffer.add_batch(batch(3, 2, 3, first_task=10), "mock")
    algo = Replay(ratio, seed=3)
    algo.setup(cl)
    first = batch(2, 2, 3)
    assert algo.augment_batch(first, "mock") is first and algo.last_replayed == 0 and cl.calls == []
    cur = batch(2, 2, 3, domain="telecom")
    out = algo.augment_batch(cur, "telecom")
    n_replay = math.ceil(ratio * 2)
    assert out.shape[0] == 4 + n_replay * 2 and algo.last_replayed == n_replay * 2
    assert [d for d, _ in cl.calls] == ["mock"] and len(cl.calls[0][1]) == n_replay
    assert all(t["index"] in (10, 11, 12) for t in cl.calls[0][1])  # tasks seen on mock, from the buffer
    assert len(set(out["group_id"].tolist())) == 2 + n_replay
    # the draw depends on (seed, step) only: a resumed run replays the same tasks
    cl2 = FakeCL()
    cl2.buffer = cl.buffer
    algo2 = Replay(ratio, seed=3)
    algo2.setup(cl2)
    algo2.augment_batch(batch(2, 2, 3), "telecom")
    assert cl2.calls == cl.calls[-1:]


def test_replay_spreads_over_all_past_domains():
    cl = FakeCL(batch_size=8, G=1)
    cl.buffer.add_batch(batch(2, 1, 3), "mock")
    cl.buffer.add_batch(batch(2, 1, 3, first_task=50), "telecom")
    algo = Replay(1.0)
    algo.setup(cl)
    out = algo.augment_batch(batch(8, 1, 3), "airline")
    assert {d for d, _ in cl.calls} == {"mock", "telecom"} and out.shape[0] == 16
    with pytest.raises(ValueError, match="> 0"):
        Replay(0.0)


def test_registry_and_make_algorithm():
    assert set(ALGORITHMS) == {"sequential", "replay", "joint", "ewc", "lora_per_domain"}
    cfg = OmegaConf.create({"algorithm": "replay", "replay_ratio": 0.25})
    a = make_algorithm(cfg, seed=1)
    assert isinstance(a, Replay) and a.ratio == 0.25
    assert isinstance(make_algorithm(OmegaConf.create({"algorithm": "sequential", "replay_ratio": 0.5})), Sequential)
    with pytest.raises(ValueError, match="cl.algorithm"):
        make_algorithm(OmegaConf.create({"algorithm": "lora", "replay_ratio": 0.5}))
    e = make_algorithm(OmegaConf.create({"algorithm": "ewc", "replay_ratio": 0.5, "ewc_lambda": 3.0}))
    assert isinstance(e, EWC) and e.lam == 3.0
    assert [Joint().domain_for_step(s, ["a", "b", "c"]) for s in range(5)] == ["a", "b", "c", "a", "b"]
    x = batch(1, 2, 3)
    assert Sequential().augment_batch(x, "mock") is x


def _update(model, lr=0.1):
    """A GRPOUpdate on ``model`` (an SGD optimizer, one parameter group) for the algorithms' hooks; no loss."""
    return GRPOUpdate(model, None, torch.optim.SGD(model.parameters(), lr=lr), reference=None,
                      device=torch.device("cpu"), autocast=nullcontext, ppo_epochs=1, minibatch_size=0,
                      micro_batch_size=1, max_tokens_per_mb=0, max_grad_norm=1.0, anchor="auto",
                      exact_log_probs=True, seed=0)


def test_kl_anchor_freezes_a_copy_of_the_policy_as_reference():
    model = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(model=model, updater=_update(model))
    KLAnchor().post_task(trainer, "mock")
    with trainer.updater.reference() as ref:
        assert ref is not model and torch.equal(ref.weight, model.weight) and not ref.weight.requires_grad
    with torch.no_grad():
        model.weight.add_(1.0)
    with trainer.updater.reference() as ref:  # the anchor does not follow later training
        assert not torch.equal(ref.weight, model.weight)


def test_ewc_penalty_formula():
    model = torch.nn.Linear(3, 1, bias=False)
    e = EWC(lam=4.0)
    e.cl = SimpleNamespace(trainer=SimpleNamespace(device=torch.device("cpu")))
    assert float(e.penalty()) == 0.0  # no task finished yet
    star = model.weight.detach().clone()
    F = torch.tensor([[1.0, 0.0, 2.0]])
    e.terms = [(model.weight, F, star)]
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, 5.0, -0.5]]))
    # (λ/2) Σ F (θ − θ*)² = 2 * (1*1 + 0*25 + 2*0.25) = 3
    p = e.penalty()
    assert float(p) == pytest.approx(3.0)
    p.backward()
    assert torch.allclose(model.weight.grad, 4.0 * F * torch.tensor([[1.0, 5.0, -0.5]]))  # λ F (θ − θ*)
    with pytest.raises(ValueError):
        EWC(lam=-1.0)


# ---------------------------------------------------------------------------------- the algorithms' update hooks
def test_ewc_registers_its_penalty_with_the_update_and_leaves_the_loss_alone():
    """EWC's penalty is one of the update's penalties (``loss_penalty_ewc``), not a wrapper around the loss: the
    update's loss stays the module it was built with (the anchor, now a per-call argument, cannot miss it)."""
    model = torch.nn.Linear(2, 1)
    u = _update(model)
    loss = u.loss_fn
    e = EWC(lam=1.0)
    e.setup(SimpleNamespace(trainer=SimpleNamespace(updater=u, device=torch.device("cpu"))))
    assert u.loss_fn is loss and [p.name for p in u.penalties] == ["ewc"] and u.penalties[0].key == "loss_penalty_ewc"
    assert float(u.penalties[0]()) == 0.0  # nothing consolidated yet


def test_an_ewc_penalty_of_zero_leaves_the_update_unchanged(tmp_path):
    """Before a task ends EWC's penalty is 0: the step must equal the plain one. On a sampler whose log-probs are off
    by +-0.3 nats (tests/test_training_core.py) the update anchors at the current policy (``train/anchor_current``);
    with the penalty wrapper in place that setting used to miss the loss, which then anchored at the behaviour
    log-probs: ratio_mean far from 1 and a different loss."""
    from tests.test_training_core import _skewed_trainer

    out = {}
    for name in ("plain", "ewc"):
        torch.manual_seed(0)
        trainer = _skewed_trainer(tmp_path / name)
        if name == "ewc":
            EWC(lam=10.0).setup(SimpleNamespace(trainer=trainer))
        out[name] = trainer.train_step()
        trainer.close()
    plain, ewc = out["plain"], out["ewc"]
    assert ewc["train/anchor_current"] == plain["train/anchor_current"] == 1.0
    assert ewc["loss_penalty_ewc"] == 0.0 and "loss_penalty_ewc" not in plain
    for k in ("ratio_mean", "behaviour_weight_mean", "loss/total", "ess", "grad_norm"):
        assert ewc[k] == pytest.approx(plain[k], abs=1e-6), k
    assert ewc["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_update_methods_the_algorithms_change_the_training_through():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    u = _update(model)
    u.optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    u.optimizer.step()
    first, second = list(model[0].parameters()), list(model[1].parameters())
    assert len(u.optimizer.state) == 4
    # LoRA per domain: the optimizer trains only the new parameters; the dropped ones lose their Adam moments
    u.set_trainable(second)
    assert u.optimizer.param_groups[0]["params"] == second and set(map(id, u.optimizer.state)) == set(map(id, second))
    u.optimizer.state_dict()  # loadable: no state without a group
    u.optimizer.add_param_group({"params": first})
    with pytest.raises(ValueError, match="one parameter group"):
        u.set_trainable(first)
    # the KL anchor: a reference factory, or None; anything else is refused
    frozen = torch.nn.Linear(2, 2)
    u.set_reference(lambda: nullcontext(frozen))
    with u.reference() as ref:
        assert ref is frozen
    u.set_reference(None)
    assert u.reference is None
    with pytest.raises(TypeError, match="callable"):
        u.set_reference(frozen.weight)
    # EWC: penalties stack in the update (not on the loss), each its own loss entry; names are unique
    u.add_loss_penalty(lambda: torch.tensor(2.0), "ewc")
    u.add_loss_penalty(lambda: torch.tensor(0.5), "other")
    assert [(p.key, float(p())) for p in u.penalties] == [("loss_penalty_ewc", 2.0), ("loss_penalty_other", 0.5)]
    with pytest.raises(ValueError, match="already"):
        u.add_loss_penalty(lambda: torch.tensor(1.0), "ewc")
    with pytest.raises(ValueError, match="penalty name"):
        u.add_loss_penalty(lambda: torch.tensor(1.0), "bad name")
    with pytest.raises(TypeError, match="callable"):
        u.add_loss_penalty(torch.tensor(1.0), "tensor")
