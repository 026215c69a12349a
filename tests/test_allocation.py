"""Device allocation plan (torchrl_grpo.allocation): both spellings, defaults, and every conflict named."""
from __future__ import annotations

import json

import pytest

from torchrl_grpo.allocation import AllocationError, parse_allocation_mode, resolve_plan

GPUS4 = [f"cuda:{i}" for i in range(4)]
CPU2 = ["cpu:0", "cpu:1"]


def cfg(mode=None, **roles):
    out = {"allocation_mode": mode}
    for role in ("train", "inference", "ref"):
        n, devs = roles.get(role, (0, []))
        out[f"{role}_model"] = {"num_devices": n, "devices": devs}
    return out


def test_default_is_one_colocated_device():
    plan = resolve_plan(cfg(), GPUS4)
    assert plan.colocated
    assert {r: p.devices for r, p in plan.placements.items()} == {r: ("cuda:0",) for r in ("train", "inference", "ref")}
    assert plan.placements["inference"].colocated_with == "train"
    assert plan.placements["train"].engine == "single" and plan.world_size == 1
    d = json.loads(json.dumps(plan.to_dict()))  # JSON-ready
    assert d["colocated"] is True and d["processes"][0] == {"name": "rank 0", "runs": "train (single)",
                                                            "device": "cuda:0"}
    assert "colocated" in plan.describe()


def test_areal_mode_disjoint_devices():
    plan = resolve_plan(cfg("vllm:d1+fsdp:d2"), GPUS4, world_size=2, train_engine="fsdp", inference_engine="vllm")
    assert plan.placements["inference"].devices == ("cuda:2",)  # train first, then inference
    assert plan.placements["train"].devices == ("cuda:0", "cuda:1")
    assert plan.placements["ref"].colocated_with == "train"
    assert not plan.colocated
    assert [plan.train_device(r) for r in (0, 1)] == ["cuda:0", "cuda:1"]
    assert plan.placements["train"].parallel == {"d": 2, "t": 1, "p": 1}


def test_areal_mode_tensor_parallel_inference_counts_devices():
    parsed = parse_allocation_mode("vllm:d1t2+ddp:d2")
    assert parsed == {"inference": ("vllm", {"d": 1, "t": 2, "p": 1}), "train": ("ddp", {"d": 2, "t": 1, "p": 1})}
    plan = resolve_plan(cfg("vllm:d1t2+ddp:d2"), GPUS4, world_size=2, train_engine="ddp", inference_engine="vllm")
    assert plan.placements["inference"].devices == ("cuda:2", "cuda:3")


def test_areal_older_dot_syntax_parses():
    assert parse_allocation_mode("vllm.d2p1t1+d2p1t1") == {"inference": ("vllm", {"d": 2, "t": 1, "p": 1}),
                                                          "train": ("fsdp", {"d": 2, "t": 1, "p": 1})}


def test_recipe_keys_counts_and_rollout_workers():
    plan = resolve_plan(cfg(train=(2, []), inference=(1, []), ref=(1, [])), GPUS4, world_size=2,
                        rollout_workers=2, train_engine="ddp")
    assert plan.placements["train"].devices == ("cuda:0", "cuda:1")
    assert plan.placements["inference"].devices == ("cuda:2",)
    assert plan.placements["ref"].devices == ("cuda:3",)
    assert [plan.worker_device(w) for w in range(2)] == ["cuda:2", "cuda:2"]
    names = [row["name"] for row in plan.processes()]
    assert names == ["rank 0", "rank 1", "rollout worker 0", "rollout worker 1", "ref engine"]


def test_explicit_devices_and_counts_mix():
    plan = resolve_plan(cfg(train=(0, [3]), inference=(2, [])), GPUS4)
    assert plan.placements["train"].devices == ("cuda:3",)
    assert plan.placements["inference"].devices == ("cuda:0", "cuda:1")  # counts take what explicit lists left


def test_torchrun_world_size_without_plan_spreads_over_devices():
    plan = resolve_plan(cfg(), CPU2, world_size=2, train_engine="ddp")
    assert plan.placements["train"].devices == ("cpu:0", "cpu:1")
    assert plan.placements["train"].engine == "ddp" and plan.placements["train"].source == "WORLD_SIZE"
    assert plan.placements["inference"].devices == ("cpu:0", "cpu:1")


