"""The phases of torchrl_grpo.assembly.build (issue 27), each run alone: devices, run records, policy, the one
SamplingConfig and what derives from it, env side, optimisation, resume, the Ray workers' recipe, loop settings.
Tiny random model, ToyVowels / GSM8K, CPU only."""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
import pickle

import pytest
import torch

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.assembly.phases import loop_settings
from torchrl_grpo.assembly.devices import plan_request, setup_devices
from torchrl_grpo.assembly.environments import build_env_side, env_kwargs_from_config, local_user_sampling
from torchrl_grpo.assembly.optimisation import build_optimisation, build_update, resume
from torchrl_grpo.assembly.policy import build_policy, shard_policy
from torchrl_grpo.assembly.records import prepare_run
from torchrl_grpo.assembly.rollout_side import loss_sampling, sampling_config, worker_rollout
from torchrl_grpo.distributed.device_plan import PlanRequest
from torchrl_grpo.rollout.env_side import make_env_side
from torchrl_grpo.rollout.evaluation import EVAL_SEED, eval_samplings
from torchrl_grpo.seeding import seed_everything
from torchrl_grpo.training.checkpoint import save_checkpoint

SMALL = {"train": {"steps": 2, "batch_size": 2, "device": "cpu"}, "gconfig": {"n_samples": 2, "max_new_tokens": 8}}


def _cfg(**over):
    return make_cfg(**{**SMALL, **over})


def test_plan_request_reads_both_spellings():
    cfg = _cfg(train_model={"num_devices": 2}, inference_model={"devices": [3]})
    assert plan_request(cfg) == PlanRequest(None, num_devices={"train": 2, "inference": 0, "ref": 0},
                                            devices={"train": (), "inference": (3,), "ref": ()})
    assert plan_request(_cfg(allocation_mode="vllm:d1+fsdp:d2")).allocation_mode == "vllm:d1+fsdp:d2"
    assert plan_request({}) == PlanRequest(None, {r: 0 for r in ("train", "inference", "ref")},
                                           {r: () for r in ("train", "inference", "ref")})


def test_devices_phase_on_one_cpu_process():
    d = setup_devices(_cfg())
    assert d.device == torch.device("cpu") and d.dp.world_size == 1 and d.dp.is_main
    assert d.plan.colocated and d.plan.placements["train"].engine == "single"
    assert d.placement.train_device == d.placement.inference_device == torch.device("cpu")


def test_records_phase_writes_the_plan_seeds_and_checks_data_first(tmp_path, gsm8k_dir):
    cfg = _cfg(econfig={"env_id": "GSM8K-v1"}, train_dataset={"path": str(gsm8k_dir)}, seed=7)
    devices = setup_devices(cfg)
    run_dir = prepare_run(cfg, tmp_path / "run", devices)
    got = torch.rand(3)
    seed_everything(7)
    assert torch.equal(got, torch.rand(3))  # seeded by the phase
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["colocated"] is True and "applied" in plan
    sources = json.loads((run_dir / "data_sources.json").read_text())
    # the source is recorded resolved (a symlinked data dir, as CI's shared/, shows its target)
    assert set(sources) == {"train_dataset", "valid_dataset"}
    assert str(Path(gsm8k_dir).resolve()) in sources["train_dataset"]
    bad = _cfg(econfig={"env_id": "GSM8K-v1"}, train_dataset={"path": str(tmp_path / "nowhere")})
    with pytest.raises(FileNotFoundError):
        prepare_run(bad, tmp_path / "bad", devices)
    assert not (tmp_path / "bad" / "data_sources.json").exists()


def test_policy_phase_takes_the_kl_reference_before_dropout_is_disabled(tmp_path, tiny_model_and_tokenizer):
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny-random")
    model.config.attention_dropout = 0.1  # a rate disable_dropout zeroes
    cfg = _cfg(loss={"kl_coef": 0.1}, train={**SMALL["train"], "disable_dropout": True})
    devices = setup_devices(cfg)
    policy = build_policy(cfg, devices, tmp_path, model=model, tokenizer=tok)
    assert policy.model is model and policy.tokenizer is tok and policy.load_time_s >= 0
    assert not (tmp_path / "model_source.json").exists()  # preloaded: nothing resolved
    with policy.reference() as ref:
        assert ref is not model and not any(p.requires_grad for p in ref.parameters())
        assert ref.config.attention_dropout == 0.1  # copied as the policy was at start
    assert model.config.attention_dropout == 0.0
    assert shard_policy(policy, devices).model is model  # not an FSDP plan: unchanged
    with pytest.raises(ValueError, match="needs its tokenizer"):
        build_policy(cfg, devices, tmp_path, model=model)
    loaded = build_policy(_cfg(), devices, tmp_path)  # from actor.path: the source is recorded
    assert loaded.reference is None
    assert json.loads((tmp_path / "model_source.json").read_text())["spec"] == "tiny-random"


