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
from torchrl_grpo.continual.task_checkpoints import load_task_checkpoint, save_task_checkpoint
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
        torch.testing.assert_close(got, anchor, atol=1e-5, rtol=0, msg=lambda m, ck=ck: f"{ck.name}: {m}")
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


# ------------------------------------------------------------------------------------------------ end to end (slow)
def _e2e_cfg(algorithm: str, kl: float, **over):
    from tests.test_continual_trainer import cl_cfg

    c = cl_cfg(num_steps_per_task=2, algorithm=algorithm, kl_coef=kl, replay_ratio=1.0, ewc_lambda=1000.0, **over)
    c.actor.peft.enable = algorithm == "lora_per_domain"
    c.optimizer.lr = 1e-2  # each step moves the policy measurably
    return c


class _Rewarded:
    """Mixin: alternate rewards 0/1 (a random tiny model earns none, and GRPO would not move it); in the run that is
    not resumed, a mid-task checkpoint after step 3 (one telecom step), as an interrupt after that step writes it."""

    mid_at = None

    def augment_batch(self, batch, domain):
        out = super().augment_batch(batch, domain)
        out["reward"] = (torch.arange(out.shape[0]) % 2).float()
        return out

    def post_step(self, trainer, domain):
        super().post_step(trainer, domain)
        if trainer.step == self.mid_at:
            self.cl.save_task_checkpoint(1, task_step=1, done=False, name="checkpoint_task_1_mid")


def _algorithm(name: str, mid_at=None):
    from torchrl_grpo.continual.algorithms import ALGORITHMS, EWC, Replay

    base = ALGORITHMS[name]
    cls = type(f"Rewarded{base.__name__}", (_Rewarded, base), {"mid_at": mid_at})
    if base is Replay:
        return cls(1.0, seed=0)
    if base is EWC:
        return cls(lam=1000.0)
    return cls()


def _jsonl_steps(run_dir):
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


_NIGHTLY = pytest.mark.nightly  # the rest of the matrix: too long for CI's slow stage (pytest -m nightly)


@pytest.mark.slow  # end to end: three continual runs per case; CI runs the case and plain sequential
@pytest.mark.parametrize("algorithm,kl", [
    ("lora_per_domain", 0.1), ("sequential", 0.0),
    *[pytest.param(a, k, marks=_NIGHTLY) for a, k in [("sequential", 0.1), ("replay", 0.0), ("replay", 0.1),
                                                      ("ewc", 0.0), ("ewc", 0.1), ("lora_per_domain", 0.0)]]])
def test_every_algorithm_resumes_as_the_uninterrupted_run(tmp_path, algorithm, kl):
    from tests.test_continual_trainer import train_to_end

    run = tmp_path / "run"
    _, full = train_to_end(_e2e_cfg(algorithm, kl), run, _algorithm(algorithm, mid_at=3))
    full_steps = _jsonl_steps(run)
    keys = ("loss", "reward_mean", "kl_ref", "ess", "ewc_penalty", "replayed_episodes")
    if kl:
        assert all(r["kl_ref"] > 1e-6 for r in full["task_1/train"][1:])  # the anchor is a trained policy
    for ck, first in (("checkpoint_task_0", 0), ("checkpoint_task_1_mid", 1)):
        t, res = train_to_end(_e2e_cfg(algorithm, kl, resume_from=str(run / ck)), run, _algorithm(algorithm))
        assert (t.start_task, t.start_task_step) == (1, first), ck
        # (the mid-task checkpoint here is written from post_step, before step 3's row joins metrics.json: the rows
        # of the steps the resumed run takes are compared)
        assert [r["step"] for r in res["task_1/train"]][first - 2:] == [3, 4][first:], ck
        for a, b in zip(full["task_1/train"][first:], res["task_1/train"][-(2 - first):]):
            for key in keys:
                if a.get(key) is not None:
                    assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (ck, a["step"], key)
        flat = [x for row in res["R"] for x in row]
        assert flat == pytest.approx([x for row in full["R"] for x in row], abs=1e-6), ck
        assert res["boundaries"] == full["boundaries"], ck
        assert _jsonl_steps(run) == full_steps, ck  # resumed into its own dir: every row once (issue 36.7)


