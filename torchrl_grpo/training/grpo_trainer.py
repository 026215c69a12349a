"""The synchronous GRPO training loop.

One step: collect ``batch_size`` tasks × ``n_samples`` episodes (a group each) with the rollout backend →
group-relative advantages → drop groups with an infrastructure failure (and, if set, zero reward variance) →
the update (:mod:`torchrl_grpo.training.update`) → sync the backend (``collector.update_policy_weights_``). Logging,
evaluation (:class:`~torchrl_grpo.training.evaluator.Evaluator`), checkpoints on schedule, interrupts, progress and
ETA are the loop shell's (:func:`torchrl_grpo.training.loop.run_loop`), shared with the SFT and continual trainers.
The objects it runs (:class:`~torchrl_grpo.training.components.Components`) come from
:func:`torchrl_grpo.assembly.build`, which :func:`torchrl_grpo.assembly.build_trainer` hands to the trainer class; the loop
reads no config.

Everything random is derived from ``seed`` and the step number (task order, sampling seeds), and the
checkpoint stores model, optimizer, scheduler and RNG states, so ``train.resume_from`` continues exactly.
"""
from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from torchrl_grpo.distributed.data_parallel import SINGLE, full_state_dicts, is_fsdp
from torchrl_grpo.distributed.placement import Placement
from torchrl_grpo.objectives.advantage import group_advantages, group_reward_std
from torchrl_grpo.reporting.flops import update_peak_flops
from torchrl_grpo.rollout.episode_stats import LengthGuard, episode_metrics, sample_rows
from torchrl_grpo.training.checkpoint import save_checkpoint, save_final_model
from torchrl_grpo.training.components import Components
from torchrl_grpo.training.evaluator import Evaluator
from torchrl_grpo.training.loop import CheckpointSchedule, EvalSchedule, Progress, draw_learning_curve, run_loop
from torchrl_grpo.training.loop import run_eta_s  # noqa: F401  (its home before the loop shell; one release)

if TYPE_CHECKING:  # the trainer does not import the env side's constructors (tests/test_build.py)
    from torchrl_grpo.rollout.env_side import EnvSide

__all__ = ["GRPOTrainer"]

log = logging.getLogger(__name__)
_NO_PLACEMENT = Placement(torch.device("cpu"), torch.device("cpu"), torch.device("cpu"))  # components built elsewhere


