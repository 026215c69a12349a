"""Continual GRPO over a sequence of domains: ``build_trainer(cfg, run_dir).train()`` and ``.evaluate_task(domain)``
(:func:`torchrl_grpo.build.build_trainer` makes a :class:`ContinualTrainer` when ``cl.task_order`` is set).

Built on the ordinary pieces: one set of components (model, backend, optimizer, LR schedule over the whole sequence,
logger) for the first domain's config, made by the injected ``build_components`` (:func:`torchrl_grpo.build.build`),
one :class:`torchrl_grpo.rollout.env_side.EnvSide` per domain on the same backend
(:func:`torchrl_grpo.continual.domains.domain_config`: each domain keeps its own env settings and splits), and one
:class:`torchrl_grpo.training.grpo_trainer.GRPOTrainer` whose environment is switched at each task boundary
(:meth:`GRPOTrainer.use_env`). The algorithm (:mod:`torchrl_grpo.continual.algorithms`) sees every collected batch
(``trainer.augment_batch``) and the step / task ends.

A run (``cl.algorithm`` sequential or replay; T = ``len(cl.task_order)``):

1. score every domain with the untrained model -> ``b`` (``base/eval``);
2. for task k = 0..T-1 on domain d_k: ``cl.num_steps_per_task`` GRPO steps (the current domain's episodes go to the
   trajectory buffer; every ``cl.eval_interval`` steps all domains are scored into ``task_k/eval``), then
   ``post_task``, score all domains -> row ``R[k]``, transfer metrics over the first k+1 domains, the console banner
   and tables, ``checkpoint_task_{k}/`` (``cl.save_checkpoints``), ``metrics.json`` and the two PNGs;
3. the final summary :func:`torchrl_grpo.continual.transfer.transfer_metrics` (R, b).

``cl.algorithm=joint`` runs one stage of ``num_steps_per_task * T`` steps, the domain rotating every step, and
scores all domains once at the end: ``R`` then has that single row (``row_labels: ["joint"]``) and the summary holds
``acc`` only.

Scores (:meth:`ContinualTrainer.evaluate_task`, on the first ``eval.n_problems`` usable tasks of the domain's eval
split): ``pass^1`` = greedy success rate (reward >= 1; with ``eval.greedy=false`` the sampled pass@1 of the
``eval.pass_k`` samples), ``pass^k`` = tau-bench's pass^k over ``eval.pass_k`` samples
(:mod:`torchrl_grpo.rollout.evaluation`), ``reward_mean`` = greedy mean reward. ``cl.metric`` picks the one in R. With
``cl.kl_to_base`` each score row also has ``kl_base``, the policy's KL to the untrained model on that domain's eval
prompts (:meth:`ContinualTrainer.kl_to_base`; one extra rollout of ``n_samples`` episodes per eval task).

Run dir: ``metrics.json`` (schema in :mod:`torchrl_grpo.continual.transfer`), ``metrics.jsonl`` (every step's trainer metrics
plus ``cl/*``, ``cl_eval/<domain>/<score>`` and ``cl_transfer/*``; also sent to wandb), ``learning_curves.png``,
``accuracy_matrix.png``, ``trajectories.jsonl`` (the buffer at the end) and per task ``checkpoint_task_{k}/``:
``step_<n>/`` (model or LoRA adapter, tokenizer, optimizer, schedule, RNG, resolved config;
:mod:`torchrl_grpo.training.checkpoint`), ``trajectories.jsonl``, ``config.yaml`` and ``cl_state.json`` (task order, k, step,
the metrics so far) and ``cl_algorithm.pt`` (the algorithm's state: EWC's Fisher and anchor weights and its recent
batches, every per-domain LoRA adapter, the KL anchor's weights; :meth:`CLAlgorithm.state_dict`).
``cl.resume_from=<run>/checkpoint_task_{k}`` continues with domain k+1; it must come from a run with the same
``cl.task_order``.

SIGINT / SIGTERM (:mod:`torchrl_grpo.training.interrupt`, as in :meth:`GRPOTrainer.fit`): a step, with its logging and any
evaluation after it, and a task boundary (post-task hook, scoring, ``checkpoint_task_{k}/``) each run to their end;
then the run stops, and when a step finished after the last task checkpoint, ``checkpoint_task_{k}_interrupted/``
(same layout; ``cl_state.json`` has ``task_step`` = steps done in task k, ``task_done``) is written
(``checkpoint.on_interrupt``) and the exception re-raised. ``cl.resume_from=<run>/checkpoint_task_{k}_interrupted``
continues with step ``task_step + 1`` of task k: the same next step as the uninterrupted run (weights, optimizer,
schedule, RNG, buffer, algorithm state and the metrics so far are restored; the step's task and sampling seeds derive
from the step number). A second signal abandons the step in flight; nothing is saved then.

Not handled here: async mode.
"""
from __future__ import annotations

