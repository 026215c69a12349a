"""The device plan applied (torchrl_grpo.distributed.placement): the KL reference on its own device, the threads of a disjoint
CPU plan pinned to their cores (the kernel's view read back), a colocated plan untouched, and the refused
combinations named. Tiny random model, ToyVowels, CPU only."""
from __future__ import annotations

import json
import os

import pytest
import torch

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_allocation import GPUS4, VLLM, cfg
from tests.test_trainer import make_cfg
from torchrl_grpo.distributed.device_plan import AllocationError, resolve_plan
from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer
from torchrl_grpo.distributed.placement import placement_for, thread_cpus
from torchrl_grpo.assembly import build_trainer

needs_two_cores = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2
                                     or thread_cpus() is None,
                                     reason="needs os.sched_setaffinity, /proc/thread-self and >= 2 CPU cores")

VLLM_RULE = VLLM["inference_placement"]  # vLLM's registered placement rule
SMALL = {"train": {"steps": 2, "batch_size": 2, "micro_batch_size": 16}, "gconfig": {"n_samples": 4,
                                                                                      "max_new_tokens": 8}}


def _cfg(**over):
    return make_cfg(**{**SMALL, **over})


def _ref_log_probs_at_step_2(tmp_path, **over):
    """Two sync steps with kl_coef 0.1; returns (ref log-probs of step 2's batch, step 2's metrics, trainer)."""
    torch.manual_seed(0)
    trainer = build_trainer(_cfg(loss={"kl_coef": 0.1}, **over), tmp_path)
    seen, fill = [], trainer.updater.fill_log_probs

    def record(td, key, model, device=None):
        fill(td, key, model, device)
        if key == "ref_log_probs":
            seen.append((td[key].clone(), td["response_mask"].clone(), thread_cpus()))

    trainer.updater.fill_log_probs = record
    try:
        trainer.train_step()
        m = trainer.train_step()
    finally:
        trainer.close()
    return seen[-1], m, trainer


@needs_two_cores
def test_ref_on_its_own_cpu_gives_the_colocated_ref_log_probs(tmp_path):
    (lp0, mask0, cpus0), m0, t0 = _ref_log_probs_at_step_2(tmp_path / "colocated")
    (lp1, mask1, cpus1), m1, t1 = _ref_log_probs_at_step_2(tmp_path / "ref1", train_model={"devices": [0]},
                                                           ref_model={"devices": [1]})
    torch.testing.assert_close(mask1, mask0)  # same episodes (same seed, same cores' numerics)
    torch.testing.assert_close(lp1[mask1], lp0[mask0], rtol=1e-5, atol=1e-6)
    assert m1["kl_ref"] == pytest.approx(m0["kl_ref"], rel=1e-4, abs=1e-7)
    assert m0["kl_ref"] > 0  # step 2: the policy moved away from the reference, so the check is not 0 == 0
    # the reference is a distinct frozen module, placed per plan: its scoring ran on core 1, training on core 0
    with t1.updater.reference() as ref:
        assert ref is not t1.model and not any(p.requires_grad for p in ref.parameters())
        assert {p.device for p in ref.parameters()} == {t1.components.placement.ref_device} == {torch.device("cpu")}
    assert cpus1 == "1" and t1.components.placement.affinity == {"train": "0", "inference": "0", "ref": "1"}
    assert cpus0 == thread_cpus() and t0.components.placement.affinity == {}
    applied = json.loads((tmp_path / "ref1" / "plan.json").read_text())["applied"]
    assert applied["cpu_cores"] == {"train": [0], "inference": [0], "ref": [1]}


@needs_two_cores
def test_disjoint_cpu_plan_pins_async_threads_and_colocated_changes_nothing(tmp_path):
    before = thread_cpus()
    seen = {}

    def run(name, **over):
        trainer = build_trainer(_cfg(mode="async", **over), tmp_path / name, trainer_cls=AsyncGRPOTrainer)
        seen[name] = {"trainer_after_init": thread_cpus()}
        trainer.on_rollout_thread_start = lambda: seen[name].update(rollout=thread_cpus())
        try:
            trainer.train_step()
            seen[name]["trainer_in_step"] = thread_cpus()
        finally:
            trainer.close()
        seen[name]["trainer_after_close"] = thread_cpus()
        return trainer

    t = run("disjoint", train_model={"devices": [0]}, inference_model={"devices": [1]})
    assert seen["disjoint"] == {"trainer_after_init": "0", "rollout": "1", "trainer_in_step": "0",
                                "trainer_after_close": before}
    assert t.components.placement.affinity == {"train": "0", "inference": "1"}
    assert json.loads((tmp_path / "disjoint" / "plan.json").read_text())["applied"]["cpu_cores"] == {
        "train": [0], "inference": [1], "ref": [0]}
    t = run("colocated")
    assert set(seen["colocated"].values()) == {before}
    assert t.components.placement.affinity == {} and t.components.placement.cores == {}
    assert json.loads((tmp_path / "colocated" / "plan.json").read_text())["applied"]["cpu_cores"] is None