def test_a_joint_run_is_refused_as_a_resume_source(tmp_path):
    from torchrl_grpo.continual.task_checkpoints import CL_STATE_JSON, read_resume_state

    (tmp_path / CL_STATE_JSON).write_text(json.dumps({"task_order": ["mock", "telecom"], "task": 0, "joint": True}))
    with pytest.raises(ValueError, match="joint run"):
        read_resume_state(tmp_path, ["mock", "telecom"])


class _SecondSignalWhileScoring(Sequential):
    """Two SIGINTs while the step-3 scoring (cl.eval_interval=1) runs: after the step's last write, before its row is
    logged. Rewards alternate so the step trains."""

    def augment_batch(self, batch, domain):
        batch["reward"] = (torch.arange(batch.shape[0]) % 2).float()
        return batch

    def eval_context(self, trainer, domain):
        import os
        import signal

        if trainer.step == 3 and not getattr(self, "sent", False):
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return super().eval_context(trainer, domain)


@pytest.mark.slow  # end to end, ~1 min on 2 idle cores
def test_a_second_signal_after_the_step_completed_saves_it_as_sync_grpo_does(tmp_path):
    """One rule for a second signal (issue 36): the step is abandoned when the signal lands before the step's last
    write, and saved when it lands after it (its scoring, logging), in sync GRPO (training/loop.py) and in the
    continual trainer alike. The continual trainer used to abandon any step a second signal interrupted."""
    from torchrl_grpo.assembly import build_trainer
    from torchrl_grpo.training.interrupt import TrainingInterrupted

    cfg = _e2e_cfg("sequential", 0.0, eval_interval=1)
    t = build_trainer(cfg, tmp_path / "run", algorithm=_SecondSignalWhileScoring())
    try:
        with pytest.raises(TrainingInterrupted) as ei:
            t.train()
    finally:
        t.close()
    assert ei.value.mid_step  # the second signal, raised at once inside the scoring
    ck = tmp_path / "run" / "checkpoint_task_1_interrupted"
    st = json.loads((ck / "cl_state.json").read_text())
    assert (st["task"], st["task_step"], st["task_done"], st["step"]) == (1, 1, False, 3)
    assert [r["step"] for r in st["metrics"]["task_1/train"]] == [3]


def test_task_checkpoints_follow_the_loop_shells_verdict_on_a_second_signal(tmp_path):
    """The interrupt save of the continual run (TaskCheckpoints.on_interrupt) takes the loop shell's "completed"
    verdict: a second signal (mid_step) after the step's last write saves it; before it, or at a boundary, not."""
    from torchrl_grpo.continual.task_checkpoints import TaskCheckpoints
    from torchrl_grpo.training.interrupt import TrainingInterrupted

    run = SimpleNamespace(joint=False, settings=SimpleNamespace(save_checkpoints=True),
                          trainer=SimpleNamespace(settings=SimpleNamespace(checkpoint_on_interrupt=True), step=3))
    saved = []
    tc = TaskCheckpoints(run)
    tc.save = lambda k, task_step=None, done=True, name=None: saved.append((k, task_step, done, name)) or tmp_path
    tc.progress = (1, 1, False)
    second, first = TrainingInterrupted(2, mid_step=True), TrainingInterrupted(2, mid_step=False)
    assert tc.on_interrupt(second, completed=False) is None and saved == []  # abandoned before the last write
    assert tc.on_interrupt(second) is None and saved == []  # outside the steps (a boundary): abandoned
    assert tc.on_interrupt(second, completed=True) == tmp_path  # after the last write: completed, saved
    assert saved == [(1, 1, False, "checkpoint_task_1_interrupted")]
    assert tc.on_interrupt(first) == tmp_path and len(saved) == 2
