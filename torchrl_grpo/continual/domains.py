"""The domains of a continual run on one trainer (:class:`Domains`): which domain the trainer plays, rollouts on any
of them, and their scores.

Scores (:meth:`Domains.evaluate_task`, on the first ``eval.n_problems`` usable tasks of the domain's eval split):
``pass^1`` = greedy success rate (reward >= 1; with ``eval.greedy=false`` the sampled pass@1 of the ``eval.pass_k``
samples), ``pass^k`` = tau-bench's pass^k over ``eval.pass_k`` samples (:mod:`torchrl_grpo.rollout.evaluation`),
``reward_mean`` = greedy mean reward; with ``kl_to_base`` also ``kl_base`` (:meth:`Domains.kl_to_base`). Scoring runs
inside every hook's :meth:`~torchrl_grpo.continual.algorithms.CLAlgorithm.eval_context` (LoRA-per-domain scores a
domain with its own adapter).

The per-domain env sides and the run's config checks are built from the config by
:mod:`torchrl_grpo.assembly.continual_run`; the domain defaults and per-domain configs are
:mod:`torchrl_grpo.config.continual_domains`.
"""
from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Sequence

from tensordict import TensorDict

from torchrl_grpo.rollout.env_side import EnvSide
from torchrl_grpo.training.grpo_trainer import GRPOTrainer

__all__ = ["Domains"]


class Domains:
    """The run's env sides, one per domain, on ``trainer``'s backend.

    Args:
        trainer: the run's GRPO trainer (its environment is switched with :meth:`GRPOTrainer.use_env`).
        sides: domain -> :class:`~torchrl_grpo.rollout.env_side.EnvSide`, in task order.
        hooks: the run's algorithm hooks (their ``eval_context`` wraps scoring); the list is read at each call.
        kl_to_base: score ``kl_base`` too; without LoRA this keeps a frozen copy of the initial weights (π_0).

    Attributes:
        current: the domain the trainer trains on (None before the first task); scoring returns to it.
        base_copy: π_0 for ``kl_to_base`` without LoRA (None with LoRA: its adapters are switched off instead).
    """

    def __init__(self, trainer: GRPOTrainer, sides: dict[str, EnvSide], hooks: Sequence, *, kl_to_base: bool) -> None:
        self.trainer, self.sides, self.hooks, self.with_kl = trainer, sides, hooks, kl_to_base
        self.names = list(sides)
        self.current: str | None = None
        self.base_copy = None
        if kl_to_base and not hasattr(trainer.model, "disable_adapter"):
            self.base_copy = copy.deepcopy(trainer.model).eval().requires_grad_(False)

    def use(self, domain: str) -> None:
        """Train (and by default score) on ``domain`` from now on."""
        self.trainer.use_env(self.sides[domain])
        self.current = domain

    def collect(self, domain: str, tasks: list[dict]) -> TensorDict:
        """Roll out ``n_samples`` episodes per task (reset options) on ``domain`` with the current policy, seeded by
        the current trainer step. Returns the collector batch (TensorDict [len(tasks) * n_samples])."""
        t = self.trainer
        return self.sides[domain].collector.collect(tasks, t.settings.n_samples, step=t.step)

    def evaluate_task(self, domain: str) -> dict[str, float | None]:
        """Score the current policy on ``domain``'s eval split (module docstring): ``pass^1``, ``pass^k``
        (None when ``eval.pass_k`` is 0), ``reward_mean``, and ``k``.

        Raises:
            ValueError: ``domain`` is not one of this run's domains.
        """
        if domain not in self.sides:
            raise ValueError(f"unknown domain {domain!r}; this run's task order is {self.names}")
        t = self.trainer
        t.use_env(self.sides[domain])
        try:
            with self.eval_contexts(domain):
                ev = t.evaluate()
        finally:
            if self.current is not None:
                t.use_env(self.sides[self.current])
        k = t.settings.eval_pass_k
        return {"pass^1": ev.get("eval/accuracy", ev.get("eval/pass@1")), "pass^k": ev.get(f"eval/pass^{k}"),
                "reward_mean": ev.get("eval/reward"), "k": k}

    def score(self, domain: str) -> dict[str, float | None]:
        """:meth:`evaluate_task`, plus ``kl_base`` (:meth:`kl_to_base`) when the run asks for it."""
        s = self.evaluate_task(domain)
        if self.with_kl:
            s["kl_base"] = self.kl_to_base(domain)
        return s

    def eval_contexts(self, domain: str) -> ExitStack:
        """Every hook's ``eval_context`` for ``domain``, entered in one stack."""
        stack = ExitStack()
        for h in self.hooks:
            stack.enter_context(h.eval_context(self.trainer, domain))
        return stack

    def kl_to_base(self, domain: str) -> float:
        """Mean per-token KL(π_θ ‖ π_0) of the current policy to the untrained one on ``domain``'s eval prompts:
        ``n_samples`` episodes per eval task sampled now from π_θ, k3 estimator mean_t (r_t − 1 − log r_t) with
        r_t = π_0(a_t) / π_θ(a_t) over their response tokens (Schulman, "Approximating KL divergence", 2020: unbiased
        and never negative, where the k1 mean of −log r_t came out negative on a few dozen tokens), both under the
        sampler's processed distribution (:meth:`GRPOUpdate.fill_log_probs`). A predictor of forgetting: "RL's Razor"
        (Shenfeld et al., 2025, arXiv:2509.04259) finds forgetting tracks this KL on the old task's distribution. π_0
        is the model with its LoRA adapters switched off, or a frozen copy of the initial weights (:attr:`base_copy`).
        Returns 0.0 when no response token was sampled."""
        t = self.trainer
        tasks = [{"index": int(i)} for i in self.sides[domain].eval_tasks()]
        with self.eval_contexts(domain):
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
        return nullcontext(self.base_copy)

    def close(self) -> None:
        """Close every domain's envs but the current one's (the trainer's ``close`` closes those)."""
        for d, side in self.sides.items():
            if d != self.current:
                side.close()
