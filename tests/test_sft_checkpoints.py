"""SFT honours the run's checkpoint and evaluation schedules and resumes (issue 36.4): with checkpoint.every /
save_final / on_interrupt and eval.every a plain sft.py run wrote no checkpoint, a SIGINT lost the run, and
train.resume_from reran the whole recipe with a shifted step counter."""
from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.test_sft import sft_cfg
from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.training.checkpoint import save_checkpoint
from torchrl_grpo.training.interrupt import TrainingInterrupted
from torchrl_grpo.training.sft_trainer import PHASE_DATA, SFTProgress, SFTTrainer, read_sft_resume


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _fit(cfg, run_dir, signal_at=None):
    """Build and fit an SFT trainer; ``signal_at``: SIGTERM during that optimizer step (0-based), which finishes."""
    trainer = build_trainer(cfg, run_dir, trainer_cls=SFTTrainer)
    if signal_at is not None:
        real = trainer.update

        def update(batch, *, step):
            if step == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(batch, step=step)

        trainer.update = update
    try:
        if signal_at is None:
            return trainer, trainer.fit()
        with pytest.raises(TrainingInterrupted):
            trainer.fit()
        return trainer, None
    finally:
        trainer.close()


@pytest.mark.slow  # a whole SFT run with evaluations and checkpoints: 153 s loaded
def test_sft_saves_checkpoints_and_evaluates_on_the_runs_schedules(tmp_path):
    over = {"checkpoint": {"every": 2, "save_final": True, "keep_last": 0},
            "eval": {"every": 2, "at_start": False, "at_end": False, "n_problems": 1},
            "sft": {"epochs": 1, "minibatch_size": 2, "save_model": False}}
    trainer, summary = _fit(sft_cfg(**over), tmp_path)
    n = trainer.step
    assert n >= 3  # >= 5 demonstrations of mock, 2 per step
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "checkpoints").iterdir())
    assert saved == sorted({*range(2, n + 1, 2), n}) and summary["checkpoint"].endswith(f"step_{n:06d}")
    evals = [r["step"] for r in _rows(tmp_path) if "eval/accuracy" in r]
    assert evals == sorted({*range(2, n + 1, 2), n})  # every 2 steps, and the last one (eval.at_end=false)
    st = read_sft_resume(tmp_path / "checkpoints")
    assert st["step"] == n and st["progress"] == SFTProgress(0, n, n) and st["data"] is None  # the gold phase done


@pytest.mark.slow  # three SFT runs, ~1.5 min on 2 idle cores
def test_an_interrupted_sft_run_resumes_into_its_run_dir_as_if_never_stopped(tmp_path):
    over = {"checkpoint": {"every": 0, "save_final": True, "on_interrupt": True},
            "eval": {"at_start": False, "at_end": False}, "sft": {"epochs": 2, "minibatch_size": 3, "save_model": False},
            "optimizer": {"lr": 1e-2, "warmup_steps": 2, "scheduler": "linear"}}
    full, _ = _fit(sft_cfg(**over), tmp_path / "full")
    ref_rows = [r for r in _rows(tmp_path / "full") if "sft/nll" in r]
    ref = {k: v.detach().clone() for k, v in full.model.state_dict().items()}
    assert full.step >= 4
    run = tmp_path / "run"
    _fit(sft_cfg(**over), run, signal_at=2)  # the third step finishes, is logged and saved, then the run stops
    st = read_sft_resume(run / "checkpoints")
    assert st["step"] == 3 and st["progress"].round == 0 and st["progress"].phase_step == 3 and st["data"] is not None
    assert (run / "checkpoints" / "step_000003" / PHASE_DATA).is_file()
    resumed_cfg = sft_cfg(**over)
    resumed_cfg.train.resume_from = str(run / "checkpoints")
    res, summary = _fit(resumed_cfg, run)
    assert res.step == full.step and summary["resumed_from"].endswith("step_000003")
    rows = [r for r in _rows(run) if "sft/nll" in r]
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows]  # each step once, none rerun or shifted
    for a, b in zip(ref_rows, rows):
        for key in ("sft/nll", "sft/lr", "sft/epoch"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    for k, v in res.model.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5)


def test_a_checkpoint_without_sft_progress_is_refused_before_the_model_loads(tmp_path, tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    save_checkpoint(tmp_path / "checkpoints", 4, model=model, extra={"optimizer_steps": 4})  # a GRPO checkpoint
    with pytest.raises(ValueError, match="not an SFT checkpoint"):
        read_sft_resume(tmp_path)
    cfg = sft_cfg()
    cfg.train.resume_from = str(tmp_path)
    with pytest.raises(ValueError, match="actor.path"):
        build_trainer(cfg, tmp_path / "run", trainer_cls=SFTTrainer)
    assert not (tmp_path / "run").exists()  # refused before build() made anything