class _FromComponents:
    """A read-only trainer attribute that is ``trainer.components.<path>``: the components own the object, the trainer
    keeps no copy of it (a public name kept for callers and tests: ``trainer.model``, ``trainer.collector``, ...).
    Assigning it raises: replace the components' field instead (``trainer.components.update = ...``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.__doc__ = f"``components.{path}`` (read-only)."

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        out = obj.components
        for part in self.path.split("."):
            out = getattr(out, part)
        return out

    def __set__(self, obj, value) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is components.{self.path} (its one owner): set "
                             f"trainer.components.{self.path} instead")


class GRPOTrainer:
    """Sync GRPO trainer on built components.

    ``GRPOTrainer(components)`` runs components built elsewhere; from a :class:`torchrl_grpo.config.GRPOConfig`,
    :func:`torchrl_grpo.assembly.build_trainer` ``(cfg, run_dir, model=..., tokenizer=..., backend=...)`` builds them
    (:func:`torchrl_grpo.assembly.build`, with this class's :attr:`own_backend_copy`) and returns the trainer.

    The trainer owns its step counter (``step``), its :class:`~torchrl_grpo.training.evaluator.Evaluator` and
    ``augment_batch``; everything else is read from ``components`` at each use (``model``, ``collector``, ``updater``,
    ... are read-only views of it; the env side's collectors and tasks through ``components.env_side``), so
    :meth:`use_env` switches every reader at once.

    Args:
        components: the built :class:`~torchrl_grpo.training.components.Components`.

    Attributes:
        cfg: None, or the config :func:`torchrl_grpo.assembly.build_trainer` built it from (set there, for callers;
            never read here: ``settings`` are the plain values the trainer reads).

    Raises:
        TypeError: ``components`` is not a :class:`~torchrl_grpo.training.components.Components` (e.g. the config of
            the old ``GRPOTrainer(cfg, run_dir, ...)`` call, which :func:`torchrl_grpo.assembly.build_trainer` replaces).
    """

    #: the rollout engine must not share the training module (the async trainer's): build() gives it its own copy
    own_backend_copy = False

    settings = _FromComponents("settings")
    run_dir = _FromComponents("run_dir")
    device = _FromComponents("device")
    model = _FromComponents("model")
    tokenizer = _FromComponents("tokenizer")
    backend = _FromComponents("backend")
    loss_fn = _FromComponents("loss_fn")
    optimizer = _FromComponents("optimizer")
    scheduler = _FromComponents("scheduler")
    updater = _FromComponents("update")
    logger = _FromComponents("logger")
    collector = _FromComponents("env_side.collector")
    eval_collector = _FromComponents("env_side.eval_collector")
    train_tasks = _FromComponents("env_side.train_tasks")

    def __init__(self, components: Components) -> None:
        if not isinstance(components, Components):
            raise TypeError(f"{type(self).__name__} takes built Components, got {type(components).__name__}: build "
                            f"a trainer from a config with torchrl_grpo.assembly.build_trainer(cfg, run_dir, "
                            f"trainer_cls={type(self).__name__}, model=..., tokenizer=..., backend=...)")
        self.components = components
        self.cfg = None  # build_trainer sets the config it built from, for callers; never read here
        self.step = components.start_step
        if self.step:  # resumed (train.resume_from): the logs continue from the checkpoint's step, rows after it cut
            self.logger.rewind(self.step)
        # a disjoint CPU plan (torchrl_grpo.distributed.placement): this thread trains on the train cores, collects on
        # the inference cores; a colocated plan pins nothing
        self.placement.pin_thread("train")
        self._length_guard = LengthGuard(self.settings.max_new_tokens)
        self.evaluator = Evaluator(components)  # rollouts, episode rows, table (training/evaluator.py)
        # optional callable(batch) -> batch run on each collected batch before advantages (continual replay)
        self.augment_batch = None
        self.matmul_peak_flops: float | None = None  # measured before the first update (_measure_matmul_peak)

    @property
    def dp(self):
        """Data parallel (:mod:`torchrl_grpo.distributed.data_parallel`): ``components.dp``, or one process
        (``SINGLE``) when None. Each rank trains its share; rank 0 writes."""
        return self.components.dp or SINGLE

    @property
    def placement(self) -> Placement:
        """``components.placement``, or a CPU placement that pins nothing when None (components built elsewhere)."""
        p = self.components.placement
        return p if p is not None else _NO_PLACEMENT

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps actually taken (logged as ``train/optimizer_steps_total``; restored on resume)."""
        return self.updater.optimizer_steps

    def tasks_for_step(self, step: int) -> list[dict]:
        """The task indices of ``step``: an epoch-wise permutation of the train tasks seeded by (seed, epoch)."""
        bs, n = self.settings.batch_size, len(self.train_tasks)
        out = []
        for k in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(k, n)
            perm = np.random.default_rng([self.settings.seed, epoch]).permutation(n)
            out.append({"index": self.train_tasks[int(perm[pos])]})
        return out

    def use_env(self, side: EnvSide) -> None:
        """Train and evaluate on another environment from now on: a :class:`torchrl_grpo.rollout.env_side.EnvSide` on
        this trainer's backend (one per domain in a continual run). It becomes ``components.env_side``, the one
        place every reader (collectors, train tasks, evaluator, :meth:`close`) looks it up."""
        self.components.env_side = side

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        """Run one GRPO step: the step's batch (:meth:`_next_batch`), ``augment_batch``, advantages and updates
        (:meth:`_learn`), the new weights to the rollout side (:meth:`_sync_policy`). Returns its metrics (numeric
        values averaged over torchrun ranks)."""
        t0 = time.perf_counter()
        batch, metrics, stale = self._next_batch()
        # the backend's decode path (a string: metrics.jsonl keeps it, wandb takes numbers only); the update adds the
        # gap it leaves between behaviour and recomputed log-probs, rollout/logp_diff_* (docs/metrics.md)
        metrics["rollout/decode"] = self.backend.decode_path
        if self.augment_batch is not None:
            batch = self.augment_batch(batch)
        metrics.update(self._learn(batch, stale=stale))
        t_sync = time.perf_counter()
        synced = self._sync_policy(batch)
        metrics["time/sync_s"] = time.perf_counter() - t_sync
        metrics.update(synced)
        metrics["time/step_s"] = time.perf_counter() - t0
        self.step += 1
        return self.dp.mean_metrics(metrics)  # numeric values averaged over ranks (as is on one process)

    def _next_batch(self) -> tuple[TensorDict, dict[str, Any], bool]:
        """This step's episodes, collected now with the current policy: (batch, the collector's stats, stale=False).
        Each rank collects whole groups of its share of the step's tasks."""
        tasks = self.dp.shard(self.tasks_for_step(self.step))  # whole groups per rank (all of them on one process)
        with self.placement.on_cores("inference"):
            batch = self.collector.collect(tasks, self.settings.n_samples, step=self.dp.collect_step(self.step))
        return batch, dict(self.collector.last_stats), False

    def _sync_policy(self, batch: TensorDict) -> dict[str, Any]:
        """The updated weights into the rollout backend; returns its sync stats and ``policy_version``."""
        row = batch[0]  # an episode the backend may score to check its sync (see RolloutBackend.sync_from)
        self.collector.update_policy_weights_(self.model, probe=row["tokens"][row["attention_mask"]].tolist())
        return {**self.backend.last_sync_stats, "policy_version": self.backend.policy_version}

    def _learn(self, batch: TensorDict, *, stale: bool = False) -> dict[str, Any]:
        """Advantages, group filters (infrastructure failures, zero variance) and the optimizer updates on one
        collected batch. ``stale``: the batch was generated by an older policy than the one being trained (async)."""
        s = self.settings
        metrics: dict[str, Any] = episode_metrics(batch)
        self._length_guard.check(metrics, self.step + 1)
        if s.samples_per_step > 0:
            try:
                self.logger.log_samples(sample_rows(batch, self.tokenizer, s.samples_per_step), step=self.step + 1)
            except OSError as exc:  # samples are a convenience; never stop training for them
                log.warning("could not write samples.jsonl: %s", exc)
        reward = batch["reward"]
        # a group with an episode that ended on an env exception or a customer-simulator failure is dropped whole:
        # its reward 0 says nothing about the policy, and the rest of the group's advantages were computed against it
        infra = batch["infra_error"] if "infra_error" in batch.keys() else torch.zeros_like(reward, dtype=torch.bool)
        bad_groups = batch["group_id"][infra].unique()
        metrics["groups/dropped_infra"] = float(bad_groups.numel())
        if bad_groups.numel():
            log.warning("step %d: %d group(s) dropped for infrastructure failures (env_error/user_error), not trained",
                        self.step, bad_groups.numel())
        zero_var = group_reward_std(reward, batch["group_id"]) == 0
        metrics["groups/zero_variance_fraction"] = zero_var.float().mean().item()
        keep = ~torch.isin(batch["group_id"], bad_groups)
        if s.filter_zero_variance_groups:
            keep &= ~zero_var
        # adv_scale=batch: the std of the episodes this step trains, over every rank's shard: the dropped groups
        # (infrastructure failures, and zero-variance ones when filtered) are left out, as if never collected (the
        # DAPO dynamic-sampling batch); unfiltered zero-variance groups are trained (advantage 0) and count
        batch["advantage"] = group_advantages(reward, batch["group_id"], scale=s.adv_scale, baseline=s.adv_baseline,
                                              stats_mask=keep, sum_over_ranks=self.dp.sum_tensor)
        if not keep.all():
            batch = batch[keep]
        metrics["groups/kept_episodes"] = float(batch.shape[0])
        if self.matmul_peak_flops is None and batch.shape[0]:
            self._measure_matmul_peak(batch)  # once, before the first timed update
        t_train = time.perf_counter()
        if self.dp.all(batch.shape[0] == 0 or not bool(batch["response_mask"].any())):  # every rank, or none
            reason = ("no episodes left after zero-variance/infrastructure group filtering" if batch.shape[0] == 0
                      else "no response tokens")
            log.warning("step %d: optimizer step skipped (%s)", self.step, reason)
            metrics.update({"train/skipped": 1.0, "train/skip_reason": reason, "train/optimizer_steps": 0.0})
        else:
            metrics.update(self.updater(batch.exclude("task", "info"), step=self.step, stale=stale))
        metrics["lr"] = self.scheduler.get_last_lr()[0]  # the rate this step's optimizer steps used (before the step)
        with warnings.catch_warnings():  # a step with no optimizer step still advances the schedule, on purpose
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()  # one schedule step per trainer step (see training.optimizer.make_scheduler)
        metrics["train/optimizer_steps_total"] = float(self.optimizer_steps)
        metrics["time/train_s"] = time.perf_counter() - t_train
        metrics.update(self._update_perf(metrics))
        return metrics

    def _measure_matmul_peak(self, batch: TensorDict) -> None:
        """:attr:`matmul_peak_flops`: this machine's matmul FLOP/s at the update's shapes, in this process and thread,
        in the update's dtype and autocast (:func:`~torchrl_grpo.reporting.flops.update_peak_flops`: ~1.2 s at most),
        with ``tokens`` = the first update's real tokens. NaN, never retried, for a model whose config gives no
        dimensions."""
        u = self.updater
        tokens = int(batch["attention_mask"].sum())  # a host tensor (the collector's batch): no device read
        try:
            self.matmul_peak_flops = update_peak_flops(self.model, tokens, device=getattr(u, "device", self.device),
                                                       autocast=getattr(u, "autocast", None))
        except ValueError as exc:
            log.info("no matmul peak measured (perf/update_mfu not logged): %s", exc)
            self.matmul_peak_flops = float("nan")
            return
        log.info("matmul peak at the update's shapes (%d tokens): %.3g FLOP/s", tokens, self.matmul_peak_flops)

    def _update_perf(self, metrics: dict[str, Any]) -> dict[str, float]:
        """The update's achieved FLOP/s (its model FLOPs, ``perf/update_flops``, over ``time/train_s``), the
        matmul peak and their ratio, ``perf/update_mfu`` (docs/metrics.md; :mod:`torchrl_grpo.reporting.flops`). Only
        the peak on a step whose update was skipped."""
        out: dict[str, float] = {}
        peak = self.matmul_peak_flops
        if peak is not None:
            out["perf/matmul_peak_flops_per_s"] = peak
        flops, secs = metrics.get("perf/update_flops"), metrics["time/train_s"]
        if isinstance(flops, float) and flops > 0 and secs > 0:
            out["perf/update_flops_per_s"] = flops / secs
            if peak is not None and peak > 0:
                out["perf/update_mfu"] = flops / secs / peak
        return out

    # ------------------------------------------------------------------ eval / checkpoint / loop
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy / pass@k / pass^k on the first ``eval.n_problems`` usable tasks of the valid split, plus
        the env's do-nothing baseline on the same tasks; each episode appended to ``eval_episodes.jsonl`` with this
        step (:class:`~torchrl_grpo.training.evaluator.Evaluator`; under torchrun ranks other than 0 return ``{}``)."""
        return self.evaluator(self.step, dp=self.dp)

    def save(self) -> Path:
        """Checkpoint ``<run_dir>/checkpoints/step_<step>/`` (:func:`torchrl_grpo.training.checkpoint.save_checkpoint`:
        model or adapter, tokenizer, optimizer, schedule, RNG, config, ``optimizer_steps``). Returns its path (the
        path it would have on ranks other than 0, which write nothing)."""
        # FSDP: gathering the full states is a collective (every rank), rank 0 gets them; DDP: rank 0's own state
        # is the whole one (identical weights and optimizer on every rank)
        model_sd, optim_sd = full_state_dicts(self.model, self.optimizer) if is_fsdp(self.model) else (None, None)
        if not self.dp.is_main:
            return self._checkpoint_dir()
        return save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, scheduler=self.scheduler, config_yaml=self.settings.config_yaml,
                               keep_last=self.settings.checkpoint_keep_last,
                               extra={"optimizer_steps": self.optimizer_steps},
                               model_state_dict=model_sd, optimizer_state_dict=optim_sd)

    def _checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints" / f"step_{self.step:06d}"

    def fit(self) -> dict[str, Any]:
        """Train for ``train.steps`` steps (from the resumed step) on the loop shell
        (:func:`torchrl_grpo.training.loop.run_loop`): evaluation at start (step 0 only) / every ``eval.every`` / at
        end, a checkpoint every ``checkpoint.every`` steps and at the end (``checkpoint.save_final``), the learning
        curve; ``<run_dir>/config.yaml`` first, the run's resolved config. Returns the summary: ``load_time_s``,
        ``eval_start`` / ``eval_end``, ``checkpoint``, ``last`` (the last step's metrics), ``learning_curve``.

        SIGINT / SIGTERM stop it cleanly (:mod:`torchrl_grpo.training.interrupt`): the step in flight is finished and logged,
        a checkpoint of it is written (``checkpoint.on_interrupt``, unless one exists) and the exception re-raised.
        A second signal abandons the step in flight; its half-updated weights are not saved.

        Raises:
            TrainingInterrupted: on SIGINT / SIGTERM (a ``KeyboardInterrupt``; ``exit_code`` 130 / 143).
        """
        s = self.settings
        ev = s.eval_n_problems > 0
        if self.dp.is_main:  # one writer: under torchrun every rank runs fit (as checkpoints and the final model)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(s.config_yaml)  # the resolved config of this run, as SFT's
        return run_loop(
            lambda _: self.train_step(), max(0, s.steps - self.step), position=lambda: self.step, logger=self.logger,
            last=s.steps, log=log,
            evaluation=EvalSchedule(lambda: self.evaluate(), at_start=ev and s.eval_at_start and self.step == 0,
                                    every=s.eval_every if ev else 0, at_end=ev and s.eval_at_end),
            checkpoints=CheckpointSchedule(lambda: self.save(), every=s.checkpoint_every, at_end=s.checkpoint_save_final,
                                           on_interrupt=s.checkpoint_on_interrupt,
                                           exists=lambda: self._checkpoint_dir().is_dir()),
            on_end=self._save_final_model if s.final_model else None,
            progress=Progress("GRPO", s.progress_bar), learning_curve=self._draw_learning_curve,
            summary={"load_time_s": self.components.load_time_s})

    def _save_final_model(self) -> dict[str, str]:
        """``<run_dir>/final_model`` (``checkpoint.final_model``; :func:`~torchrl_grpo.training.checkpoint.
        save_final_model`: the trained weights and tokenizer, no optimizer), after the last step, before the final
        evaluation; rank 0 writes (FSDP: every rank gathers first). Returns ``{"final_model": path}`` (``{}`` on other ranks)."""
        model_sd = full_state_dicts(self.model, self.optimizer)[0] if is_fsdp(self.model) else None
        if not self.dp.is_main:
            return {}
        out = save_final_model(self.run_dir / "final_model", model=self.model, tokenizer=self.tokenizer,
                               model_state_dict=model_sd)
        log.info("trained weights written to %s (python grpo.py actor.path=%s ...)", out, out)
        return {"final_model": str(out)}

    def _draw_learning_curve(self) -> str | None:
        """``learning_curve.png`` in the run dir and wandb, on rank 0 (:func:`~torchrl_grpo.training.loop.draw_learning_curve`)."""
        if not self.dp.is_main:
            return None
        return draw_learning_curve(self.logger, self.run_dir, self.step, self.evaluator.n_tasks)

    def close(self) -> None:
        """Flush the logger, close the environments and shut the rollout backend down (a vLLM engine frees its
        memory; the trainer owns its backend, also one passed in)."""
        self.components.close()
