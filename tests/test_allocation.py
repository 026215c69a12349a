"""Device allocation plan (torchrl_grpo.distributed.device_plan): both spellings, defaults, and every conflict named."""
from __future__ import annotations

import json

import pytest

from torchrl_grpo.assembly.devices import plan_request
from torchrl_grpo.backends.factory import backend_spec
from torchrl_grpo.distributed.device_plan import AllocationError, PlanRequest, parse_allocation_mode, resolve_plan

GPUS4 = [f"cuda:{i}" for i in range(4)]
CPU2 = ["cpu:0", "cpu:1"]
#: the vllm backend and its registered placement rule (the engine on the process's first visible GPU)
VLLM = {"inference_engine": "vllm", "inference_placement": backend_spec("vllm").placement}


def cfg(mode=None, **roles):
    """The plan request of a config with ``allocation_mode=mode`` and ``{role}_model`` = ``roles[role]``
    (``(num_devices, devices)``)."""
    return PlanRequest(mode, num_devices={r: n for r, (n, _) in roles.items()},
                       devices={r: tuple(d) for r, (_, d) in roles.items()})


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
    plan = resolve_plan(cfg("transformers:d1+fsdp:d2"), GPUS4, world_size=2, train_engine="fsdp")
    assert plan.placements["inference"].devices == ("cuda:2",)  # train first, then inference
    assert plan.placements["train"].devices == ("cuda:0", "cuda:1")
    assert plan.placements["ref"].colocated_with == "train"
    assert not plan.colocated
    assert [plan.train_device(r) for r in (0, 1)] == ["cuda:0", "cuda:1"]
    assert plan.placements["train"].parallel == {"d": 2, "t": 1, "p": 1}


def test_areal_mode_tensor_parallel_inference_counts_devices():
    parsed = parse_allocation_mode("vllm:d1t2+ddp:d2")
    assert parsed == {"inference": ("vllm", {"d": 1, "t": 2, "p": 1}), "train": ("ddp", {"d": 2, "t": 1, "p": 1})}
    plan = resolve_plan(cfg("transformers:d1t2+ddp:d2"), GPUS4, world_size=2, train_engine="ddp")
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
    """``allocation_mode=...+fsdp:dN`` with train.strategy left at single runs FSDP2 (torchrl_grpo.distributed.data_parallel)."""
    from torchrl_grpo.config import train_strategy

    assert train_strategy(_compose(["allocation_mode=vllm:d1+fsdp:d2"])) == "fsdp"
    assert train_strategy(_compose(["allocation_mode=vllm:d1+ddp:d2"])) == "ddp"
    assert train_strategy(_compose(["train.strategy=ddp"])) == "ddp"
    assert train_strategy(_compose([])) == "single"
    cfg = _compose(["allocation_mode=transformers:d1+fsdp:d2"])
    plan = resolve_plan(plan_request(cfg), GPUS4, world_size=2, train_engine=train_strategy(cfg))
    assert plan.placements["train"].engine == "fsdp" and plan.placements["train"].devices == ("cuda:0", "cuda:1")


def test_config_keys_resolve_to_a_plan():
    """The Hydra keys (allocation_mode, train_model/inference_model/ref_model) feed resolve_plan as they are."""
    cfg = _compose(["train_model.num_devices=2", "inference_model.devices=[3]"])
    plan = resolve_plan(plan_request(cfg), GPUS4, world_size=2, train_engine="ddp")
    assert plan.placements["train"].devices == ("cuda:0", "cuda:1")
    assert plan.placements["inference"].devices == ("cuda:3",)
    plan = resolve_plan(plan_request(_compose(["allocation_mode=vllm:d1", "rollout.backend=vllm"])), GPUS4,
                        **VLLM)
    assert (plan.placements["inference"].devices, plan.placements["train"].devices) == (("cuda:0",), ("cuda:1",))


# --- in-process vLLM builds its engine on the process's first visible GPU (issue 25 D) ---------------------------

def _inference_devices(plan):
    """Each training rank's in-process inference device under ``plan`` (what placement_for gives rank r)."""
    inf = plan.placements["inference"]
    return [plan.train_device(r) if inf.colocated_with else inf.devices[r % len(inf.devices)]
            for r in range(plan.world_size)]


