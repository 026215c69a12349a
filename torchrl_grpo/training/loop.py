"""The loop shell every trainer runs on (GRPO sync and async, SFT, continual): :func:`run_loop`.

A trainer supplies what one step *is* (a callable returning the step's metrics) and the step counter it advances;
the shell does the rest, once, for every trainer:

- signals (:mod:`torchrl_grpo.training.interrupt`): the whole run under :func:`handle_signals`, each step (with
  the evaluation, logging and checkpoint after it) under :func:`finish_step`;
- evaluation on a schedule (:class:`EvalSchedule`): at the start, every ``k`` steps, at the end; the curve always
  ends at the last step: with a final evaluation (``at_end``) the ``every`` one is skipped after the last step, without
  one the last step is evaluated by the ``every`` schedule whether or not it is a multiple of ``k`` (unless the caller
  scores it itself: ``at_last=False``); an evaluation after a step is merged into that step's logged metrics;
- one ``logger.log(metrics, step=position())`` per step;
- a progress bar (tqdm) with the run's ETA (:func:`run_eta_s`), logged once after the first step;
- checkpoints on a schedule (:class:`CheckpointSchedule`): every ``k`` steps, at the end (after the final
  evaluation, unless this run just saved that step), and on interrupt (below);
- at the end, after every step and evaluation: the learning curve (a callable).

Interrupts (as :meth:`GRPOTrainer.fit` has always done; :mod:`torchrl_grpo.training.interrupt`): a first signal
inside a step lets it finish (evaluation, log, periodic checkpoint), then :class:`TrainingInterrupted` is raised
with ``mid_step=False``; a second one raises at once with ``mid_step=True``. On either, the shell closes the bar and
then, by default: the state is *completed* when the exception is not mid-step or the step counter moved during the
step that was running (its last write); a completed state newer than the loop's start and not on disk yet
(``CheckpointSchedule.exists``) is saved when ``CheckpointSchedule.on_interrupt``; an abandoned step is logged,
never saved. A caller with its own interrupt checkpoint (the continual trainer's ``checkpoint_task_{k}_interrupted``)
passes ``on_interrupt(exc, completed)`` instead. The exception is always re-raised.

Usage (the continual trainer, one task's steps; ``t`` a :class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer`,
``done`` steps of task ``k`` already taken before a resume)::

    def score_all() -> dict:                        # logs its own rows; returns {} (nothing merged into the step's)
        self._evaluate_all(f"task_{k}/eval")
        return {}

    run_loop(lambda _: self._step(k, domain), n - done, position=lambda: t.step, logger=t.logger,
             origin=t.step - done, last=n,             # the schedule counts this task's steps 1..n
             evaluation=EvalSchedule(score_all, every=eval_interval),
             on_interrupt=lambda e, completed: None,  # ContinualTrainer.train saves checkpoint_task_{k}_interrupted
             progress=Progress(f"task {k}: {domain}", t.settings.progress_bar), log=log)

and the sync GRPO trainer's whole run is ``run_loop(lambda _: self.train_step(), steps - self.step,
position=lambda: self.step, last=steps, ...)`` (:meth:`GRPOTrainer.fit`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from torchrl_grpo.reporting.learning_curve import plot_learning_curve
from torchrl_grpo.training.interrupt import TrainingInterrupted, finish_step, handle_signals

__all__ = ["run_loop", "EvalSchedule", "CheckpointSchedule", "Progress", "run_eta_s", "draw_learning_curve"]

_log = logging.getLogger(__name__)


def run_eta_s(step_s: float, steps_left: int, eval_s: float | None, eval_at_end: bool) -> float:
    """Seconds to the end of the run: ``steps_left`` steps at the mean ``step_s`` seen so far, plus one final
    evaluation as long as the first one took (``eval_s``; not counted when unknown or no final evaluation)."""
    return max(0, steps_left) * step_s + (eval_s or 0.0) * bool(eval_at_end)


def minutes(seconds: float) -> str:
    """``"2.5 min"`` from 60 s on, else ``"42 s"``."""
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


@dataclass
class EvalSchedule:
    """When :func:`run_loop` evaluates: ``evaluate()`` returns metrics (``{}`` allowed) at the start (logged at the
    current position), after every ``every``-th step (merged into the step's metrics; 0: never), and at the end
    (``at_end``: after ``on_end``, logged at the final position).

    The curve ends at the last step: with ``at_end`` the ``every`` evaluation is skipped after the last step (the
    final one follows); without it, and ``every > 0``, the last step is evaluated as part of the ``every`` schedule
    even when it is not a multiple of ``every`` (merged into its row when :func:`run_loop` knows ``last``; else after
    the loop, logged at the final position, unless the loop's last step was just evaluated). ``at_last=False``: not
    that one (a caller that scores the last step itself, e.g. the continual trainer's task boundary)."""

    evaluate: Callable[[], dict[str, Any]]
    at_start: bool = False
    every: int = 0
    at_end: bool = False
    at_last: bool = True


@dataclass
class CheckpointSchedule:
    """When :func:`run_loop` saves: ``save()`` (returns the checkpoint path) after every ``every``-th step (0:
    never), at the end (``at_end``) unless this run's last save was of the final step, and on an interrupt
    (``on_interrupt``) when the state is a completed step newer than the loop's start that ``exists()`` says is not
    on disk yet (default: this run has not saved the current position)."""

    save: Callable[[], Path | str]
    every: int = 0
    at_end: bool = False
    on_interrupt: bool = True
    exists: Callable[[], bool] | None = None


@dataclass
class Progress:
    """The progress bar: ``desc``, shown when ``enabled``; ``postfix`` names the float metrics shown beside the run
    ETA."""

    desc: str
    enabled: bool = True
    postfix: tuple[str, ...] = ("reward/mean", "loss/total", "ess")


def run_loop(step: Callable[[Any], dict[str, Any]], steps: int | Iterable[Any], *, position: Callable[[], int],
             logger, origin: int = 0, last: int | None = None, evaluation: EvalSchedule | None = None,
             checkpoints: CheckpointSchedule | None = None,
             on_interrupt: Callable[[TrainingInterrupted, bool], None] | None = None,
             on_end: Callable[[], dict[str, Any] | None] | None = None, progress: Progress | None = None,
             learning_curve: Callable[[], str | None] | None = None, summary: dict[str, Any] | None = None,
             log: logging.Logger | None = None) -> dict[str, Any]:
    """Run ``step(item)`` for each item of ``steps`` inside the shell (module docstring).

    Args:
        step: one training step; returns its metrics (a dict, logged). It advances the trainer's step counter.
        steps: a count ``n`` (items ``0..n-1``) or an iterable of items (e.g. a generator of minibatches; work done
            inside ``next()`` runs between steps, outside :func:`finish_step`).
        position: the trainer's step counter: logging x axis, checkpoint names, the schedules' count.
        logger: has ``log(metrics, step=)`` (:class:`torchrl_grpo.reporting.StatsLogger`).
        origin: the schedules count ``n = position() - origin`` (default: the counter itself; the continual trainer
            counts each task's steps from 1).
        last: ``n`` of the final step, when known: ETA and the bar's total, and where the ``every`` evaluation
            either gives way to the final one or closes the curve (:class:`EvalSchedule`).
        evaluation / checkpoints: the schedules (None: none).
        on_interrupt: ``(exc, completed) -> None`` replacing the default interrupt save (module docstring).
        on_end: run after the last step, before the final evaluation (e.g. SFT writes its model there, so a failed
            evaluation keeps the training); a returned dict is merged into the summary.
        progress: the bar (None: no bar). learning_curve: drawn at the end; its result is ``summary["learning_curve"]``.
        summary: a dict to fill (default a new one). log: where the ETA line goes (default this module's logger).

    Returns:
        ``summary`` with ``eval_start`` / ``eval_end`` (when run), ``checkpoint`` (the newest path saved),
        ``last`` (the last step's metrics, with any evaluation after it) and ``learning_curve`` (when given).

    Raises:
        TrainingInterrupted: on SIGINT / SIGTERM, after the interrupt handling (module docstring).
        Anything ``step``, ``evaluate``, ``save`` or ``on_end`` raise, unchanged (the bar closed).
    """
    run = _Run(step, position=position, logger=logger, origin=origin, last=last, evaluation=evaluation,
               checkpoints=checkpoints, progress=progress, summary={} if summary is None else summary,
               log=log or _log)
    with handle_signals():
        try:
            run.begin()
            for item in range(steps) if isinstance(steps, int) else steps:
                run.one_step(item)
            run.end(on_end)
        except TrainingInterrupted as e:
            run.close_bar()
            run.interrupted(e, on_interrupt)
            raise
        finally:  # an error out of a step, an evaluation or the items: the bar is closed too
            run.close_bar()
    run.summary["last"] = run.last_metrics
    if learning_curve is not None:
        run.summary["learning_curve"] = learning_curve()
    return run.summary


class _Run:
    """The state of one :func:`run_loop` call and its named steps: :meth:`begin` (the first evaluation, the bar),
    :meth:`one_step` (a step, its ``every`` evaluation, its log row, progress, its periodic checkpoint), :meth:`end`
    (``on_end``, the final evaluation and checkpoint) and :meth:`interrupted` (the interrupt rule of the module
    docstring). Private: :func:`run_loop` is the interface."""

    def __init__(self, step: Callable[[Any], dict[str, Any]], *, position: Callable[[], int], logger, origin: int,
                 last: int | None, evaluation: EvalSchedule | None, checkpoints: CheckpointSchedule | None,
                 progress: Progress | None, summary: dict[str, Any], log: logging.Logger) -> None:
        self.step, self.position, self.logger, self.origin, self.last = step, position, logger, origin, last
        self.ev, self.ck, self.progress, self.summary, self.log = evaluation, checkpoints, progress, summary, log
        self.last_metrics: dict[str, Any] = {}
        self.saved_at: list[int] = []  # positions this run saved
        self.start = self.began = position()  # the loop's start; the position before the step in flight
        self.bar = None
        self.eval_s: float | None = None  # wall seconds of the first evaluation, for the ETA
        self.final_eval = evaluation is not None and evaluation.at_end
        # no final evaluation: the `every` schedule evaluates the last step too (the curve ends there)
        self.close_curve = (evaluation is not None and bool(evaluation.every) and not evaluation.at_end
                            and evaluation.at_last)
        self.evaluated_at: int | None = None  # position of the newest `every` evaluation
        self.t_loop, self.done = 0.0, 0  # when the steps began; steps done

    def begin(self) -> None:
        """The evaluation at the start (timed for the ETA, logged at the current position), then the bar."""
        if self.ev is not None and self.ev.at_start:
            t_eval = time.perf_counter()
            self.summary["eval_start"] = m = self.ev.evaluate()
            self.eval_s = time.perf_counter() - t_eval
            self.logger.log(m, step=self.position())
        if self.progress is not None:
            self.bar = tqdm(total=self.last, initial=self.start - self.origin if self.last is not None else 0,
                            desc=self.progress.desc, disable=not self.progress.enabled)
        self.t_loop = time.perf_counter()

    def one_step(self, item: Any) -> None:
        """One step under :func:`finish_step`: the step, its ``every`` evaluation (merged into its row), its log row,
        the ETA and bar, its periodic checkpoint."""
        self.began = self.position()
        with finish_step():  # a signal in here lets the step finish (evaluation, log, checkpoint) first
            self.last_metrics = self.step(item)
            n = self.position() - self.origin
            if self._evaluates_after(n):
                self.last_metrics.update(self.ev.evaluate())
                self.evaluated_at = self.position()
            self.logger.log(self.last_metrics, step=self.position())
            self.done += 1
            self._show_progress(n)
            if self.ck is not None and self.ck.every and n % self.ck.every == 0:
                self._save()

    def _evaluates_after(self, n: int) -> bool:
        """Whether the ``every`` schedule evaluates after the ``n``-th step (:class:`EvalSchedule`)."""
        ev = self.ev
        if ev is None or not ev.every:
            return False
        return self.close_curve if self.last is not None and n == self.last else n % ev.every == 0

    def _show_progress(self, n: int) -> None:
        """The ETA line (once, after the first step) and the bar's step and postfix."""
        step_s = (time.perf_counter() - self.t_loop) / self.done
        last, eval_s = self.last, self.eval_s
        eta = run_eta_s(step_s, last - n, eval_s, self.final_eval) if last is not None else None
        if self.done == 1 and eta is not None:
            self.log.info("ETA: about %s to the end of the run (%d steps to go at %.0f s/step%s)", minutes(eta),
                          last - n, step_s, f" + final evaluation ~{eval_s:.0f} s" if eval_s and self.final_eval
                          else "")
        if self.bar is not None:
            self.bar.update(1)
            m = self.last_metrics
            post = {k: f"{m[k]:.3g}" for k in self.progress.postfix if isinstance(m.get(k), float)}
            self.bar.set_postfix({**post, **({"run ETA": minutes(eta)} if eta is not None else {})})

    def _save(self) -> None:
        self.summary["checkpoint"] = str(self.ck.save())
        self.saved_at.append(self.position())

    def _evaluate_end(self) -> None:
        self.summary["eval_end"] = m = self.ev.evaluate()
        self.logger.log(m, step=self.position())

    def end(self, on_end: Callable[[], dict[str, Any] | None] | None) -> None:
        """After the last step: the bar closed, ``on_end``, the final evaluation (or the curve's closing one after
        an iterable's last step), the final checkpoint unless this run just saved the final position."""
        self.close_bar()
        if on_end is not None:
            self.summary.update(on_end() or {})
        if self.final_eval:
            self._evaluate_end()
        elif self.close_curve and self.done and self.evaluated_at != self.position():  # ``last`` unknown
            self._evaluate_end()
        if self.ck is not None and self.ck.at_end and (not self.saved_at or self.saved_at[-1] != self.position()):
            self._save()

    def interrupted(self, e: TrainingInterrupted,
                    on_interrupt: Callable[[TrainingInterrupted, bool], None] | None) -> None:
        """The interrupt rule (module docstring): the caller's ``on_interrupt``, else an abandoned step is logged
        and a completed one newer than the start and not on disk yet is saved (``CheckpointSchedule.on_interrupt``)."""
        pos, ck = self.position(), self.ck
        # consistent: raised between steps, or after the step returned (the counter is its last write)
        completed = not e.mid_step or pos > self.began
        if on_interrupt is not None:
            on_interrupt(e, completed)
        elif not completed:
            self.log.warning("%s: step %d abandoned, not saved", e, pos + 1)
        elif ck is not None and ck.on_interrupt and pos > self.start:
            on_disk = ck.exists() if ck.exists is not None else bool(self.saved_at) and self.saved_at[-1] == pos
            if not on_disk:
                self.log.warning("%s: saved the last completed step to %s", e, ck.save())

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def draw_learning_curve(logger, run_dir: Path, step: int, n_eval: int | None) -> str | None:
    """``learning_curve.png`` in ``run_dir`` from ``logger.path`` (metrics.jsonl), also sent as an image
    (:mod:`torchrl_grpo.reporting.learning_curve`; ``n_eval``: the evaluation's task count, for its intervals).
    A failure to draw is logged, never raised: the run itself is done. Returns the PNG path or None."""
    try:
        png = plot_learning_curve(logger.path, Path(run_dir) / "learning_curve.png", n_eval=n_eval)
    except Exception as exc:  # noqa: BLE001
        _log.warning("learning curve not drawn: %s", exc)
        return None
    if png is not None:
        logger.log_images({"learning_curve": png}, step=step)
    return None if png is None else str(png)