@needs_two_cores
def test_disjoint_cpu_plan_in_sync_mode_collects_on_the_inference_core(tmp_path):
    trainer = build_trainer(_cfg(train_model={"devices": [0]}, inference_model={"devices": [1]}), tmp_path)
    assert trainer.backend.model is trainer.model  # CPU: no copy, the thread moves instead
    collect, where = trainer.collector.collect, []
    trainer.collector.collect = lambda *a, **k: (where.append(thread_cpus()), collect(*a, **k))[1]
    try:
        trainer.train_step()
        assert where == ["1"] and thread_cpus() == "0"  # collected on core 1, back on core 0 for the update
    finally:
        trainer.close()


LORA_REF = r"ref_model.devices puts the KL reference on cpu:1 but actor.peft.enable=true"


def test_lora_with_its_own_ref_device_is_refused_naming_the_keys(tmp_path):
    plan = resolve_plan(cfg(ref=(0, [1])), ["cpu:0", "cpu:1"])
    with pytest.raises(AllocationError, match=LORA_REF):
        placement_for(plan, device=torch.device("cpu"), peft=True, kl_coef=0.1)
    placement_for(plan, device=torch.device("cpu"), peft=True, kl_coef=0.0)  # no reference: nothing to place
    with pytest.raises(AllocationError, match=LORA_REF):
        build_trainer(_cfg(loss={"kl_coef": 0.1}, ref_model={"devices": [1]},
                         actor={"peft": {"enable": True, "target_modules": "all-linear"}}), tmp_path)


def test_gpu_plans_place_ref_and_inference_copies_and_refuse_vllm_off_cuda0():
    plan = resolve_plan(cfg(train=(0, [0]), inference=(0, [1]), ref=(0, [2])), GPUS4)
    p = placement_for(plan, device=torch.device("cuda:0"), kl_coef=0.1)
    assert (p.inference_device, p.ref_device, p.own_inference_copy) == (torch.device("cuda:1"),
                                                                        torch.device("cuda:2"), True)
    assert p.cores == {}  # GPU: devices, not cores
    colocated = placement_for(resolve_plan(cfg(), GPUS4), device=torch.device("cuda:0"), kl_coef=0.1)
    assert not colocated.own_inference_copy and colocated.ref_device == torch.device("cuda:0")
    with pytest.raises(AllocationError, match=r"inference_model.devices puts inference on cuda:1 but "
                                              r"rollout.backend=vllm"):
        placement_for(plan, device=torch.device("cuda:0"), backend="vllm", inference_placement=VLLM_RULE)
    swapped = resolve_plan(cfg(train=(0, [1]), inference=(0, [0])), GPUS4, **VLLM)
    assert placement_for(swapped, device=torch.device("cuda:1"), backend="vllm",
                         inference_placement=VLLM_RULE).inference_device == \
        torch.device("cuda:0")  # vLLM on the first visible GPU: placeable in-process


def test_transformers_backend_copy_goes_to_the_given_device(tiny_model_and_tokenizer):
    from torchrl_grpo.backends.factory import make_backend

    model, tok = tiny_model_and_tokenizer
    b = make_backend("transformers", model, tok, own_copy=True, max_batch_size=4, device="meta")
    assert b.model is not model and {p.device.type for p in b.model.parameters()} == {"meta"}
    b.close()


def test_without_sched_setaffinity_nothing_is_pinned_and_it_is_logged(monkeypatch, caplog):
    """Non-Linux (no os.sched_setaffinity): the planned cores are logged as not applied; nothing raises."""
    from torchrl_grpo.distributed import placement as placement_mod

    plan = resolve_plan(cfg(train=(0, [0]), inference=(0, [1])), ["cpu:0", "cpu:1"])
    p = placement_for(plan, device=torch.device("cpu"))
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    monkeypatch.setattr(placement_mod, "_warned_unavailable", False)
    with caplog.at_level("WARNING", logger="torchrl_grpo.distributed.placement"):
        p.pin_thread("train")
        with p.on_cores("inference"):
            pass
        p.release()
    assert p.affinity == {} and p.to_dict()["pinning"] == "off"
    assert "os.sched_setaffinity is not available" in caplog.text
