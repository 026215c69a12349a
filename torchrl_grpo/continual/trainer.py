"""Continual GRPO over a sequence of domains: ``build_trainer(cfg, run_dir).train()`` and ``.evaluate_task(domain)``
(:func:`torchrl_grpo.assembly.continual_run.build_continual_trainer` builds a :class:`ContinualTrainer` when
``cl.task_order`` is set).

Built on the ordinary pieces, all made by :mod:`torchrl_grpo.assembly.continual_run` (this module reads no config): one set
of :class:`~torchrl_grpo.training.components.Components` (model, backend, optimizer, LR schedule over the whole
sequence, logger) for the first domain, one :class:`~torchrl_grpo.rollout.env_side.EnvSide` per domain on the same
backend, plain :class:`~torchrl_grpo.continual.settings.ContinualSettings`, and the algorithm. One
:class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer` runs the steps; its environment is switched at each task
boundary (:class:`~torchrl_grpo.continual.domains.Domains`). The algorithm
(:mod:`torchrl_grpo.continual.algorithms`) sees every collected batch (``trainer.augment_batch``) and the step / task
ends. Each task's steps run on the shared loop shell (:func:`torchrl_grpo.training.loop.run_loop`: signals, step
logging, the ``eval_interval`` scoring).

A run (T = number of domains):

1. score every domain with the untrained model -> ``b`` (``base/eval``);
2. for task k = 0..T-1 on domain d_k: ``num_steps_per_task`` GRPO steps (the current domain's episodes go to the
   trajectory buffer; every ``eval_interval`` steps all domains are scored into ``task_k/eval``), then ``post_task``,
   score all domains -> row ``R[k]``, transfer metrics over the first k+1 domains, the console banner and tables,
   ``checkpoint_task_{k}/`` (``save_checkpoints``; :mod:`torchrl_grpo.continual.task_checkpoints`), ``metrics.json`` and
   the two PNGs;
3. the final summary :func:`torchrl_grpo.continual.transfer.transfer_metrics` (R, b).

The ``joint`` algorithm runs one stage of ``num_steps_per_task * T`` steps, the domain rotating every step, and scores
all domains once at the end: ``R`` then has that single row (``row_labels: ["joint"]``) and the summary ``acc`` only.

Run dir: ``metrics.json`` (schema in :mod:`torchrl_grpo.continual.transfer`), ``metrics.jsonl`` (every step's
trainer metrics plus ``cl/*``, ``cl_eval/<domain>/<score>`` and ``cl_transfer/*``; also sent to wandb),
``learning_curves.png``, ``accuracy_matrix.png``, ``trajectories.jsonl`` (the buffer at the end) and the task
checkpoints; resuming, and what SIGINT / SIGTERM save: :mod:`torchrl_grpo.continual.task_checkpoints`.

Not handled here: async mode.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torchrl_grpo.continual import task_checkpoints as ckpt
from torchrl_grpo.continual import transfer as continual
from torchrl_grpo.continual.algorithms import CLAlgorithm, KLAnchor
from torchrl_grpo.continual.task_checkpoints import CL_ALGORITHM_PT, CL_STATE_JSON, TRAJECTORIES_JSONL, read_resume_state
from torchrl_grpo.continual.domains import Domains
from torchrl_grpo.continual.settings import ContinualSettings
from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer
from torchrl_grpo.rollout.env_side import EnvSide
from torchrl_grpo.training.components import Components
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.training.interrupt import TrainingInterrupted, finish_step, handle_signals
from torchrl_grpo.training.loop import EvalSchedule, Progress, run_loop

__all__ = ["ContinualTrainer", "ContinualSettings", "read_resume_state", "CL_STATE_JSON", "CL_ALGORITHM_PT",
           "TRAJECTORIES_JSONL"]

log = logging.getLogger(__name__)


class ContinualTrainer:
    """Continual GRPO (module docstring).

    Args:
        components: the run's components, built for the first domain (their ``run_dir`` is the run's).
        sides: domain -> its :class:`~torchrl_grpo.rollout.env_side.EnvSide` on ``components.backend``, one per
            domain of ``settings.domains`` (the first one's collectors are ``components``').
        settings: the run's :class:`~torchrl_grpo.continual.settings.ContinualSettings`.
        algorithm: the :class:`~torchrl_grpo.continual.algorithms.CLAlgorithm`; one whose ``joint`` is true (``joint``)
            runs the joint stage. ``settings.kl_anchor`` adds a
            :class:`~torchrl_grpo.continual.algorithms.KLAnchor` hook after it.
        resume: the checked state of a task checkpoint to continue from
            (:func:`~torchrl_grpo.continual.task_checkpoints.read_resume_state`), or None.

    Raises:
        ValueError: ``sides`` does not hold exactly the domains of ``settings``; an algorithm's setup refuses the
            model (LoRA per domain without LoRA); a saved algorithm state does not fit.
    """

    def __init__(self, components: Components, sides: dict[str, EnvSide], settings: ContinualSettings, *,
                 algorithm: CLAlgorithm, resume: dict | None = None) -> None:
        if list(sides) != list(settings.domains):
            raise ValueError(f"one env side per domain, in task order: got {list(sides)} for {list(settings.domains)}")
        self.settings = s = settings
        self.domains: list[str] = list(s.domains)
        self.metric, self.num_steps_per_task, self.eval_interval = s.metric, s.num_steps_per_task, s.eval_interval
        self.run_dir = Path(components.run_dir)
        self.trainer = GRPOTrainer(components)
        tok = components.tokenizer
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.algorithm = algorithm
        self.hooks: list[CLAlgorithm] = [algorithm] + ([KLAnchor()] if s.kl_anchor else [])
        for h in self.hooks:
            h.setup(self)
        self.buffer = TrajectoryBuffer(s.buffer_size)
        self.envs = Domains(self.trainer, sides, self.hooks, kl_to_base=s.kl_to_base)
        self.joint = bool(algorithm.joint)  # declared by the algorithm
        self.metrics: dict[str, Any] = {
            "task_order": self.domains, "algorithm": algorithm.name, "metric": self.metric, "boundaries": [],
            "R": [None] * (1 if self.joint else len(self.domains)), "b": None, "transfer": [],
        }
        if self.joint:
            self.metrics["row_labels"] = ["joint"]
        self.start_task, self.start_task_step = 0, 0  # first task, and its steps already done (resumed mid-task)
        self.checkpoints = ckpt.TaskCheckpoints(self)  # where the run stands, what its newest checkpoint holds
        self._domain_reward: float | None = None
        self._interrupt_completed: bool | None = None  # run_loop's "step completed" on the interrupt in flight
        self._replayed = 0
        if resume is not None:
            self.start_task, self.start_task_step = self.checkpoints.resume(resume)

    _base_copy = property(lambda self: self.envs.base_copy, doc="π_0 of ``kl_to_base`` without LoRA (Domains.base_copy)")

    # ------------------------------------------------------------------ what the algorithms use (ContinualRun)
    def past_domains(self, domain: str) -> list[str]:
        """The domains trained before ``domain`` in the task order."""
        return self.domains[: self.domains.index(domain)]

    def collect(self, domain: str, tasks: list[dict]):
        """Roll out ``n_samples`` episodes per task on ``domain`` now (:meth:`Domains.collect`)."""
        return self.envs.collect(domain, tasks)

    # ------------------------------------------------------------------ scores
    def evaluate_task(self, domain: str) -> dict[str, float | None]:
        """Score the current policy on ``domain`` (:meth:`Domains.evaluate_task`: ``pass^1``, ``pass^k``,
        ``reward_mean``, ``k``). Raises ValueError: ``domain`` is not in the task order."""
        return self.envs.evaluate_task(domain)

    def kl_to_base(self, domain: str) -> float:
        """KL of the current policy to the untrained one on ``domain``'s eval prompts (:meth:`Domains.kl_to_base`)."""
        return self.envs.kl_to_base(domain)

    def _evaluate_all(self, key: str) -> dict[str, dict]:
        """Score every domain; append one row per domain to ``metrics[key]`` and log them."""
        step = self.trainer.step
        out, flat = {}, {}
        for d in self.domains:
            s = out[d] = self.envs.score(d)
            self.metrics.setdefault(key, []).append({"step": step, "domain": d, **s})
            flat.update({f"cl_eval/{d}/{m}": v for m, v in s.items() if m != "k" and v is not None})
        self.trainer.logger.log(flat, step=step)
        return out

    def _row(self, scores: dict[str, dict]) -> list[float | None]:
        return [scores[d][self.metric] for d in self.domains]

    # ------------------------------------------------------------------ training
    def _use(self, domain: str) -> None:
        self.envs.use(domain)
        self.trainer.augment_batch = lambda batch: self._augment(batch, domain)

    def _augment(self, batch, domain: str):
        self.buffer.add_batch(batch, domain, step=self.trainer.step + 1)
        self._domain_reward = batch["reward"].mean().item()
        n = batch.shape[0]
        for h in self.hooks:
            batch = h.augment_batch(batch, domain)
        self._replayed = batch.shape[0] - n
        return batch

    def _step(self, k: int, domain: str) -> dict[str, Any]:
        t = self.trainer
        m = t.train_step()
        for h in self.hooks:
            h.post_step(t, domain)
        row = {"step": t.step, "domain": domain, "loss": m.get("loss/total"), "reward_mean": self._domain_reward,
               "reward_mean_batch": m.get("reward/mean"), "success_rate": m.get("reward/success_rate"),
               "kl_ref": m.get("kl_ref"), "ess": m.get("ess"), "replayed_episodes": self._replayed,
               **({"ewc_penalty": m["loss_penalty_ewc"]} if "loss_penalty_ewc" in m else {})}
        self.metrics.setdefault(f"task_{k}/train", []).append(row)
        return {**m, "cl/task": k, "cl/domain_reward_mean": self._domain_reward, "cl/replayed_episodes": self._replayed}

    def _run_steps(self, step, steps, n: int, done: int, key: str, desc: str) -> None:
        """``step(i)`` for ``i`` in ``steps`` on the loop shell: each step with its logging and, every
        ``eval_interval`` steps but the ``n``-th, the scoring of all domains into ``metrics[key]``, inside one
        :func:`~torchrl_grpo.training.interrupt.finish_step`. An interrupt propagates to :meth:`train`, which saves.

        The shell's rule for a second signal (:func:`~torchrl_grpo.training.loop.run_loop`): the step is completed,
        and saved, when the counter the shell watches moved during it. That counter is moved here after ``step``
        returned, its last write (after the trainer's step, the hooks' ``post_step`` and the progress the task
        checkpoint records), so a completed step is a consistent one; the shell's verdict is kept for :meth:`train`."""
        t = self.trainer
        pos = [t.step]  # the trainer's step, moved when a whole continual step is done

        def counted(i):
            m = step(i)
            pos[0] = t.step
            return m

        def score_all() -> dict:  # logs its own rows: nothing to merge into the step's
            self._evaluate_all(key)
            return {}

        def interrupted(e, completed: bool) -> None:  # train() saves, with this verdict
            self._interrupt_completed = completed

        self._interrupt_completed = None
        run_loop(counted, steps, position=lambda: pos[0], logger=t.logger, origin=t.step - done, last=n,
                 evaluation=EvalSchedule(score_all, every=self.eval_interval, at_last=False),  # the boundary scores n
                 on_interrupt=interrupted, progress=Progress(desc, t.settings.progress_bar), log=log)

    def _task(self, k: int, domain: str, done: int = 0) -> None:
        """Task ``k`` on ``domain`` from its step ``done + 1`` (``done`` > 0: a resumed interrupted task), then its
        boundary (inside one :func:`~torchrl_grpo.training.interrupt.finish_step`)."""
        t, n = self.trainer, self.num_steps_per_task
        self._use(domain)
        for h in self.hooks:
            h.pre_task(t, domain)
        log.info("task %d: %s (%d steps from step %d)", k, domain, n - done, t.step)

        def step(i: int) -> dict[str, Any]:
            m = self._step(k, domain)
            self.checkpoints.progress = (k, i, False)
            return m

        self._run_steps(step, range(done + 1, n + 1), n, done, f"task_{k}/eval", f"task {k}: {domain}")
        with finish_step():
            self._boundary(k, domain)

    def _boundary(self, k: int, domain: str) -> None:
        """The end of task ``k``: post-task hooks, scores -> ``R[k]``, transfer, console, checkpoint, files."""
        t = self.trainer
        for h in self.hooks:
            h.post_task(t, domain)
        scores = self._evaluate_all(f"task_{k}/eval")
        R = self.metrics["R"]
        R[k] = self._row(scores)
        self.metrics["boundaries"].append(t.step)
        tr = continual.transfer_at_boundary(R, self.metrics["b"], k)
        self.metrics["transfer"].append({"task": k, "domain": domain, "step": t.step, **tr,
                                         "current": dict(zip(self.domains, R[k]))})
        t.logger.log({f"cl_transfer/{n}": v for n, v in tr.items()}, step=t.step)
        log.info("\n%s\n%s\n%s", continual.format_banner(k, self.domains, R, self.metrics["b"],
                                                          steps=self.num_steps_per_task),
                 continual.format_matrix(self.domains, R, self.metrics["b"]), continual.format_transfer(tr))
        self.checkpoints.progress = (k, self.num_steps_per_task, True)
        if self.settings.save_checkpoints:
            self.save_task_checkpoint(k)
        self._write()

    def _train_joint(self) -> None:
        t, n = self.trainer, self.num_steps_per_task * len(self.domains)

        def step(_) -> dict[str, Any]:
            d = self.algorithm.domain_for_step(t.step, self.domains)
            self._use(d)
            return self._step(0, d)

        self._run_steps(step, n, n, 0, "task_0/eval", "joint")
        for h in self.hooks:
            h.post_task(t, "joint")
        scores = self._evaluate_all("task_0/eval")
        self.metrics["R"] = [self._row(scores)]
        self.metrics["boundaries"].append(t.step)
        if self.settings.save_checkpoints:
            self.save_task_checkpoint(0)

    def train(self) -> dict[str, Any]:
        """Run the sequence (module docstring). Returns the final summary (``acc``, ``bwt``, ``fwt``, ``forgetting``,
        ``R``, ``b``; joint: ``acc``, ``R``, ``b``).

        Raises:
            TrainingInterrupted: on SIGINT / SIGTERM, after ``checkpoint_task_{k}_interrupted/`` is written (module
                docstring; ``exit_code`` 130 / 143).
        """
        with handle_signals():  # a no-op inside grpo.py's own
            try:
                return self._train()
            except TrainingInterrupted as e:
                completed = self._interrupt_completed  # the loop shell's verdict; None: raised outside its steps
                self._interrupt_completed = None
                if self.checkpoints.on_interrupt(e, completed=completed) is not None:
                    self._write()
                raise

    def _train(self) -> dict[str, Any]:
        if self.metrics["b"] is None:
            self.metrics["b"] = self._row(self._evaluate_all("base/eval"))
        if self.joint:
            self._train_joint()
            row = self.metrics["R"][0]
            summary: dict[str, Any] = {"acc": sum(row) / len(row)}
        else:
            for k in range(self.start_task, len(self.domains)):
                self._task(k, self.domains[k], done=self.start_task_step if k == self.start_task else 0)
            summary = continual.transfer_metrics(self.metrics["R"], self.metrics["b"])
            log.info("continual run finished (%s):\n%s\n%s", self.algorithm.name,
                     continual.format_matrix(self.domains, self.metrics["R"], self.metrics["b"]),
                     continual.format_transfer(summary))
        self.metrics["summary"] = {**summary, "R": self.metrics["R"], "b": self.metrics["b"],
                                   "steps": self.trainer.step, "buffer": self.buffer.stats()}
        self.trainer.logger.log({f"cl_summary/{k}": v for k, v in summary.items()}, step=self.trainer.step)
        self.buffer.save(self.run_dir / TRAJECTORIES_JSONL)
        self._write()
        return self.metrics["summary"]

    # ------------------------------------------------------------------ files
    def _write(self) -> None:
        """``metrics.json`` (atomically) and the two PNGs (also sent to wandb when it is on)."""
        ckpt.write_json(self.run_dir / continual.METRICS_JSON, self.metrics)
        try:
            curves, matrix = continual.plot_run(self.run_dir,
                                                json.loads((self.run_dir / continual.METRICS_JSON).read_text()))
        except Exception as e:  # plots are a convenience; never lose a run to them
            log.warning("could not draw the continual-learning plots: %s: %s", type(e).__name__, e)
            return
        self.trainer.logger.log_images({"cl/learning_curves": curves, "cl/accuracy_matrix": matrix},
                                       step=self.trainer.step)

    def save_task_checkpoint(self, k: int, *, task_step: int | None = None, done: bool = True,
                             name: str | None = None) -> Path:
        """``checkpoint_task_{k}/`` (or ``name``): :meth:`TaskCheckpoints.save`. Returns the directory."""
        return self.checkpoints.save(k, task_step=task_step, done=done, name=name)

    def close(self) -> None:
        """Close every domain's envs, the logger and the rollout backend."""
        self.envs.close()
        self.trainer.close()