import json
import logging
import math
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from torchrl_grpo.continual import transfer as continual
from torchrl_grpo.continual.algorithms import CLAlgorithm, Joint, KLAnchor, make_algorithm
from torchrl_grpo.continual.domains import domain_config, validate_cl_config
from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer
from torchrl_grpo.rollout.env_side import EnvSide, build_env_side
from torchrl_grpo.training.components import Components
from torchrl_grpo.training.grpo_trainer import GRPOTrainer

__all__ = ["ContinualTrainer", "read_resume_state", "CL_STATE_JSON", "CL_ALGORITHM_PT", "TRAJECTORIES_JSONL"]

log = logging.getLogger(__name__)

CL_STATE_JSON = "cl_state.json"
CL_ALGORITHM_PT = "cl_algorithm.pt"
TRAJECTORIES_JSONL = "trajectories.jsonl"


def read_resume_state(cfg) -> dict:
    """The ``cl_state.json`` of ``cl.resume_from``, checked against this run before any model loads.

    Raises:
        FileNotFoundError: no ``cl_state.json`` there.
        ValueError: it comes from another ``cl.task_order``, or its run had already finished every task.

    The state of a finished task (``checkpoint_task_{k}``) continues with task k+1; an interrupted one
    (``task_done`` false) with step ``task_step + 1`` of task k. States written before these keys existed are finished
    tasks.
    """
    path = Path(cfg.cl.resume_from)
    f = path / CL_STATE_JSON
    if not f.is_file():
        raise FileNotFoundError(f"cl.resume_from={path}: no {CL_STATE_JSON} (expected a checkpoint_task_<k> dir)")
    state = json.loads(f.read_text())
    order = list(cfg.cl.task_order)
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


