"""The loop shell (torchrl_grpo/training/loop.py) with fake steps: no model, no env. Evaluation and checkpoint
schedules, the interrupt rules (a step finished and saved, a step abandoned), the ETA on a fake clock."""
from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from torchrl_grpo.training import loop as loop_mod
from torchrl_grpo.training.interrupt import TrainingInterrupted
from torchrl_grpo.training.loop import CheckpointSchedule, EvalSchedule, Progress, run_loop


class Logger:
    def __init__(self):
        self.rows = []

    def log(self, metrics, step):
        self.rows.append((step, dict(metrics)))


class Fake:
    """A trainer: a step counter, a step that returns its metrics, an evaluation and a save that record themselves."""

    def __init__(self, start=0, signal_at=None, signals=1):
        self.step, self.events, self.logger = start, [], Logger()
        self.signal_at, self.signals = signal_at, signals

    def train_step(self, _item=None):
        if self.step + 1 == self.signal_at:
            for _ in range(self.signals):
                os.kill(os.getpid(), signal.SIGTERM)
        self.step += 1
        self.events.append(("step", self.step))
        return {"loss/total": float(self.step)}

    def evaluate(self):
        self.events.append(("eval", self.step))
        return {"eval/accuracy": self.step / 10}

    def save(self):
        self.events.append(("save", self.step))
        return f"ck/step_{self.step:06d}"


def run(f, n, last=None, **kw):
    return run_loop(f.train_step, n, position=lambda: f.step, logger=f.logger, last=last, **kw)


def test_evaluation_at_start_every_k_but_the_last_and_at_end_merged_into_the_step_row():
    f = Fake()
    out = run(f, 5, last=5, evaluation=EvalSchedule(f.evaluate, at_start=True, every=2, at_end=True))
    assert f.events == [("eval", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4),
                        ("step", 5), ("eval", 5)]  # no "every" evaluation after step 5: the final one follows
    assert [s for s, _ in f.logger.rows] == [0, 1, 2, 3, 4, 5, 5]
    assert f.logger.rows[2][1] == {"loss/total": 2.0, "eval/accuracy": 0.2}  # one row: step + its evaluation
    assert out["eval_start"] == {"eval/accuracy": 0.0} and out["eval_end"] == {"eval/accuracy": 0.5}
    assert out["last"] == {"loss/total": 5.0} and "checkpoint" not in out


def test_every_k_without_a_final_evaluation_still_evaluates_the_last_step():
    """Issue 36.5: eval.every=2, eval.at_end=false over 5 steps evaluated after steps 2 and 4 only: the curve lacked
    its last point. Now the last step is evaluated too (merged into its row), whether or not it is a multiple of k."""
    f = Fake()
    run(f, 5, last=5, evaluation=EvalSchedule(f.evaluate, every=2, at_end=False))
    assert [e for e in f.events if e[0] == "eval"] == [("eval", 2), ("eval", 4), ("eval", 5)]
    assert f.logger.rows[-1] == (5, {"loss/total": 5.0, "eval/accuracy": 0.5})  # one row: the step + its evaluation
    f = Fake()
    run(f, 4, last=4, evaluation=EvalSchedule(f.evaluate, every=2, at_end=False))  # a multiple of k: once, not twice
    assert [e for e in f.events if e[0] == "eval"] == [("eval", 2), ("eval", 4)]
    f = Fake()  # an iterable of unknown length (SFT's recipe): the last step is evaluated after the loop
    run(f, iter(range(3)), evaluation=EvalSchedule(f.evaluate, every=2, at_end=False))
    assert [e for e in f.events if e[0] == "eval"] == [("eval", 2), ("eval", 3)]
    assert f.logger.rows[-1] == (3, {"eval/accuracy": 0.3})
    f = Fake()  # a caller that scores the last step itself (the continual task boundary) opts out
    run(f, 5, last=5, evaluation=EvalSchedule(f.evaluate, every=2, at_end=False, at_last=False))
    assert [e for e in f.events if e[0] == "eval"] == [("eval", 2), ("eval", 4)]


def test_schedules_count_from_origin():
    """The continual trainer's tasks: the schedule counts the task's own steps (global counter 10 -> n = 1, ...)."""
    f = Fake(start=10)
    run(f, 4, last=4, origin=10, evaluation=EvalSchedule(f.evaluate, every=2, at_last=False),  # the boundary scores
        checkpoints=CheckpointSchedule(f.save, every=3))
    assert f.events == [("step", 11), ("step", 12), ("eval", 12), ("step", 13), ("save", 13), ("step", 14)]


def test_checkpoint_every_k_and_final_unless_the_last_step_was_just_saved():
    f = Fake()
    out = run(f, 5, last=5, checkpoints=CheckpointSchedule(f.save, every=2, at_end=True))
    assert [e for e in f.events if e[0] == "save"] == [("save", 2), ("save", 4), ("save", 5)]
    assert out["checkpoint"] == "ck/step_000005"
    f = Fake()
    out = run(f, 4, last=4, checkpoints=CheckpointSchedule(f.save, every=2, at_end=True))
    assert [e for e in f.events if e[0] == "save"] == [("save", 2), ("save", 4)] and out["checkpoint"].endswith("4")


def test_final_checkpoint_is_after_the_final_evaluation_and_on_end_before_it():
    f = Fake()
    out = run(f, 1, last=1, evaluation=EvalSchedule(f.evaluate, at_end=True),
              checkpoints=CheckpointSchedule(f.save, at_end=True), on_end=lambda: f.events.append("end") or {"x": 1},
              learning_curve=lambda: f.events.append("curve") or "lc.png")
    assert f.events == [("step", 1), "end", ("eval", 1), ("save", 1), "curve"]
    assert out["x"] == 1 and out["learning_curve"] == "lc.png"


