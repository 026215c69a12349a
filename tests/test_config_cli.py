"""Hydra config schema and the grpo.py command line (tiny model, real GSM8K data)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from torchrl_grpo.config import register_configs, validate_config

REPO = Path(__file__).resolve().parents[1]


def _compose(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="grpo_gsm8k", overrides=overrides)


def test_default_config_is_valid():
    cfg = _compose([])
    validate_config(cfg)
    assert cfg.actor.path == "smollm2-135m-instruct"
    assert cfg.econfig.env_id == "GSM8K-v1" and cfg.econfig.format_reward == 0.0


@pytest.mark.parametrize("override", ["optimizer.lrr=1e-5", "gconfig.n_sample=8", "actor.peft.rank=4"])
def test_unknown_key_fails_naming_it(override):
    with pytest.raises((ConfigCompositionException, ConfigKeyError)) as e:
        _compose([override])
    msg = str(e.value) + str(e.value.__cause__)
    assert override.split("=")[0].split(".")[-1] in msg


def test_wrong_type_fails():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        _compose(["train.steps=abc"])


@pytest.mark.parametrize("override,needle", [("rollout.backend=tgi", "rollout.backend"),
                                             ("gconfig.n_samples=0", "gconfig.n_samples"),
                                             ("optimizer.lr=-1", "optimizer.lr")])
def test_bad_values_fail_naming_key(override, needle):
    cfg = _compose([override])
    with pytest.raises(ValueError, match=needle):
        validate_config(cfg)


def _run(args, cwd, timeout=600):
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run([sys.executable, str(REPO / "grpo.py"), "--config-name=grpo_gsm8k", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


COMMON = ["actor.path=tiny-random", "train.steps=2", "train.batch_size=1", "gconfig.n_samples=2",
          "gconfig.max_new_tokens=8", "eval.n_problems=2", "checkpoint.every=1", "stats_logger.wandb.mode=disabled",
          "stats_logger.progress_bar=false"]


def test_cli_run_writes_outputs(tmp_path, gsm8k_dir):
    p = _run(COMMON + [f"train_dataset.path={gsm8k_dir}"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = list((tmp_path / "outputs").glob("*/*"))
    assert len(runs) == 1
    run = runs[0]
    assert (run / ".hydra" / "config.yaml").is_file()
    # the resolved model and data paths are recorded (the Hydra config keeps the user's spelling)
    src = json.loads((run / "model_source.json").read_text())
    assert src["spec"] == "tiny-random" and src["kind"] == "alias" and Path(src["path"], "config.json").is_file()
    assert (run / "data_sources.json").is_file()
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn at the end of fit()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {0, 1, 2}
    assert any("eval/accuracy" in r for r in rows) and any("reward/mean" in r for r in rows)
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step_000002"]  # checkpoint.keep_last: 1 in the demo config
    # the run ends with one line: greedy accuracy before -> after, n, Wilson intervals, the run dir (issue 45)
    last = p.stdout.strip().splitlines()[-1]
    assert "result: greedy accuracy " in last and " -> " in last and "(n=2; 95% Wilson [" in last, last
    assert last.endswith(f"run dir: {run}") or str(run.name) in last, last
    # eval-only entry on the checkpoint
    p2 = _run(COMMON + [f"train_dataset.path={gsm8k_dir}", "eval_only=true",
                        f"train.resume_from={run / 'checkpoints'}"], cwd=tmp_path)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert "eval/accuracy" in p2.stdout + p2.stderr


def test_cli_multirun_sweep(tmp_path, gsm8k_dir):
    p = _run(["--multirun"] + COMMON + [f"train_dataset.path={gsm8k_dir}", "train.steps=1", "eval.n_problems=0",
                                        "optimizer.lr=1e-5,1e-6"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted((tmp_path / "multirun").glob("*/*/*/metrics.jsonl"))
    assert len(jobs) == 2
    lrs = sorted(json.loads(j.read_text().splitlines()[0])["lr"] for j in jobs)
    assert lrs == pytest.approx([1e-6, 1e-5])


def test_cli_missing_data_dir_is_a_clear_error(tmp_path):
    p = _run(COMMON + [f"train_dataset.path={tmp_path / 'nope'}"], cwd=tmp_path)
    assert p.returncode != 0
    assert "nope" in p.stderr and ("GSM8K_DATA_DIR" in p.stderr or "not found" in p.stderr.lower())


def test_vllm_context_shorter_than_the_episode_limit_fails():
    cfg = _compose(["rollout.backend=vllm", "rollout.max_context_tokens=4096", "rollout.vllm.max_model_len=2048"])
    with pytest.raises(ValueError, match="rollout.vllm.max_model_len"):
        validate_config(cfg)
    validate_config(_compose(["rollout.backend=vllm", "rollout.max_context_tokens=2048"]))


def _compose_tau2(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="grpo_tau2", overrides=overrides)


def test_choice_sets_are_defined_once_in_config_and_shared_with_the_implementing_modules():
    """Each config choice set is one tuple, defined in torchrl_grpo.config.choices: validation checks it and the
    implementing module checks the same object, so the two cannot drift apart (issue 27: config is a leaf)."""
    from torchrl_grpo.backends import factory
    from torchrl_grpo.config import _choices, choices
    from torchrl_grpo.distributed import data_parallel, device_plan
    from torchrl_grpo.model_store import loading
    from torchrl_grpo.objectives import advantage as advantage
    from torchrl_grpo.objectives import loss as loss
    from torchrl_grpo.reporting import stats_logger
    from torchrl_grpo.assembly import environments as env_side  # maps econfig.user to the env's user= (moved from rollout/, issue 27)
    from torchrl_grpo.rollout import ray_workers
    from torchrl_grpo.training import optimizer, sft_trainer
    from torchrl_grpo.training import update as update

    c = _choices()
    assert c["loss.aggregation"] is loss.AGGREGATIONS is choices.AGGREGATIONS
    assert c["loss.behaviour_weight_mode"] is loss.BEHAVIOUR_WEIGHT_MODES is choices.BEHAVIOUR_WEIGHT_MODES
    assert c["loss.adv_scale"] is advantage.SCALES and c["loss.adv_baseline"] is advantage.BASELINES
    assert c["loss.anchor"] is update.ANCHORS and c["rollout.backend"] is factory.BACKENDS is choices.BACKENDS
    assert update.SHARED_PREFIX_MODES is choices.SHARED_PREFIX_MODES
    assert c["optimizer.scheduler"] is optimizer.SCHEDULERS and c["train.strategy"] is data_parallel.STRATEGIES
    assert c["rollout.launcher"] is ray_workers.LAUNCHERS and c["sft.source"] is sft_trainer.SFT_SOURCES
    assert c["actor.dtype"] is loading.DTYPES and c["stats_logger.wandb.mode"] is stats_logger.WANDB_MODES
    assert env_side.USERS is choices.USERS and device_plan.TRAIN_ENGINES is choices.TRAIN_ENGINES
    assert c["econfig.reward"] is choices.TAU2_REWARD_KINDS  # equal to envs.tau2's: tests/test_reasoning_gym_imports.py
    with pytest.raises(ValueError, match="scheduler"):
        optimizer.make_scheduler(None, "step", 0, 10)


def test_config_imports_nothing_of_ours_and_no_torch():
    """torchrl_grpo.config is a leaf: importing it (and checking a config) loads no other torchrl_grpo module and
    no torch (grpo.py --help and Hydra's schema registration stay fast)."""
    import subprocess
    import sys

    code = ("import sys, torchrl_grpo.config as c; from omegaconf import OmegaConf; "
            "c.validate_config(OmegaConf.structured(c.GRPOConfig)); "
            "print(' '.join(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or "
            "(m.startswith('torchrl_grpo.') and not m.startswith('torchrl_grpo.config')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == []


@pytest.mark.parametrize("overrides,user", [
    ([], "solo"),
    (["econfig.solo_mode=false"], "scripted"),
    (["econfig.solo_mode=false", "econfig.user_llm=local"], "local"),
    (["econfig.solo_mode=false", "econfig.user_llm=gpt-4o-mini"], "llm"),
    (["econfig.solo_mode=false", "econfig.user=scripted", "econfig.user_llm=gpt-4o-mini"], "scripted"),
])
def test_tau2_user_has_one_spelling_per_concept(overrides, user):
    from torchrl_grpo.config import tau2_user

    cfg = _compose_tau2(overrides)
    validate_config(cfg)
    assert tau2_user(cfg.econfig) == user


@pytest.mark.parametrize("overrides,needle", [
    (["econfig.user=solo"], "solo_mode=true"),
    (["econfig.solo_mode=false", "econfig.user=robot"], "econfig.user"),
    (["econfig.user_llm=local"], "solo_mode=false"),
])
def test_contradicting_tau2_user_settings_fail_naming_the_switch(overrides, needle):
    cfg = _compose_tau2(overrides)
    with pytest.raises(ValueError, match=needle):
        validate_config(cfg)


def _cli_config(script, args, part="job"):
    """The config ``script`` composes for ``args`` (Hydra's ``--cfg``: printed, nothing run)."""
    p = subprocess.run([sys.executable, str(REPO / script), *args, "--cfg", part], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return OmegaConf.create(p.stdout)


@pytest.mark.parametrize("sync_args,async_args", [
    ([], []),
    (["--config-name", "grpo_tau2"], ["--config-name", "grpo_tau2_async"]),
])
def test_grpo_async_py_is_grpo_py_mode_async(sync_args, async_args):
    """grpo-async.py composes exactly ``grpo.py mode=async`` from its own primary config: no argv injection (Hydra
    records no override it was not given) and the ``mode`` group's choice is ``async`` in the run's hydra.yaml."""
    user = ["train.steps=3", "train.max_staleness=2"]
    want = _cli_config("grpo.py", sync_args + ["mode=async"] + user)
    got = _cli_config("grpo-async.py", async_args + user)
    assert got.mode == "async" and got == want
    assert _cli_config("grpo.py", sync_args + user).mode == "sync"
    hydra_cfg = _cli_config("grpo-async.py", async_args + user, part="hydra").hydra
    assert list(hydra_cfg.overrides.task) == user
    assert hydra_cfg.runtime.choices.mode == "async"


def test_mode_is_a_config_group():
    """``mode=<x>`` selects configs/mode/<x>.yaml; a misspelt mode fails at composition, listing the options."""
    assert _compose([]).mode == "sync" and _compose(["mode=async"]).mode == "async"
    with pytest.raises(ConfigCompositionException, match="async"):
        _compose(["mode=asynch"])