@pytest.mark.parametrize("conf, kwargs, match", [
    (cfg("vllm:d1+fsdp:d2"), {"inference_engine": "vllm", "train_engine": "fsdp", "world_size": 2},
     r"asks for 3 devices \(inference: 1 \+ train: 2\) but 2 cpu device\(s\)"),
    (cfg(train=(2, []), inference=(1, [])), {"world_size": 2, "train_engine": "ddp"},
     r"asks for 3 devices \(train_model.num_devices: 2 \+ inference_model.num_devices: 1\)"),
    (cfg(train=(0, [0, 1]), inference=(0, [1])), {"world_size": 2, "train_engine": "ddp"},
     r"device 1 \(cpu:1\) is named in both train_model.devices and inference_model.devices"),
    (cfg(train=(0, [0, 0])), {}, r"device 0 \(cpu:0\) is named twice"),
    (cfg(train=(0, [5])), {}, r"train_model.devices=\[5\]: device 5 is not present \(2 cpu device"),
    (cfg(train=(2, [0])), {}, r"train_model.num_devices=2 but train_model.devices=\[0\] lists 1"),
    (cfg("sglang:d1+fsdp:d1"), {}, r"unknown engine 'sglang' \(an AReaL engine this trainer does not run\)"),
    (cfg("foo:d1"), {}, r"unknown engine 'foo'"),
    (cfg("vllm:d1+fsdp"), {}, r"term 'fsdp' is not ENGINE:d<dp>"),
    (cfg("fsdp:d1t2"), {}, r"data parallelism only"),
    (cfg("vllm:d1", train=(1, [])), {}, r"both set: use one spelling"),
    (cfg("vllm:d1+ddp:d1"), {"inference_engine": "transformers"}, r"names inference engine 'vllm' but "
                                                                    r"rollout.backend='transformers'"),
    (cfg("ddp:d2"), {"world_size": 1, "train_engine": "ddp"}, r"gives training 2 device\(s\) but 1 training "
                                                               r"process\(es\) were launched: start torchrun "
                                                               r"--nproc_per_node=2"),
    (cfg("fsdp:d2"), {"world_size": 2, "train_engine": "ddp"}, r"names training engine 'fsdp' but "
                                                                r"train.strategy='ddp': set train.strategy=fsdp"),
    (cfg("fsdp:d2"), {"world_size": 1, "train_engine": "fsdp"}, r"start torchrun --nproc_per_node=2 "
                                                                 r"\(train.strategy=fsdp\)"),
])
def test_invalid_plans_name_the_conflict(conf, kwargs, match):
    with pytest.raises(AllocationError, match=match):
        resolve_plan(conf, CPU2, **kwargs)


def test_torchrun_ranks_beyond_devices():
    with pytest.raises(AllocationError, match=r"3 training processes but 2 cuda device"):
        resolve_plan(cfg(), ["cuda:0", "cuda:1"], world_size=3, train_engine="ddp")
    plan = resolve_plan(cfg(), ["cpu:0"], world_size=2, train_engine="ddp")  # CPU slots may be shared
    assert plan.placements["train"].devices == ("cpu:0", "cpu:0")


def test_no_devices_is_an_error():
    with pytest.raises(AllocationError, match="no devices"):
        resolve_plan(cfg(), [])


def _compose(overrides):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        return compose(config_name="grpo_gsm8k", overrides=overrides)


@pytest.mark.parametrize("overrides, match", [
    (["rollout.launcher=ray"], "rollout.num_workers >= 1"),
    (["rollout.num_workers=2"], "needs rollout.launcher=ray"),
    (["rollout.launcher=ray", "rollout.num_workers=2", "train.strategy=ddp"], "not combined yet"),
    (["rollout.launcher=ray", "rollout.num_workers=2", "mode=async"], "sync trainer"),
    (["train.strategy=zero3"], r"train.strategy='zero3' is not one of \('single', 'ddp', 'fsdp'\)"),
    (["train.strategy=fsdp", "actor.peft.enable=true"], r"fsdp with actor.peft.enable \(LoRA\) is not supported"),
    (["allocation_mode=fsdp:d2", "rollout.launcher=ray", "rollout.num_workers=2"], r"train.strategy=fsdp are not "
                                                                                   r"combined yet"),
    (["rollout.launcher=slurm"], "rollout.launcher"),
])
def test_scale_out_config_errors(overrides, match):
    from torchrl_grpo.config import validate_config

    with pytest.raises(ValueError, match=match):
        validate_config(_compose(overrides))


def test_allocation_mode_fsdp_selects_the_fsdp_strategy():
    """``allocation_mode=...+fsdp:dN`` with train.strategy left at single runs FSDP2 (torchrl_grpo.distributed)."""
    from torchrl_grpo.allocation import train_strategy

    assert train_strategy(_compose(["allocation_mode=vllm:d1+fsdp:d2"])) == "fsdp"
    assert train_strategy(_compose(["allocation_mode=vllm:d1+ddp:d2"])) == "ddp"
    assert train_strategy(_compose(["train.strategy=ddp"])) == "ddp"
    assert train_strategy(_compose([])) == "single"
    cfg = _compose(["allocation_mode=vllm:d1+fsdp:d2", "rollout.backend=vllm"])
    plan = resolve_plan(cfg, GPUS4, world_size=2, train_engine=train_strategy(cfg), inference_engine="vllm")
    assert plan.placements["train"].engine == "fsdp" and plan.placements["train"].devices == ("cuda:0", "cuda:1")


def test_config_keys_resolve_to_a_plan():
    """The Hydra keys (allocation_mode, train_model/inference_model/ref_model) feed resolve_plan as they are."""
    cfg = _compose(["train_model.num_devices=2", "inference_model.devices=[3]"])
    plan = resolve_plan(cfg, GPUS4, world_size=2, train_engine="ddp")
    assert plan.placements["train"].devices == ("cuda:0", "cuda:1")
    assert plan.placements["inference"].devices == ("cuda:3",)
    assert resolve_plan(_compose(["allocation_mode=vllm:d1+ddp:d2"]), GPUS4, world_size=2, train_engine="ddp",
                        inference_engine="vllm").placements["inference"].devices == ("cuda:2",)