def test_a_failing_final_evaluation_comes_after_on_end():
    f = Fake()

    def dies():
        raise RuntimeError("eval cut")

    with pytest.raises(RuntimeError, match="eval cut"):
        run(f, 2, evaluation=EvalSchedule(dies, at_end=True), on_end=lambda: f.events.append("end"))
    assert f.events[-1] == "end"


def test_first_signal_finishes_logs_and_saves_the_step():
    f = Fake(signal_at=2)
    with pytest.raises(TrainingInterrupted) as ei:
        run(f, 50, last=50, evaluation=EvalSchedule(f.evaluate, every=2),
            checkpoints=CheckpointSchedule(f.save, every=0, at_end=True))
    assert not ei.value.mid_step
    # step 2 ran to its end (its evaluation and its row too), then the last completed step was saved once
    assert f.events == [("step", 1), ("step", 2), ("eval", 2), ("save", 2)]
    assert [s for s, _ in f.logger.rows] == [1, 2]


def test_an_interrupt_already_on_disk_is_not_saved_again():
    f = Fake(signal_at=2)
    with pytest.raises(TrainingInterrupted):
        run(f, 50, checkpoints=CheckpointSchedule(f.save, every=2))  # step 2 saved by the schedule
    assert [e for e in f.events if e[0] == "save"] == [("save", 2)]
    f = Fake(signal_at=2)
    with pytest.raises(TrainingInterrupted):
        run(f, 50, checkpoints=CheckpointSchedule(f.save, exists=lambda: True))  # a previous run's checkpoint
    assert [e for e in f.events if e[0] == "save"] == []
    f = Fake(signal_at=2)
    with pytest.raises(TrainingInterrupted):
        run(f, 50, checkpoints=CheckpointSchedule(f.save, on_interrupt=False))  # checkpoint.on_interrupt=false
    assert [e for e in f.events if e[0] == "save"] == []


def test_second_signal_abandons_the_step_unsaved(caplog):
    f = Fake(signal_at=2, signals=2)  # the second signal lands before the counter moves: weights may be half-updated
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingInterrupted) as ei:
        run(f, 50, checkpoints=CheckpointSchedule(f.save))
    assert ei.value.mid_step and f.step == 1 and f.events == [("step", 1)]
    assert "step 2 abandoned, not saved" in caplog.text


def test_mid_step_after_the_counter_moved_is_a_completed_step_and_saved():
    """A second signal after the step's last write (the counter) but before its logging: the state is consistent."""
    f = Fake()

    def step(_):
        f.train_step()
        if f.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return {}

    with pytest.raises(TrainingInterrupted) as ei:
        run_loop(step, 50, position=lambda: f.step, logger=f.logger, checkpoints=CheckpointSchedule(f.save))
    assert ei.value.mid_step and f.events[-1] == ("save", 2)


def test_a_signal_before_any_step_saves_nothing_and_a_custom_handler_replaces_the_save():
    f = Fake()

    def eval_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)  # outside a step: raised at once
        time.sleep(1)
        raise AssertionError("not reached")

    with pytest.raises(TrainingInterrupted):
        run(f, 5, evaluation=EvalSchedule(eval_interrupted, at_start=True), checkpoints=CheckpointSchedule(f.save))
    assert f.events == []
    seen = []
    f = Fake(signal_at=3)
    with pytest.raises(TrainingInterrupted):
        run(f, 5, checkpoints=CheckpointSchedule(f.save), on_interrupt=lambda e, completed: seen.append(completed))
    assert seen == [True] and not any(e[0] == "save" for e in f.events)


def test_eta_is_logged_once_after_the_first_step_on_a_fake_clock(monkeypatch, caplog):
    """25 s first evaluation, 10 s per step, 4 steps: after step 1, 3 steps + the final evaluation = 55 s."""
    class Clock:
        t = 0.0

        def perf_counter(self):
            return self.t

    clock = Clock()
    monkeypatch.setattr(loop_mod, "time", clock)
    f = Fake()
    real_step, real_eval = f.train_step, f.evaluate

    def step(_):
        clock.t += 10
        return real_step()

    def evaluate():
        clock.t += 25
        return real_eval()

    with caplog.at_level(logging.INFO, logger="torchrl_grpo.training.loop"):
        run_loop(step, 4, position=lambda: f.step, logger=f.logger, last=4,
                 evaluation=EvalSchedule(evaluate, at_start=True, at_end=True), progress=Progress("t", enabled=False))
    eta = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ETA:")]
    assert eta == ["ETA: about 55 s to the end of the run (3 steps to go at 10 s/step + final evaluation ~25 s)"]


def test_items_of_an_iterable_are_passed_to_the_step_and_an_unknown_length_has_no_eta(caplog):
    f = Fake()
    got = []

    def work():
        for x in ("a", "b", "c"):
            yield x

    def step(item):
        got.append(item)
        return f.train_step()

    with caplog.at_level(logging.INFO, logger="torchrl_grpo.training.loop"):
        out = run_loop(step, work(), position=lambda: f.step, logger=f.logger, progress=Progress("sft", False))
    assert got == ["a", "b", "c"] and out["last"] == {"loss/total": 3.0}
    assert not any(r.getMessage().startswith("ETA:") for r in caplog.records)
