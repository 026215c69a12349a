"""The synchronous GRPO training loop.

One step: collect ``batch_size`` tasks × ``n_samples`` episodes (a group each) with the rollout backend →
group-relative advantages → drop groups with an infrastructure failure (and, if set, zero reward variance) →
the update (:mod:`torchrl_grpo.training.update`) → sync the backend (``collector.update_policy_weights_``) → log, evaluate
and checkpoint on schedule. The objects it runs (:class:`~torchrl_grpo.training.components.Components`) come from
:func:`torchrl_grpo.build.build`, which :func:`torchrl_grpo.build.build_trainer` hands to the trainer class; the loop
reads no config.

Everything random is derived from ``seed`` and the step number (task order, sampling seeds), and the
checkpoint stores model, optimizer, scheduler and RNG states, so ``train.resume_from`` continues exactly.
"""
from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from torchrl_grpo.objectives.advantage import group_advantages, group_reward_std
from torchrl_grpo.training.checkpoint import save_checkpoint
from torchrl_grpo.training.components import Components
from torchrl_grpo.distributed.data_parallel import SINGLE
from torchrl_grpo.rollout.episode_stats import LengthGuard, episode_metrics, sample_rows
from torchrl_grpo.rollout.evaluation import evaluate, format_eval_table
from torchrl_grpo.distributed.placement import Placement

__all__ = ["GRPOTrainer"]

log = logging.getLogger(__name__)
_NO_PLACEMENT = Placement(torch.device("cpu"), torch.device("cpu"), torch.device("cpu"))  # components built elsewhere


def run_eta_s(step_s: float, steps_left: int, eval_s: float | None, eval_at_end: bool) -> float:
    """Seconds to the end of the run: ``steps_left`` steps at the mean ``step_s`` seen so far, plus one final
    evaluation as long as the first one took (``eval_s``; not counted when unknown or no final evaluation)."""
    return max(0, steps_left) * step_s + (eval_s or 0.0) * bool(eval_at_end)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


