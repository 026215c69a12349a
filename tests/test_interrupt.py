"""Ctrl-C / SIGTERM stop training cleanly: the step in flight finishes, a checkpoint of it is written, the rollout
thread is joined, and the entry points exit with 128 + signum; ``train.resume_from`` continues from it.
The entry-point tests take 30-60 s each, most of it the interpreter start (torch, transformers) on a busy core."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer
from torchrl_grpo.training.checkpoint import load_checkpoint
from torchrl_grpo.config import GRPOConfig
from torchrl_grpo.training.interrupt import TrainingInterrupted, finish_step, handle_signals
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.assembly import build_trainer

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- the signal rules
def test_first_signal_in_a_step_is_held_to_its_end_second_is_raised_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with handle_signals():
        done = []
        with pytest.raises(TrainingInterrupted) as ei, finish_step():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("rest of the step")
        assert done == ["rest of the step"]
        assert not ei.value.mid_step and ei.value.exit_code == 143
        with pytest.raises(TrainingInterrupted) as ei, finish_step():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            done.append("never")
        assert done == ["rest of the step"] and ei.value.mid_step and ei.value.exit_code == 130
        with pytest.raises(TrainingInterrupted) as ei:  # outside a step: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert not ei.value.mid_step
    assert signal.getsignal(signal.SIGTERM) is before


# ---------------------------------------------------------------------------------------------- fit, in process
def _signal_during_step(trainer, at_step: int, times: int):
    real = trainer.train_step

    def step():
        if trainer.step + 1 == at_step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGTERM)
        return real()

    trainer.train_step = step


def test_fit_finishes_the_step_and_checkpoints_it(tmp_path):
    trainer = build_trainer(make_cfg(train={"steps": 50}), tmp_path)
    _signal_during_step(trainer, at_step=2, times=1)
    try:
        with pytest.raises(TrainingInterrupted):
            trainer.fit()
        weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # the interrupted step was finished and logged
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]
    fresh = build_trainer(make_cfg(train={"steps": 50}), tmp_path / "fresh")
    fresh.close()
    state = load_checkpoint(tmp_path / "checkpoints", model=fresh.model)
    assert state["step"] == 2
    for k, v in fresh.model.state_dict().items():
        torch.testing.assert_close(v, weights[k])


def test_second_signal_abandons_the_step_unsaved(tmp_path):
    trainer = build_trainer(make_cfg(train={"steps": 50}), tmp_path)
    _signal_during_step(trainer, at_step=2, times=2)
    try:
        with pytest.raises(TrainingInterrupted) as ei:
            trainer.fit()
    finally:
        trainer.close()
    assert ei.value.mid_step and trainer.step == 1
    assert not (tmp_path / "checkpoints").exists()  # the weights may be half-updated: nothing is saved


def test_async_trainer_stops_while_waiting_for_a_batch(tmp_path):
    """The trainer does not wait for the batch in flight: the model is still that of the last step, saved as is."""
    trainer = build_trainer(make_cfg(mode="async", train={"steps": 50, "max_staleness": 0}), tmp_path, trainer_cls=AsyncGRPOTrainer)
    collect, wait = trainer.collector.collect, trainer._cond.wait
    trainer_waits, release = threading.Event(), threading.Event()

    def collect_stuck_at_step_3(tasks, n, step):
        if step == 2:  # batch of the third step: once the trainer waits for it, request a stop, then hang
            trainer_waits.wait(timeout=60)
            os.kill(os.getpid(), signal.SIGTERM)
            release.wait(timeout=60)
        return collect(tasks, n, step=step)

    def trainer_wait(timeout=None):
        if threading.current_thread() is threading.main_thread() and trainer.step == 2:
            trainer_waits.set()
        return wait(timeout)

    trainer.collector.collect = collect_stuck_at_step_3
    trainer._cond.wait = trainer_wait
    try:
        with pytest.raises(TrainingInterrupted) as ei:
            trainer.fit()
        assert trainer._thread.is_alive()  # still collecting the third batch
    finally:
        release.set()
        trainer.close()
    assert not trainer._thread.is_alive() and not ei.value.mid_step
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]


# ---------------------------------------------------------------------------------------------- the entry points
def _args(gsm8k_dir, out: Path, steps: int) -> list[str]:
    return ["actor.path=tiny-random", f"train.steps={steps}", "train.batch_size=1", "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8", "eval.at_start=false", "eval.at_end=false", "eval.n_problems=0",
            "checkpoint.every=0", "checkpoint.save_final=false", "stats_logger.wandb.mode=disabled",
            "stats_logger.progress_bar=false", f"train_dataset.path={gsm8k_dir}", f"output_dir={out}"]


def _train_rows(run: Path) -> list[dict]:
    f = run / "metrics.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    return [r for r in rows if "reward/mean" in r]


def _interrupt_and_resume(script: str, sig: int, tmp_path: Path, gsm8k_dir: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    log_file = (tmp_path / "train.log").open("w")
    config = "grpo_gsm8k_async" if script == "grpo-async.py" else "grpo_gsm8k"
    p = subprocess.Popen([sys.executable, str(REPO / script), f"--config-name={config}", *_args(gsm8k_dir, run, 1000)],
                         cwd=tmp_path, env=env,
                         stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _train_rows(run):
            assert p.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no training step within 120 s"
            time.sleep(0.2)
        p.send_signal(sig)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        log_file.close()
    out = (tmp_path / "train.log").read_text()
    assert rc == 128 + sig, out[-3000:]
    last = _train_rows(run)[-1]["step"]
    assert last < 1000
    (ckpt,) = (run / "checkpoints").iterdir()
    assert ckpt.name == f"step_{last:06d}", out[-3000:]  # the checkpoint is the last logged (completed) step
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer("tiny-random")
    assert load_checkpoint(ckpt, model=model)["step"] == last
    # resume with the run's own config (in this process: a second interpreter start costs ~20 s here)
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.load(ckpt / "config.yaml"))
    cfg.train.resume_from, cfg.train.steps = str(run / "checkpoints"), last + 1
    resumed = tmp_path / "resumed"
    trainer = build_trainer(cfg, resumed, trainer_cls=AsyncGRPOTrainer if cfg.mode == "async" else GRPOTrainer)
    try:
        assert trainer.step == last
        trainer.fit()
    finally:
        trainer.close()
    assert [r["step"] for r in _train_rows(resumed)] == [last + 1]


def test_grpo_py_sigterm_checkpoints_and_exits_143(tmp_path, gsm8k_dir):
    _interrupt_and_resume("grpo.py", signal.SIGTERM, tmp_path, gsm8k_dir)


def test_grpo_async_py_sigint_checkpoints_and_exits_130(tmp_path, gsm8k_dir):
    _interrupt_and_resume("grpo-async.py", signal.SIGINT, tmp_path, gsm8k_dir)
