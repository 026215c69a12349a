"""The cl.* config section: configs/grpo_cl.yaml composes, per-domain configs, and bad input fails before any model
loads (torchrl_grpo.config.continual_domains, torchrl_grpo.assembly.continual_run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from torchrl_grpo.assembly.continual_run import validate_cl_config
from torchrl_grpo.config.continual_domains import CL_DOMAINS, DOMAIN_DEFAULTS, domain_config
from torchrl_grpo.config import GRPOConfig, register_configs, validate_config
from torchrl_grpo.assembly import build_trainer

REPO = Path(__file__).resolve().parents[1]


def _compose(overrides=()):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="grpo_cl", overrides=list(overrides))


def cl_cfg(cl=None, **over):
    base = {"cl": {"task_order": ["mock", "telecom"], "num_steps_per_task": 1,
                   "train_split": {"telecom": "small"}, "eval_split": {"telecom": "small"}, **(cl or {})},
            "eval": {"n_problems": 2}}
    return OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(base), OmegaConf.create(over))


def test_grpo_cl_yaml_composes_and_is_valid():
    cfg = _compose()
    assert list(cfg.cl.task_order) == ["airline", "retail", "telecom"] and cfg.cl.algorithm == "sequential"
    validate_config(cfg)  # runs the cl name/range checks
    validate_cl_config(cfg, check_tasks=False)
    air = domain_config(cfg, "airline")
    assert air.econfig.domain == "airline" and air.econfig.solo_mode is False and air.econfig.user == "scripted"
    assert air.train_dataset.split == "train" and air.valid_dataset.split == "test"
    assert air.train.steps == 300  # the LR schedule spans all three tasks
    tel = domain_config(cfg, "telecom")
    assert tel.econfig.solo_mode is True and tel.econfig.user is None


def test_cli_overrides_of_the_cl_section():
    cfg = _compose(["cl.task_order=[mock,telecom]", "cl.num_steps_per_task=2", "cl.algorithm=replay",
                    "cl.replay_ratio=1.0", "+cl.train_split.telecom=small", "cl.kl_coef=0.05"])
    assert list(cfg.cl.task_order) == ["mock", "telecom"]
    validate_cl_config(cfg, check_tasks=False)
    tel = domain_config(cfg, "telecom")
    assert tel.train_dataset.split == "small" and tel.train.steps == 4 and tel.loss.kl_coef == 0.05
    assert domain_config(cfg, "mock").train_dataset.split == "base"


def test_domain_config_layers():
    cfg = cl_cfg({"max_tasks_per_domain": 3, "econfig": {"telecom": {"reward": "partial", "max_turns": 5}}},
                 econfig={"max_steps": 7, "reward": "binary"})
    t = domain_config(cfg, "telecom")
    # run econfig < domain defaults < cl.econfig[domain]
    assert (t.econfig.env_id, t.econfig.domain, t.econfig.max_steps, t.econfig.reward, t.econfig.max_turns) == \
        ("tau2", "telecom", 7, "partial", 5)
    assert t.train_dataset.limit == 3 and t.valid_dataset.split == "small"
    g = domain_config(cfg, "gsm8k")
    assert g.econfig.env_id == "GSM8K-v1" and g.econfig.max_turns == 1
    assert set(CL_DOMAINS) == {"airline", "retail", "telecom", "mock", "gsm8k", "ifeval"}
    assert g.train_dataset.path is None  # no cl.data_path: the run's (shared) dataset path


def test_data_path_per_domain():
    cfg = cl_cfg({"task_order": ["gsm8k", "ifeval"], "data_path": {"ifeval": "/data/ifbench.jsonl"}})
    f = domain_config(cfg, "ifeval")
    assert (f.econfig.env_id, f.econfig.max_turns, f.train_dataset.split, f.valid_dataset.split) == \
        ("IFEval-v0", 1, "train", "test")
    assert f.train_dataset.path == f.valid_dataset.path == "/data/ifbench.jsonl"
    assert domain_config(cfg, "gsm8k").train_dataset.path is None
    with pytest.raises(ValueError, match="cl.data_path names unknown domain 'gsm9k'"):
        validate_cl_config(cl_cfg({"task_order": ["gsm8k"], "data_path": {"gsm9k": "x"}}), check_tasks=False)


def test_solo_defaults_agree_with_tau2():
    from envs.tau2.domain import get_domain

    for d in ("airline", "retail", "telecom", "mock"):
        assert DOMAIN_DEFAULTS[d]["solo"] == get_domain(d).supports_solo, d


@pytest.mark.parametrize("cl,msg", [
    ({"task_order": ["mock", "airlines"]}, "unknown domain 'airlines' in cl.task_order"),
    ({"task_order": []}, "task_order is empty"),
    ({"task_order": ["mock", "mock"]}, "twice"),
    ({"num_steps_per_task": 0}, "num_steps_per_task must be >= 1"),
    ({"max_tasks_per_domain": 0}, "max_tasks_per_domain"),
    ({"eval_interval": -1}, "eval_interval"),
    ({"metric": "accuracy"}, "cl.metric"),
    ({"algorithm": "ewc2"}, "cl.algorithm"),
    ({"algorithm": "replay", "replay_ratio": 0.0}, "replay_ratio"),
    ({"kl_coef": -1.0}, "kl_coef"),
    ({"algorithm": "lora_per_domain"}, "needs actor.peft.enable=true"),
    ({"eval_split": {"telcom": "small"}}, "unknown domain 'telcom'"),
    ({"econfig": {"telecom": {"solo": True}}}, r"unknown key\(s\) \['solo'\]"),
    ({"task_order": ["airline", "mock"], "econfig": {"airline": {"solo_mode": True}}},
     "'airline' has no solo mode.*cl.econfig.airline.solo_mode=false"),
    ({"econfig": {"telecom": {"user": "scripted"}}}, "cl domain 'telecom'.*solo_mode=true has no user"),
])
def test_bad_cl_settings_raise_value_error(cl, msg):
    with pytest.raises(ValueError, match=msg):
        validate_cl_config(cl_cfg(cl), check_tasks=False)


def test_a_metric_the_evaluation_does_not_compute_is_refused():
    with pytest.raises(ValueError, match="eval.greedy=false has no score"):
        validate_cl_config(cl_cfg({"metric": "reward_mean"}, eval={"greedy": False, "pass_k": 4}), check_tasks=False)
    with pytest.raises(ValueError, match="eval.greedy=false has no score"):
        validate_cl_config(cl_cfg(eval={"greedy": False, "pass_k": 0}), check_tasks=False)
    with pytest.raises(ValueError, match="pass_k >= 1"):
        validate_cl_config(cl_cfg({"metric": "pass^k"}, eval={"pass_k": 0}), check_tasks=False)
    validate_cl_config(cl_cfg(eval={"greedy": False, "pass_k": 2}), check_tasks=False)  # pass^1 = sampled pass@1


def test_async_mode_is_refused():
    with pytest.raises(ValueError, match="sync only"):
        validate_cl_config(cl_cfg(mode="async"), check_tasks=False)


def test_validate_config_runs_the_cl_checks():
    with pytest.raises(ValueError, match="num_steps_per_task"):
        validate_config(cl_cfg({"num_steps_per_task": 0}))
    validate_config(OmegaConf.structured(GRPOConfig))  # no task_order: not a continual run, no cl checks


def test_splits_are_checked_against_the_envs():
    cfg = cl_cfg()
    validate_cl_config(cfg)  # mock base + telecom small: usable tasks in both
    with pytest.raises(ValueError, match="cl domain 'telecom'.*'tiny'.*valid"):
        validate_cl_config(cl_cfg({"train_split": {"telecom": "tiny"}}))
    with pytest.raises(ValueError, match="cl domain 'mock'.*eval env.*'test'"):
        validate_cl_config(cl_cfg({"eval_split": {"mock": "test", "telecom": "small"}}))


def test_algorithm_names_are_the_config_choice_set():
    from torchrl_grpo.config.choices import CL_ALGORITHMS
    from torchrl_grpo.continual.algorithms import ALGORITHMS

    assert tuple(ALGORITHMS) == CL_ALGORITHMS


def test_continual_trainer_rejects_bad_input_before_loading_a_model(tmp_path):
    missing_model = {"actor": {"path": str(tmp_path / "no-such-model")}}
    with pytest.raises(ValueError, match="unknown domain"):
        build_trainer(cl_cfg({"task_order": ["mock", "banking"]}, **missing_model), tmp_path / "run")
    with pytest.raises(ValueError, match="num_steps_per_task"):
        build_trainer(cl_cfg({"num_steps_per_task": 0}, **missing_model), tmp_path / "run")
    # a resume checkpoint from another task order
    ck = tmp_path / "old" / "checkpoint_task_0"
    ck.mkdir(parents=True)
    (ck / "cl_state.json").write_text(json.dumps({"task_order": ["telecom", "mock"], "task": 0}))
    with pytest.raises(ValueError, match="same order"):
        build_trainer(cl_cfg({"resume_from": str(ck)}, **missing_model), tmp_path / "run")
    (ck / "cl_state.json").write_text(json.dumps({"task_order": ["mock", "telecom"], "task": 1}))
    with pytest.raises(ValueError, match="nothing left"):
        build_trainer(cl_cfg({"resume_from": str(ck)}, **missing_model), tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="cl_state.json"):
        build_trainer(cl_cfg({"resume_from": str(tmp_path)}, **missing_model), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing was built


def test_the_continual_trainer_gets_plain_settings_from_the_cl_section(tmp_path):
    from torchrl_grpo.assembly.continual_run import check_continual, continual_settings
    from torchrl_grpo.continual.settings import ContinualSettings

    cfg = cl_cfg({"num_steps_per_task": 3, "eval_interval": 2, "kl_coef": 0.1, "kl_to_base": True})
    s = continual_settings(cfg)
    assert (s.domains, s.num_steps_per_task, s.eval_interval, s.metric) == (("mock", "telecom"), 3, 2, "pass^1")
    assert s.kl_anchor and s.kl_to_base and s.save_checkpoints and s.buffer_size == cfg.cl.buffer_size
    assert OmegaConf.create(s.config_yaml).cl.num_steps_per_task == 3  # the resolved run config, for checkpoints
    assert not continual_settings(cl_cfg()).kl_anchor
    assert check_continual(cfg) is None  # no cl.resume_from
    ck = tmp_path / "checkpoint_task_0"
    ck.mkdir()
    (ck / "cl_state.json").write_text(json.dumps({"task_order": ["mock", "telecom"], "task": 0, "metrics": {}}))
    state = check_continual(cl_cfg({"resume_from": str(ck)}))
    assert state["task_done"] is True and state["path"] == str(ck)  # states written before task_done: finished
    for bad in ({"domains": ()}, {"domains": ("mock", "mock")}, {"num_steps_per_task": 0}, {"eval_interval": -1},
                {"buffer_size": 0}, {"metric": "accuracy"}):
        with pytest.raises(ValueError):
            ContinualSettings(**{**vars(s), **bad})
    from torchrl_grpo.continual.algorithms import Sequential
    from torchrl_grpo.continual.trainer import ContinualTrainer

    with pytest.raises(ValueError, match="one env side per domain, in task order"):  # checked before anything runs
        ContinualTrainer(None, {"telecom": None, "mock": None}, s, algorithm=Sequential())