def test_one_sampling_config_and_what_derives_from_it():
    run = sampling_config(_cfg(gconfig={"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.8, "top_k": 5}))
    assert run == SamplingConfig(max_new_tokens=12, temperature=0.9, top_p=0.8, top_k=5)
    assert loss_sampling(run) is run  # sampled rollouts: scored under their own distribution
    greedy = dataclasses.replace(run, temperature=0.0)
    assert loss_sampling(greedy) == dataclasses.replace(run, temperature=1.0, top_p=1.0, top_k=0)
    user = local_user_sampling(run, seed=3)
    assert user == SamplingConfig(max_new_tokens=12, temperature=0.7, top_p=1.0, top_k=0, seed=3)
    g, s = eval_samplings(run)
    assert (g.max_new_tokens, g.temperature, s.max_new_tokens, s.temperature, s.seed) == (12, 0.0, 12, 0.9, EVAL_SEED)
    assert loop_settings(_cfg(gconfig={"max_new_tokens": 12}), run).max_new_tokens == 12


def test_data_backed_envs_share_one_kwargs_table():
    """GSM8K and IFEval differ in the data keyword (and GSM8K's format credit), nothing else."""
    for env_id, key, extra in (("GSM8K-v1", "data_dir", {"format_reward": 0.25}), ("IFEval-v0", "data_path", {})):
        cfg = _cfg(econfig={"env_id": env_id, "system_prompt": "Be brief.", "format_reward": 0.25})
        assert env_kwargs_from_config(cfg, "test", "/data") == (
            env_id, {"split": "test", key: "/data", "system_prompt": "Be brief.", **extra})
        assert env_kwargs_from_config(_cfg(econfig={"env_id": env_id}), "train")[1] == {"split": "train", **(
            {"format_reward": 0.0} if env_id == "GSM8K-v1" else {})}


def test_env_side_phase_and_the_plain_values_below_it(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    backend = TransformersBackend(model, pad_token_id=tok.pad_token_id, share_module=True)
    cfg = _cfg(eval={"n_problems": 3})
    run = sampling_config(cfg)
    side = build_env_side(cfg, backend, tok, run)
    try:
        assert side.user_fn is None and side.train_tasks == list(range(8)) and side.eval_tasks() == [0, 1, 2]
        stops = sorted(side.collector.end_of_turn)  # the collector's replace: the chat template's end-of-turn ids
        assert side.collector.sampling == side.eval_collector.sampling == dataclasses.replace(run, stop_token_ids=stops)
    finally:
        side.close()
    with pytest.raises(ValueError, match="train split 'train' of ToyVowels-v0 has no tasks"):
        make_env_side(("ToyVowels-v0", {"split": "train", "n_tasks": 0}), ("ToyVowels-v0", {"split": "test"}),
                      backend, tok, run, max_turns=1, max_context_tokens=256, seed=0)


def test_optimisation_and_resume_phases(tmp_path, tiny_model_and_tokenizer):
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny-random")
    cfg = _cfg(gconfig={"max_new_tokens": 8, "temperature": 0.0}, econfig={"env_id": "ToyVowels-v0", "max_turns": 3})
    devices = setup_devices(cfg)
    run = sampling_config(cfg)
    opt = build_optimisation(cfg, model, devices.device, run)
    assert opt.loss_fn.max_tokens == 8 * 3
    assert (opt.loss_fn.temperature, opt.loss_fn.top_p, opt.loss_fn.top_k) == (1.0, 1.0, 0)  # greedy: raw softmax
    backend = TransformersBackend(model, pad_token_id=tok.pad_token_id, share_module=True)
    assert resume(cfg, model, opt, backend) == (0, 0)
    path = save_checkpoint(tmp_path / "checkpoints", 5, model=model, optimizer=opt.optimizer,
                           scheduler=opt.scheduler, extra={"optimizer_steps": 9})
    resumed = _cfg(train={**SMALL["train"], "resume_from": str(path)})
    assert resume(resumed, model, opt, backend) == (5, 9)
    assert backend.policy_version == 1  # synced to the loaded weights
    from torchrl_grpo.assembly.policy import Policy

    update = build_update(cfg, Policy(model, tok, None, 0.0), opt, devices, backend, optimizer_steps=9)
    assert update.optimizer_steps == 9


def test_ray_workers_recipe_is_picklable_and_builds_a_worker_without_ray():
    cfg = _cfg()
    from omegaconf import OmegaConf

    run = sampling_config(cfg)
    recipe = functools.partial(worker_rollout, OmegaConf.to_container(cfg, resolve=True), run)
    recipe = pickle.loads(pickle.dumps(recipe))  # what Ray ships to each actor
    backend, collector = recipe("cpu")
    try:
        assert backend.share_module is False  # weights arrive by load_weights
        assert not any(p.requires_grad for p in backend.model.parameters())
        assert collector.sampling == dataclasses.replace(run, stop_token_ids=sorted(collector.end_of_turn))
    finally:
        collector.close()