class ContinualTrainer:
    """Continual GRPO (module docstring).

    Args:
        cfg: the run config with a ``cl`` section (:class:`torchrl_grpo.config.ContinualConfig`).
        run_dir: output directory (default ``cfg.output_dir``, else ``outputs/continual``).
        build_components: ``(domain_cfg, run_dir) -> Components``: builds the run's components for the first
            domain's config, after the checks below (:func:`torchrl_grpo.build.build_trainer` passes
            :func:`torchrl_grpo.build.build` with the preloaded model / tokenizer / backend, if any).
        algorithm: a :class:`torchrl_grpo.continual.algorithms.CLAlgorithm` (default: the one ``cl.algorithm`` names).

    Raises:
        ValueError: bad ``cl`` settings, a domain's bad env settings or empty split, a resume checkpoint from another
            task order — all before any model loads (:func:`torchrl_grpo.continual.domains.validate_cl_config`).
        FileNotFoundError: ``cl.resume_from`` without its state file.
    """

    def __init__(self, cfg, run_dir: str | Path | None = None, *,
                 build_components: Callable[[Any, Path], Components], algorithm: CLAlgorithm | None = None) -> None:
        validate_cl_config(cfg)  # envs only: fails before the model loads
        resume = read_resume_state(cfg) if cfg.cl.resume_from else None
        self.cfg = cfg
        c = cfg.cl
        self.domains: list[str] = [str(d) for d in c.task_order]
        self.metric: str = c.metric
        self.num_steps_per_task, self.eval_interval = int(c.num_steps_per_task), int(c.eval_interval)
        self.run_dir = Path(run_dir or cfg.output_dir or "outputs/continual")
        self.domain_cfgs = {d: domain_config(cfg, d) for d in self.domains}
        comps = build_components(self.domain_cfgs[self.domains[0]], self.run_dir)
        self.trainer = GRPOTrainer(comps, cfg=self.domain_cfgs[self.domains[0]])
        self.sides = {self.domains[0]: EnvSide(user_fn=comps.user_fn, collector=comps.collector,
                                               eval_collector=comps.eval_collector, train_tasks=comps.train_tasks,
                                               _eval_tasks=comps.eval_tasks, _baseline=comps.eval_baseline)}
        for d in self.domains[1:]:
            self.sides[d] = build_env_side(self.domain_cfgs[d], comps.backend, comps.tokenizer, comps.sampling)
        tok = comps.tokenizer
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.algorithm = algorithm or make_algorithm(c, seed=cfg.seed)
        self.hooks: list[CLAlgorithm] = [self.algorithm] + ([KLAnchor()] if c.kl_coef > 0 else [])
        for h in self.hooks:
            h.setup(self)
        self.buffer = TrajectoryBuffer(c.buffer_size)
        self._base_copy = None  # π_0 for cl.kl_to_base without LoRA (with LoRA: the adapters switched off)
        if c.kl_to_base and not hasattr(self.trainer.model, "disable_adapter"):
            import copy

            self._base_copy = copy.deepcopy(self.trainer.model).eval().requires_grad_(False)
        self.joint = isinstance(self.algorithm, Joint)
        self.metrics: dict[str, Any] = {
            "task_order": self.domains, "algorithm": self.algorithm.name, "metric": self.metric, "boundaries": [],
            "R": [None] * (1 if self.joint else len(self.domains)), "b": None, "transfer": [],
        }
        if self.joint:
            self.metrics["row_labels"] = ["joint"]
        self.start_task = 0
        self.start_task_step = 0  # steps of task start_task already done (a resumed interrupted task)
        self._progress: tuple[int, int, bool] | None = None  # (task, steps done in it, boundary done) of this run
        self._saved_progress: tuple[int, int, bool] | None = None  # the progress the newest checkpoint holds
        self._current: str | None = None
        self._domain_reward: float | None = None
        self._replayed = 0
        if resume is not None:
            self._resume(resume)

    # ------------------------------------------------------------------ helpers the algorithms use
    def past_domains(self, domain: str) -> list[str]:
        """The domains trained before ``domain`` in the task order."""
        return self.domains[: self.domains.index(domain)]

    def collect(self, domain: str, tasks: list[dict]):
        """Roll out ``n_samples`` episodes per task (reset options) on ``domain`` with the current policy, seeded by
        the current trainer step. Returns the collector batch (TensorDict [len(tasks) * n_samples])."""
        t = self.trainer
        return self.sides[domain].collector.collect(tasks, t.settings.n_samples, step=t.step)

    # ------------------------------------------------------------------ evaluation
    def evaluate_task(self, domain: str) -> dict[str, float | None]:
        """Score the current policy on ``domain``'s eval split (module docstring): ``pass^1``, ``pass^k``
        (None when ``eval.pass_k`` is 0), ``reward_mean``, and ``k``.

        Raises:
            ValueError: ``domain`` is not in the task order.
        """
        if domain not in self.sides:
            raise ValueError(f"unknown domain {domain!r}; this run's task order is {self.domains}")
        t = self.trainer
        t.use_env(self.sides[domain])
        try:
            with self._eval_contexts(domain):
                ev = t.evaluate()
        finally:
            if self._current is not None:
                t.use_env(self.sides[self._current])
        k = t.settings.eval_pass_k
        return {"pass^1": ev.get("eval/accuracy", ev.get("eval/pass@1")), "pass^k": ev.get(f"eval/pass^{k}"),
                "reward_mean": ev.get("eval/reward"), "k": k}

    def _eval_contexts(self, domain: str) -> ExitStack:
        stack = ExitStack()
        for h in self.hooks:
            stack.enter_context(h.eval_context(self.trainer, domain))
        return stack

    def kl_to_base(self, domain: str) -> float:
        """Mean per-token KL(π_θ ‖ π_0) of the current policy to the untrained one on ``domain``'s eval prompts:
        ``n_samples`` episodes per eval task sampled now from π_θ, k3 estimator mean_t (r_t − 1 − log r_t) with
        r_t = π_0(a_t) / π_θ(a_t) over their response tokens (Schulman, "Approximating KL divergence", 2020: unbiased
        and never negative, where the k1 mean of −log r_t came out negative on a few dozen tokens), both under the
        sampler's processed
        distribution (:meth:`GRPOUpdate.fill_log_probs`). A predictor of forgetting: "RL's Razor" (Shenfeld et al.,
        2025, arXiv:2509.04259) finds forgetting tracks this KL on the old task's distribution. π_0 is the model with
        its LoRA adapters switched off, or a frozen copy of the initial weights (``cl.kl_to_base`` without LoRA).
        Returns 0.0 when no response token was sampled."""
        t = self.trainer
        tasks = [{"index": int(i)} for i in self.sides[domain].eval_tasks()]
        with self._eval_contexts(domain):
            td = self.collect(domain, tasks).exclude("task", "info")
            if not td["response_mask"].any():
                return 0.0
            t.updater.fill_log_probs(td, "policy_lp", t.model)
        with self._base_policy() as base:
            t.updater.fill_log_probs(td, "base_lp", base)
        log_r = (td["base_lp"] - td["policy_lp"])[td["response_mask"]]
        return float((log_r.exp() - 1 - log_r).mean())

    def _base_policy(self):
        model = self.trainer.model
        if hasattr(model, "disable_adapter"):
            @contextmanager
            def off():
                with model.disable_adapter():
                    yield model

            return off()
        return nullcontext(self._base_copy)

    def _evaluate_all(self, key: str) -> dict[str, dict]:
        """Score every domain; append one row per domain to ``metrics[key]`` and log them."""
        step = self.trainer.step
        out, flat = {}, {}
        for d in self.domains:
            s = self.evaluate_task(d)
            if self.cfg.cl.kl_to_base:
                s["kl_base"] = self.kl_to_base(d)
            out[d] = s
            self.metrics.setdefault(key, []).append({"step": step, "domain": d, **s})
            flat.update({f"cl_eval/{d}/{m}": v for m, v in s.items() if m != "k" and v is not None})
        self.trainer.logger.log(flat, step=step)
        return out

    def _row(self, scores: dict[str, dict]) -> list[float | None]:
        return [scores[d][self.metric] for d in self.domains]

    # ------------------------------------------------------------------ training
    def _augment(self, batch, domain: str):
        t = self.trainer
        self.buffer.add_batch(batch, domain, step=t.step + 1)
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
               **{k: m[k] for k in ("ewc_penalty",) if k in m}}
        self.metrics.setdefault(f"task_{k}/train", []).append(row)
        return {**m, "cl/task": k, "cl/domain_reward_mean": self._domain_reward, "cl/replayed_episodes": self._replayed}

    def _task(self, k: int, domain: str, done: int = 0) -> None:
        """Task ``k`` on ``domain`` from its step ``done + 1`` (``done`` > 0: a resumed interrupted task). Each step
        (with its evaluation) and the boundary run inside :func:`torchrl_grpo.training.interrupt.finish_step`."""
        from torchrl_grpo.training.interrupt import finish_step

        t = self.trainer
        self._current = domain
        t.use_env(self.sides[domain])
        t.augment_batch = lambda batch: self._augment(batch, domain)
        for h in self.hooks:
            h.pre_task(t, domain)
        log.info("task %d: %s (%d steps from step %d)", k, domain, self.num_steps_per_task - done, t.step)
        for i in range(done + 1, self.num_steps_per_task + 1):
            with finish_step():  # a signal in here lets the step (and its evaluation) finish first
                m = self._step(k, domain)
                t.logger.log(m, step=t.step)
                if self.eval_interval and i % self.eval_interval == 0 and i < self.num_steps_per_task:
                    self._evaluate_all(f"task_{k}/eval")
                self._progress = (k, i, False)
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
        self._progress = (k, self.num_steps_per_task, True)
        if self.cfg.cl.save_checkpoints:
            self.save_task_checkpoint(k)
        self._write()

    def _train_joint(self) -> None:
        t, algo = self.trainer, self.algorithm
        n = self.num_steps_per_task * len(self.domains)
        for i in range(1, n + 1):
            d = algo.domain_for_step(t.step, self.domains)
            self._current = d
            t.use_env(self.sides[d])
            t.augment_batch = lambda batch, d=d: self._augment(batch, d)
            t.logger.log(self._step(0, d), step=t.step)
            if self.eval_interval and i % self.eval_interval == 0 and i < n:
                self._evaluate_all("task_0/eval")
        for h in self.hooks:
            h.post_task(t, "joint")
        scores = self._evaluate_all("task_0/eval")
        self.metrics["R"] = [self._row(scores)]
        self.metrics["boundaries"].append(t.step)
        if self.cfg.cl.save_checkpoints:
            self.save_task_checkpoint(0)

    def train(self) -> dict[str, Any]:
        """Run the sequence (module docstring). Returns the final summary (``acc``, ``bwt``, ``fwt``, ``forgetting``,
        ``R``, ``b``; joint: ``acc``, ``R``, ``b``).

        Raises:
            TrainingInterrupted: on SIGINT / SIGTERM, after ``checkpoint_task_{k}_interrupted/`` is written (module
                docstring; ``exit_code`` 130 / 143).
        """
        from torchrl_grpo.training.interrupt import TrainingInterrupted, handle_signals

        with handle_signals():  # a no-op inside grpo.py's own
            try:
                return self._train()
            except TrainingInterrupted as e:
                self._on_interrupt(e)
                raise

    def _on_interrupt(self, e) -> None:
        """Checkpoint the last completed step if no checkpoint holds it (``checkpoint.on_interrupt``)."""
        p = self._progress
        if e.mid_step:
            log.warning("%s: the step in flight is abandoned, not saved", e)
        elif p is None or p == self._saved_progress or (p[2] and self.cfg.cl.save_checkpoints):
            log.warning("%s: nothing to save since the last checkpoint", e)
        elif self.joint:
            log.warning("%s: a joint run cannot be resumed mid-way; not saved", e)
        elif self.trainer.settings.checkpoint_on_interrupt:
            root = self.save_task_checkpoint(p[0], task_step=p[1], done=p[2],
                                             name=f"checkpoint_task_{p[0]}_interrupted")
            self._write()
            log.warning("%s: saved task %d after %d of its steps (step %d) to %s; continue with cl.resume_from=%s", e,
                        p[0], p[1], self.trainer.step, root, root)

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
        tmp = self.run_dir / (continual.METRICS_JSON + ".tmp")
        tmp.write_text(json.dumps(self.metrics, indent=1, default=_json_default))
        tmp.replace(self.run_dir / continual.METRICS_JSON)
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
        """``checkpoint_task_{k}/`` (or ``name``): the trainer checkpoint (``step_<n>/``), the trajectory buffer,
        the resolved config, the algorithm state (``cl_algorithm.pt``) and ``cl_state.json`` (``task_step``: steps
        done in task k, default all; ``task_done``: its boundary is done). Returns the directory."""
        import torch

        from torchrl_grpo.training.checkpoint import save_checkpoint

        t = self.trainer
        root = self.run_dir / (name or f"checkpoint_task_{k}")
        cfg_yaml = OmegaConf.to_yaml(self.cfg, resolve=True)
        save_checkpoint(root, t.step, model=t.model, tokenizer=t.tokenizer, optimizer=t.optimizer,
                        scheduler=t.scheduler, config_yaml=cfg_yaml, keep_last=1,
                        extra={"optimizer_steps": t.optimizer_steps, "cl_task": k})
        self.buffer.save(root / TRAJECTORIES_JSONL)
        (root / "config.yaml").write_text(cfg_yaml)
        tmp = root / (CL_ALGORITHM_PT + ".tmp")
        torch.save({h.name: h.state_dict() for h in self.hooks}, tmp)
        tmp.replace(root / CL_ALGORITHM_PT)
        state = {"task_order": self.domains, "task": k, "domain": "joint" if self.joint else self.domains[k],
                 "joint": self.joint, "step": t.step, "algorithm": self.algorithm.name,
                 "task_step": self.num_steps_per_task if task_step is None else int(task_step), "task_done": done,
                 "metrics": self.metrics}
        tmp = root / (CL_STATE_JSON + ".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=_json_default))
        tmp.replace(root / CL_STATE_JSON)
        self._saved_progress = (k, state["task_step"], done)
        return root

    def _resume(self, state: dict) -> None:
        from torchrl_grpo.training.checkpoint import load_checkpoint

        import torch

        t = self.trainer
        path = Path(state["path"])
        # the algorithms' state first: it may add structure the weights and optimizer state load into (adapters)
        algo_state = torch.load(path / CL_ALGORITHM_PT, weights_only=False) if (path / CL_ALGORITHM_PT).is_file() \
            else {}
        for h in self.hooks:
            if h.name in algo_state:
                h.load_state_dict(t, algo_state[h.name])
        ck = load_checkpoint(path, model=t.model, optimizer=t.optimizer, scheduler=t.scheduler)
        t.step = int(ck["step"])
        t.updater.optimizer_steps = int(ck.get("extra", {}).get("optimizer_steps", 0))
        t.backend.sync_from(t.model)
        self.metrics = state["metrics"]
        if (path / TRAJECTORIES_JSONL).is_file():
            self.buffer = TrajectoryBuffer.load(path / TRAJECTORIES_JSONL, self.cfg.cl.buffer_size)
        k, done = int(state["task"]), bool(state["task_done"])
        self.start_task, self.start_task_step = (k + 1, 0) if done else (k, int(state["task_step"]))
        for h in self.hooks:
            if isinstance(h, KLAnchor) and done and KLAnchor.name not in algo_state:
                h.post_task(t, self.domains[k])  # a checkpoint without algorithm state: the anchor = loaded weights
        self._progress = self._saved_progress = (k, int(state["task_step"]), done)
        log.info("resumed from %s: task %d (%s) %s at step %d; next: %s step %d", ck["path"], k, self.domains[k],
                 "done" if done else f"interrupted after {state['task_step']} steps", t.step,
                 self.domains[self.start_task], self.start_task_step + 1)

    def close(self) -> None:
        """Close every domain's envs, the logger and the rollout backend."""
        for d, side in self.sides.items():
            if d != self._current:
                side.close()
        self.trainer.close()


def _json_default(v):
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return str(v)