def test_in_process_vllm_with_its_own_device_takes_cuda0_and_training_the_rest():
    plan = resolve_plan(cfg("vllm:d1"), GPUS4, **VLLM)
    assert plan.placements["inference"].devices == ("cuda:0",)
    assert plan.placements["train"].devices == ("cuda:1",)
    plan = resolve_plan(cfg(train=(1, []), inference=(1, []), ref=(1, [])), GPUS4, **VLLM)
    assert [plan.placements[r].devices for r in ("inference", "train", "ref")] == [("cuda:0",), ("cuda:1",),
                                                                                   ("cuda:2",)]
    # transformers (own copy on any device) and Ray workers (each actor gets its GPU) keep train first
    assert resolve_plan(cfg("transformers:d1"), GPUS4).placements["inference"].devices == ("cuda:1",)
    assert resolve_plan(cfg("vllm:d1"), GPUS4, **VLLM,
                        rollout_workers=1).placements["inference"].devices == ("cuda:1",)
    # CPU slots: no first-visible-device constraint, order unchanged
    assert resolve_plan(cfg("vllm:d1"), CPU2, **VLLM).placements["inference"].devices == ("cpu:1",)


@pytest.mark.parametrize("conf, kwargs, match", [
    (cfg("vllm:d1+fsdp:d2"), {"world_size": 2, "train_engine": "fsdp"},
     r"rollout.backend=vllm runs one in-process engine per training process.*2 training processes"),
    (cfg("vllm:d1+ddp:d2"), {"world_size": 2, "train_engine": "ddp"}, r"2 training processes"),
    (cfg(), {"world_size": 2, "train_engine": "ddp"}, r"rank 1.*cuda:1"),  # colocated under torchrun
    (cfg("vllm:d2"), {}, r"allocation_mode=vllm:d2 gives inference 2 devices"),
    (cfg(inference=(0, [2])), {}, r"inference_model.devices puts inference on cuda:2"),
    (cfg(train=(0, [1])), {}, r"inference is colocated with train on cuda:1"),
    (cfg(train=(0, [0]), inference=(1, [])), {}, r"inference_model.num_devices puts inference on cuda:1"),
])
def test_in_process_vllm_off_cuda0_is_refused_at_resolve(conf, kwargs, match):
    with pytest.raises(AllocationError, match=match):
        resolve_plan(conf, GPUS4, **VLLM, **kwargs)


def _readme_commands():
    """Every command in README.md and docs/cluster.md (where the cluster section moved) that sets a device plan:
    (command, config overrides, torchrun processes, GPUs its comment states or None)."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text() + (root / "docs" / "cluster.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("#")
            if not re.search(r"allocation_mode=|_model\.(num_)?devices=", code):
                continue
            tokens = shlex.split(code)
            script = next(i for i, t in enumerate(tokens) if t.endswith(".py"))
            nproc = next((int(t.split("=")[1]) for t in tokens[:script] if t.startswith("--nproc_per_node=")), 1)
            config = "grpo_reasoning_async" if tokens[script].endswith("grpo-async.py") else "grpo_reasoning"
            args = tokens[script + 1:]
            if "--config-name" in args:
                at = args.index("--config-name")
                config, args = args[at + 1], args[:at] + args[at + 2:]
            overrides = args
            gpus = re.search(r"(\d+) GPUs", comment)
            cmds.append((code.strip(), config, overrides, nproc, int(gpus[1]) if gpus else None))
    return cmds


def test_readme_device_plans_resolve_and_keep_in_process_vllm_on_cuda0():
    """Every `allocation_mode=` / `*_model.devices` command of README.md composes with the real configs, resolves on
    the GPUs its comment states (else 8 fake GPUs), and no plan puts an in-process vLLM engine off cuda:0."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs, train_strategy

    register_configs()
    cmds = _readme_commands()
    assert sum("allocation_mode=" in c for c, *_ in cmds) >= 2, cmds  # the README's AReaL examples are covered
    for command, config, overrides, nproc, gpus in cmds:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"),
                                   version_base="1.3"):
            c = compose(config_name=config, overrides=overrides)
        workers = c.rollout.num_workers if c.rollout.launcher == "ray" else 0
        plan = resolve_plan(plan_request(c), [f"cuda:{i}" for i in range(gpus or 8)], world_size=nproc,
                            rollout_workers=workers, train_engine=train_strategy(c), inference_engine=c.rollout.backend,
                            inference_placement=backend_spec(c.rollout.backend).placement)
        if c.rollout.backend == "vllm" and not workers:
            assert set(_inference_devices(plan)) == {"cuda:0"}, (command, plan.describe())