class GRPOTrainer:
    """Sync GRPO trainer on built components.

    ``GRPOTrainer(components)`` runs components built elsewhere; from a :class:`torchrl_grpo.config.GRPOConfig`,
    :func:`torchrl_grpo.build.build_trainer` ``(cfg, run_dir, model=..., tokenizer=..., backend=...)`` builds them
    (:func:`torchrl_grpo.build.build`, with this class's :attr:`own_backend_copy`) and returns the trainer.

    Args:
        components: the built :class:`~torchrl_grpo.training.components.Components`.
        cfg: the resolved config they were built from, kept as ``self.cfg`` for callers (the loop reads
            ``self.settings``); None for components assembled by hand.

    Raises:
        TypeError: ``components`` is not a :class:`~torchrl_grpo.training.components.Components` (e.g. the config of
            the old ``GRPOTrainer(cfg, run_dir, ...)`` call, which :func:`torchrl_grpo.build.build_trainer` replaces).
    """

    #: the rollout engine must not share the training module (the async trainer's): build() gives it its own copy
    own_backend_copy = False

    def __init__(self, components: Components, *, cfg=None) -> None:
        if not isinstance(components, Components):
            raise TypeError(f"{type(self).__name__} takes built Components, got {type(components).__name__}: build "
                            f"a trainer from a config with torchrl_grpo.build.build_trainer(cfg, run_dir, "
                            f"trainer_cls={type(self).__name__}, model=..., tokenizer=..., backend=...)")
        c = self.components = components
        self.cfg = cfg
        self.settings, self.run_dir, self.device = c.settings, c.run_dir, c.device
        self.model, self.tokenizer, self.backend, self.sampling = c.model, c.tokenizer, c.backend, c.sampling
        self.collector, self.eval_collector, self.train_tasks = c.collector, c.eval_collector, c.train_tasks
        self.loss_fn, self.optimizer, self.scheduler, self.updater = c.loss_fn, c.optimizer, c.scheduler, c.update
        self.logger, self.load_time_s, self.step = c.logger, c.load_time_s, c.start_step
        self.dp = c.dp or SINGLE  # data parallel (torchrl_grpo.distributed.data_parallel): this rank's share, rank 0 writes
        # a disjoint CPU plan (torchrl_grpo.distributed.placement): this thread trains on the train cores, collects on the
        # inference cores; a colocated plan pins nothing
        self.placement = c.placement if c.placement is not None else _NO_PLACEMENT
        self.placement.pin_thread("train")
        self._length_guard = LengthGuard(self.settings.max_new_tokens)
        self._eval_tasks: list[int] | None = None
        self._baseline: dict[str, float] | None = None
        # optional callable(batch) -> batch run on each collected batch before advantages (continual replay)
        self.augment_batch = None

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps actually taken (logged as ``train/optimizer_steps_total``; restored on resume)."""
        return self.updater.optimizer_steps

    @property
    def n_train_tasks(self) -> int:
        return len(self.train_tasks)

    # the update's parts under their historical names
    def _micro_batches(self, td: TensorDict):
        return self.updater.micro_batches(td)

    def _fill_log_probs(self, td: TensorDict, key: str, model) -> None:
        self.updater.fill_log_probs(td, key, model)

    def _needs_anchor_recompute(self, multi_update: bool, stale: bool) -> bool:
        return self.updater.needs_anchor_recompute(multi_update, stale)

    def _update(self, batch: TensorDict, *, stale: bool = False) -> dict[str, float]:
        return self.updater(batch, step=self.step, stale=stale)

    def tasks_for_step(self, step: int) -> list[dict]:
        """The task indices of ``step``: an epoch-wise permutation of the train tasks seeded by (seed, epoch)."""
        bs, n = self.settings.batch_size, len(self.train_tasks)
        out = []
        for k in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(k, n)
            perm = np.random.default_rng([self.settings.seed, epoch]).permutation(n)
            out.append({"index": self.train_tasks[int(perm[pos])]})
        return out

    def use_env(self, side) -> None:
        """Train and evaluate on another environment from now on: a :class:`torchrl_grpo.rollout.env_side.EnvSide` on
        this trainer's backend (one per domain in a continual run)."""
        c = self.components
        c.collector, c.eval_collector, c.train_tasks = side.collector, side.eval_collector, side.train_tasks
        c.eval_tasks, c.eval_baseline, c.user_fn = side.eval_tasks, side.eval_baseline, side.user_fn
        self.collector, self.eval_collector, self.train_tasks = side.collector, side.eval_collector, side.train_tasks
        self._eval_tasks = self._baseline = None

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        """Run one GRPO step (collect, advantages, updates, weight sync). Returns its metrics."""
        t0 = time.perf_counter()
        tasks = self.dp.shard(self.tasks_for_step(self.step))  # whole groups per rank (all of them on one process)
        with self.placement.on_cores("inference"):
            batch = self.collector.collect(tasks, self.settings.n_samples, step=self.dp.collect_step(self.step))
        metrics: dict[str, Any] = dict(self.collector.last_stats)
        if self.augment_batch is not None:
            batch = self.augment_batch(batch)
        metrics.update(self._learn(batch))
        t_sync = time.perf_counter()
        row = batch[0]  # an episode the backend may score to check its sync (see RolloutBackend.sync_from)
        self.collector.update_policy_weights_(self.model, probe=row["tokens"][row["attention_mask"]].tolist())
        metrics["time/sync_s"] = time.perf_counter() - t_sync
        metrics.update(self.backend.last_sync_stats)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["policy_version"] = self.backend.policy_version
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.step += 1
        return self.dp.mean_metrics(metrics)  # numeric values averaged over ranks (as is on one process)

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
        # adv_scale=batch: the std of the step's whole batch, over every rank's shard, dropped groups left out
        batch["advantage"] = group_advantages(reward, batch["group_id"], scale=s.adv_scale, baseline=s.adv_baseline,
                                              stats_mask=~torch.isin(batch["group_id"], bad_groups),
                                              sum_over_ranks=self.dp.sum_tensor)
        metrics["groups/dropped_infra"] = float(bad_groups.numel())
        if bad_groups.numel():
            log.warning("step %d: %d group(s) dropped for infrastructure failures (env_error/user_error), not trained",
                        self.step, bad_groups.numel())
        zero_var = group_reward_std(reward, batch["group_id"]) == 0
        metrics["groups/zero_variance_fraction"] = zero_var.float().mean().item()
        keep = ~torch.isin(batch["group_id"], bad_groups)
        if s.filter_zero_variance_groups:
            keep &= ~zero_var
        if not keep.all():
            batch = batch[keep]
        metrics["groups/kept_episodes"] = float(batch.shape[0])
        t_train = time.perf_counter()
        if self.dp.all(batch.shape[0] == 0 or not bool(batch["response_mask"].any())):  # every rank, or none
            reason = ("no episodes left after zero-variance/infrastructure group filtering" if batch.shape[0] == 0
                      else "no response tokens")
            log.warning("step %d: optimizer step skipped (%s)", self.step, reason)
            metrics.update({"train/skipped": 1.0, "train/skip_reason": reason, "train/optimizer_steps": 0.0})
        else:
            metrics.update(self._update(batch.exclude("task", "info"), stale=stale))
        with warnings.catch_warnings():  # a step with no optimizer step still advances the schedule, on purpose
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()  # one schedule step per trainer step (see training.optimizer.make_scheduler)
        metrics["train/optimizer_steps_total"] = float(self.optimizer_steps)
        metrics["time/train_s"] = time.perf_counter() - t_train
        return metrics

    # ------------------------------------------------------------------ eval / checkpoint / loop
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy / pass@k / pass^k on the first ``eval.n_problems`` usable tasks of the valid split (under
        torchrun each rank evaluates its share: :func:`torchrl_grpo.rollout.evaluation.evaluate`; ranks other than 0 return
        ``{}``), plus
        the do-nothing baseline on the same tasks for envs that define one (the env's ``do_nothing_action``).
        Every evaluated episode is appended to ``<run_dir>/eval_episodes.jsonl`` with this step
        (:func:`torchrl_grpo.rollout.evaluation.eval_episode_rows`)."""
        s = self.settings
        if self._eval_tasks is None:
            self._eval_tasks = self.components.eval_tasks()
        episodes: list[dict] = []
        with self.placement.on_cores("inference"):  # every rank its share of the tasks; all of them gathered
            out = evaluate(self.eval_collector, task_indices=self._eval_tasks, sampling=self.sampling,
                           greedy=s.eval_greedy, pass_k=s.eval_pass_k, step=self.step, progress=s.progress_bar,
                           episodes=episodes, dp=self.dp)
        if not self.dp.is_main:  # rank 0 logs for the run
            return {}
        try:  # per-episode outcomes and greedy conversations: a convenience, never stop a run for them
            self.logger.log_samples(episodes, step=self.step, name="eval_episodes.jsonl")
        except OSError as exc:
            log.warning("could not write eval_episodes.jsonl: %s", exc)
        if self._baseline is None:
            self._baseline = self.components.eval_baseline(self._eval_tasks)  # {} without one
        out.update(self._baseline)
        out["eval/n_tasks"] = float(len(self._eval_tasks))  # the n of the accuracy's binomial interval
        log.info("evaluation at step %d (%d tasks):\n%s", self.step, len(self._eval_tasks), format_eval_table(out))
        return out

    def save(self) -> Path:
        from torchrl_grpo.distributed.data_parallel import full_state_dicts, is_fsdp

        # FSDP: gathering the full states is a collective (every rank), rank 0 gets them; DDP: rank 0's own state
        # is the whole one (identical weights and optimizer on every rank)
        model_sd, optim_sd = full_state_dicts(self.model, self.optimizer) if is_fsdp(self.model) else (None, None)
        if not self.dp.is_main:
            return self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        return save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, scheduler=self.scheduler, config_yaml=self.settings.config_yaml,
                               keep_last=self.settings.checkpoint_keep_last,
                               extra={"optimizer_steps": self.optimizer_steps},
                               model_state_dict=model_sd, optimizer_state_dict=optim_sd)

    def fit(self) -> dict[str, Any]:
        """Train for ``train.steps`` steps (from the resumed step). Returns the last metrics (and eval).

        SIGINT / SIGTERM stop it cleanly (:mod:`torchrl_grpo.training.interrupt`): the step in flight is finished and logged,
        a checkpoint of it is written (``checkpoint.on_interrupt``, unless one exists) and the exception re-raised.
        A second signal abandons the step in flight; its half-updated weights are not saved.

        Raises:
            TrainingInterrupted: on SIGINT / SIGTERM (a ``KeyboardInterrupt``; ``exit_code`` 130 / 143).
        """
        from torchrl_grpo.training.interrupt import TrainingInterrupted, finish_step, handle_signals

        s = self.settings
        summary: dict[str, Any] = {"load_time_s": self.load_time_s}
        last: dict[str, Any] = {}
        start = step_began = self.step
        bar = None
        with handle_signals():
            try:
                eval_s = None  # wall seconds of one evaluation (the first), for the run's ETA
                if s.eval_at_start and self.step == 0 and s.eval_n_problems > 0:
                    t_eval = time.perf_counter()
                    summary["eval_start"] = ev = self.evaluate()
                    eval_s = time.perf_counter() - t_eval
                    self.logger.log(ev, step=0)
                t_loop, steps_done = time.perf_counter(), 0
                try:
                    from tqdm.auto import tqdm

                    bar = tqdm(total=s.steps, initial=self.step, desc="GRPO", disable=not s.progress_bar)
                except ImportError:  # pragma: no cover
                    pass
                while self.step < s.steps:
                    step_began = self.step
                    with finish_step():  # a signal in here lets the step finish (update, log, checkpoint) first
                        last = self.train_step()
                        if s.eval_every and self.step % s.eval_every == 0 and self.step < s.steps and s.eval_n_problems > 0:
                            last.update(self.evaluate())
                        self.logger.log(last, step=self.step)
                        steps_done += 1
                        step_s = (time.perf_counter() - t_loop) / steps_done
                        final_eval = s.eval_at_end and s.eval_n_problems > 0
                        eta = run_eta_s(step_s, s.steps - self.step, eval_s, final_eval)
                        if steps_done == 1:
                            log.info("ETA: about %s to the end of the run (%d steps to go at %.0f s/step%s)",
                                     _minutes(eta), s.steps - self.step, step_s,
                                     f" + final evaluation ~{eval_s:.0f} s" if eval_s and final_eval else "")
                        if bar is not None:
                            bar.update(1)
                            post = {k: f"{last[k]:.3g}" for k in ("reward/mean", "loss/total", "ess")
                                    if isinstance(last.get(k), float)}
                            bar.set_postfix({**post, "run ETA": _minutes(eta)})
                        if s.checkpoint_every and self.step % s.checkpoint_every == 0:
                            summary["checkpoint"] = str(self.save())
                if bar is not None:
                    bar.close()
                if s.eval_at_end and s.eval_n_problems > 0:
                    summary["eval_end"] = ev = self.evaluate()
                    self.logger.log(ev, step=self.step)
                if s.checkpoint_save_final and not str(summary.get("checkpoint", "")).endswith(f"step_{self.step:06d}"):
                    summary["checkpoint"] = str(self.save())
            except TrainingInterrupted as e:
                if bar is not None:
                    bar.close()
                # consistent: raised between steps, or after train_step returned (the step counter is its last write)
                completed = not e.mid_step or self.step > step_began
                saved = (self.run_dir / "checkpoints" / f"step_{self.step:06d}").is_dir()
                if s.checkpoint_on_interrupt and completed and self.step > start and not saved:
                    log.warning("%s: saved the last completed step to %s", e, self.save())
                elif not completed:
                    log.warning("%s: step %d abandoned, not saved", e, self.step + 1)
                raise
        summary["last"] = last
        summary["learning_curve"] = self._draw_learning_curve()
        return summary

    def _draw_learning_curve(self) -> str | None:
        """``learning_curve.png`` in the run dir and wandb (:mod:`torchrl_grpo.reporting.learning_curve`); a failure to draw is
        logged, never raised: the run itself is done."""
        from torchrl_grpo.reporting.learning_curve import plot_learning_curve

        if not self.dp.is_main:
            return None
        try:
            png = plot_learning_curve(self.logger.path, self.run_dir / "learning_curve.png",
                                      n_eval=len(self._eval_tasks) if self._eval_tasks else None)
        except Exception as exc:  # noqa: BLE001
            log.warning("learning curve not drawn: %s", exc)
            return None
        if png is not None:
            self.logger.log_images({"learning_curve": png}, step=self.step)
        return None if png is None else str(png)

    def close(self) -> None:
        """Flush the logger, close the environments and shut the rollout backend down (a vLLM engine frees its
        memory; the trainer owns its backend, also one passed in)."""
        try:
            self.logger.close()
            self.collector.close()
            self.eval_collector.close()
        finally:
            self.backend.close()
            self.dp.close()
            self.placement.release()
