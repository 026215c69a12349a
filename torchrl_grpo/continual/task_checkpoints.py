"""A continual run's task checkpoints: what ``checkpoint_task_{k}/`` (and ``checkpoint_task_{k}_interrupted/``) hold,
and reading them back.

Layout of one checkpoint directory (:func:`save_task_checkpoint`):

=====================  ======================================================================================
``step_<n>/``          the trainer checkpoint (:func:`torchrl_grpo.training.checkpoint.save_checkpoint`: model or LoRA
                       adapter, tokenizer, optimizer, schedule, RNG, resolved config; ``extra``: ``optimizer_steps``,
                       ``cl_task``)
``trajectories.jsonl`` the trajectory buffer (:class:`torchrl_grpo.continual.trajectory_buffer.TrajectoryBuffer`)
``config.yaml``        the resolved run config
``cl_algorithm.pt``    every hook's :meth:`~torchrl_grpo.continual.algorithms.CLAlgorithm.state_dict`, by hook name
``cl_state.json``      ``task_order``, ``task`` (k), ``domain``, ``joint``, ``step``, ``algorithm``, ``task_step`` (steps
                       done in task k), ``task_done`` (its boundary is done) and ``metrics`` (the run's metrics so far)
=====================  ======================================================================================

Files are written to a ``.tmp`` name and renamed, so a reader never sees half a file.

Resuming (``cl.resume_from``, checked by :func:`read_resume_state` before any model loads; it must come from a run
with the same task order): from ``checkpoint_task_{k}`` the run continues with domain k+1. On SIGINT / SIGTERM
(:mod:`torchrl_grpo.training.interrupt`) a step, with its logging and any scoring after it, and a task boundary
(post-task hook, scoring, ``checkpoint_task_{k}/``) each run to their end; then the run stops, and when a step
finished after the last task checkpoint, ``checkpoint_task_{k}_interrupted/`` (same layout; ``task_step`` = steps done
in task k, ``task_done`` false) is written (``checkpoint.on_interrupt``) and the exception re-raised. Resuming from it
continues with step ``task_step + 1`` of task k: the same next step as the uninterrupted run (weights, optimizer,
schedule, RNG, buffer, algorithm state and the metrics so far are restored; the step's task and sampling seeds derive
from the step number). A second signal abandons the step in flight (nothing is saved) when it lands before the step's
last write; after it (during the step's scoring or logging) the step is complete and saved: the loop shell's rule,
the same as sync GRPO's (:func:`torchrl_grpo.training.loop.run_loop`).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer
from torchrl_grpo.training.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["CL_STATE_JSON", "CL_ALGORITHM_PT", "TRAJECTORIES_JSONL", "read_resume_state", "save_task_checkpoint",
           "load_task_checkpoint", "TaskCheckpoints", "write_json", "json_default"]

_log = logging.getLogger(__name__)

CL_STATE_JSON = "cl_state.json"
CL_ALGORITHM_PT = "cl_algorithm.pt"
TRAJECTORIES_JSONL = "trajectories.jsonl"


def read_resume_state(path: str | Path, task_order: Sequence[str]) -> dict:
    """The ``cl_state.json`` of the checkpoint ``path`` (``cl.resume_from``), checked against this run's
    ``task_order`` before any model loads; ``path`` added under ``"path"``.

    The state of a finished task (``checkpoint_task_{k}``) continues with task k+1; an interrupted one
    (``task_done`` false) with step ``task_step + 1`` of task k. States written before ``task_done`` existed are
    finished tasks.

    Raises:
        FileNotFoundError: no ``cl_state.json`` there.
        ValueError: it comes from another task order or a joint run, or its run had already finished every task.
    """
    path = Path(path)
    f = path / CL_STATE_JSON
    if not f.is_file():
        raise FileNotFoundError(f"cl.resume_from={path}: no {CL_STATE_JSON} (expected a checkpoint_task_<k> dir)")
    state = json.loads(f.read_text())
    order = list(task_order)
    if list(state["task_order"]) != order:
        raise ValueError(f"cl.resume_from={path} was trained with cl.task_order={state['task_order']}, this run has "
                         f"{order}: resume needs the same order")
    if state.get("joint"):
        raise ValueError(f"cl.resume_from={path} is a joint run: there is no next domain to continue with")
    state.setdefault("task_done", True)
    if state["task_done"] and int(state["task"]) >= len(order) - 1:
        raise ValueError(f"cl.resume_from={path} finished the last task ({order[-1]}); nothing left to train")
    state["path"] = str(path)
    return state


def save_task_checkpoint(root: Path, trainer, *, buffer: TrajectoryBuffer, hooks: Sequence, state: dict[str, Any],
                         config_yaml: str) -> Path:
    """Write one task checkpoint (module docstring) of ``trainer`` (a
    :class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer`) into ``root``; ``state`` is ``cl_state.json``'s
    content, ``hooks`` the run's :class:`~torchrl_grpo.continual.algorithms.CLAlgorithm` s. Keeps one ``step_<n>/``.
    Returns ``root``."""
    t = trainer
    save_checkpoint(root, t.step, model=t.model, tokenizer=t.tokenizer, optimizer=t.optimizer,
                    scheduler=t.scheduler, config_yaml=config_yaml, keep_last=1,
                    extra={"optimizer_steps": t.optimizer_steps, "cl_task": state["task"]})
    buffer.save(root / TRAJECTORIES_JSONL)
    (root / "config.yaml").write_text(config_yaml)
    tmp = root / (CL_ALGORITHM_PT + ".tmp")
    torch.save({h.name: h.state_dict() for h in hooks}, tmp)
    tmp.replace(root / CL_ALGORITHM_PT)
    write_json(root / CL_STATE_JSON, state)
    return root


def load_task_checkpoint(path: Path, trainer, hooks: Sequence) -> tuple[dict, dict]:
    """Restore a task checkpoint into ``trainer`` and ``hooks``: the algorithms' state first (it may add structure
    the weights and optimizer state load into: adapters, optimizer parameters), then weights, optimizer, schedule
    and RNG, the step and optimizer-step counters, and the rollout backend synced to the weights.

    Returns:
        ``(checkpoint, algorithm_state)``: :func:`~torchrl_grpo.training.checkpoint.load_checkpoint`'s dict and the
        saved ``cl_algorithm.pt`` by hook name (``{}`` for a checkpoint without one).

    Raises:
        FileNotFoundError: no trainer checkpoint in ``path``.
        ValueError: a hook's saved state does not fit (its :meth:`load_state_dict`).
    """
    t = trainer
    algo_file = path / CL_ALGORITHM_PT
    algo_state = torch.load(algo_file, weights_only=False) if algo_file.is_file() else {}
    for h in hooks:
        if h.name in algo_state:
            h.load_state_dict(t, algo_state[h.name])
    ck = load_checkpoint(path, model=t.model, optimizer=t.optimizer, scheduler=t.scheduler)
    t.step = int(ck["step"])
    t.updater.optimizer_steps = int(ck.get("extra", {}).get("optimizer_steps", 0))
    t.backend.sync_from(t.model)
    return ck, algo_state


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically (a tensor or numpy scalar as its number: :func:`json_default`)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=json_default))
    tmp.replace(path)


def json_default(v):
    """JSON for what ``json`` cannot write: a tensor / numpy scalar -> its number, anything else -> ``str``."""
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return str(v)


class TaskCheckpoints:
    """The task checkpoints of one continual run: where the run stands (:attr:`progress`), what its newest checkpoint
    holds (:attr:`saved`), saving (:meth:`save`, :meth:`on_interrupt`) and resuming (:meth:`resume`).

    Args:
        run: the :class:`~torchrl_grpo.continual.trainer.ContinualTrainer`; read at each call: ``trainer``,
            ``buffer``, ``hooks``, ``metrics``, ``domains``, ``joint``, ``algorithm``, ``settings`` (``config_yaml``,
            ``save_checkpoints``, ``num_steps_per_task``, ``buffer_size``) and ``run_dir``.

    Attributes:
        progress: ``(task, steps done in it, boundary done)`` of this run, or None before its first step.
        saved: the progress the newest checkpoint holds, or None.
    """

    def __init__(self, run) -> None:
        self.run = run
        self.progress: tuple[int, int, bool] | None = None
        self.saved: tuple[int, int, bool] | None = None

    def save(self, k: int, *, task_step: int | None = None, done: bool = True, name: str | None = None) -> Path:
        """``checkpoint_task_{k}/`` (or ``name``) in the run dir, with ``task_step`` (steps done in task k, default
        all) and ``task_done`` = ``done`` (its boundary is done). Returns the directory."""
        r = self.run
        state = {"task_order": r.domains, "task": k, "domain": "joint" if r.joint else r.domains[k],
                 "joint": r.joint, "step": r.trainer.step, "algorithm": r.algorithm.name,
                 "task_step": r.settings.num_steps_per_task if task_step is None else int(task_step),
                 "task_done": done, "metrics": r.metrics}
        root = save_task_checkpoint(r.run_dir / (name or f"checkpoint_task_{k}"), r.trainer, buffer=r.buffer,
                                    hooks=r.hooks, state=state, config_yaml=r.settings.config_yaml)
        self.saved = (k, state["task_step"], done)
        return root

    def on_interrupt(self, e, completed: bool | None = None) -> Path | None:
        """After a :class:`~torchrl_grpo.training.interrupt.TrainingInterrupted` ``e``: save
        ``checkpoint_task_{k}_interrupted/`` when a step finished after the newest checkpoint and the state is that
        of a completed step (not in a joint run, only with the trainer's ``checkpoint_on_interrupt``); the caller
        writes the metrics. Returns the directory, or None when nothing was saved (the reason is logged).

        ``completed``: the loop shell's verdict (:func:`~torchrl_grpo.training.loop.run_loop`, the rule sync GRPO
        follows too: a second signal after the step's last write, e.g. during its scoring or logging, leaves a
        completed step, saved; one before it abandons the step). None (a signal outside the steps, e.g. at a task
        boundary): completed unless it was a second signal (``e.mid_step``)."""
        r, p = self.run, self.progress
        if completed is None:
            completed = not e.mid_step
        if not completed:
            _log.warning("%s: the step in flight is abandoned, not saved", e)
        elif p is None or p == self.saved or (p[2] and r.settings.save_checkpoints):
            _log.warning("%s: nothing to save since the last checkpoint", e)
        elif r.joint:
            _log.warning("%s: a joint run cannot be resumed mid-way; not saved", e)
        elif r.trainer.settings.checkpoint_on_interrupt:
            root = self.save(p[0], task_step=p[1], done=p[2], name=f"checkpoint_task_{p[0]}_interrupted")
            _log.warning("%s: saved task %d after %d of its steps (step %d) to %s; continue with cl.resume_from=%s",
                         e, p[0], p[1], r.trainer.step, root, root)
            return root
        return None

    def resume(self, state: dict) -> tuple[int, int]:
        """Restore the run from the checked ``state`` (:func:`read_resume_state`): trainer and algorithm state
        (:func:`load_task_checkpoint`), the run dir's logs cut to the checkpoint's step
        (:meth:`~torchrl_grpo.reporting.stats_logger.StatsLogger.rewind`), the metrics so far, the trajectory
        buffer, and a KL anchor that a checkpoint without algorithm state lacks (the loaded weights). Returns ``(task, step in it)`` to continue with: the next
        task from 0 after a finished one, else the interrupted task after its ``task_step`` steps."""
        r, path = self.run, Path(state["path"])
        t = r.trainer
        ck, algo_state = load_task_checkpoint(path, t, r.hooks)
        t.logger.rewind(t.step)  # resumed into the same run dir: its logs continue from the checkpoint's step
        r.metrics = state["metrics"]
        if (path / TRAJECTORIES_JSONL).is_file():
            r.buffer = TrajectoryBuffer.load(path / TRAJECTORIES_JSONL, r.settings.buffer_size)
        k, done = int(state["task"]), bool(state["task_done"])
        start = (k + 1, 0) if done else (k, int(state["task_step"]))
        for h in r.hooks:
            if h.name not in algo_state:  # a checkpoint without this hook's state (KL anchor: the loaded weights)
                h.on_resume_without_state(t, r.domains[k], done)
        self.progress = self.saved = (k, int(state["task_step"]), done)
        _log.info("resumed from %s: task %d (%s) %s at step %d; next: %s step %d", ck["path"], k, r.domains[k],
                  "done" if done else f"interrupted after {state['task_step']} steps", t.step, r.domains[start[0]],
                  start[1] + 1)
        return start
