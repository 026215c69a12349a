"""The plain settings a continual run reads (:class:`ContinualSettings`), made once from the ``cl`` section by
:func:`torchrl_grpo.assembly.continual_run.continual_settings`; a test or notebook may write them by hand."""
from __future__ import annotations

from dataclasses import dataclass

from torchrl_grpo.config.choices import CL_METRICS

__all__ = ["ContinualSettings"]


@dataclass(frozen=True)
class ContinualSettings:
    """What :class:`torchrl_grpo.continual.trainer.ContinualTrainer` reads, beside its components.

    Raises:
        ValueError: no domain, a domain listed twice, ``num_steps_per_task < 1``, ``eval_interval < 0``,
            ``buffer_size < 1`` or a ``metric`` outside :data:`torchrl_grpo.config.choices.CL_METRICS`
            (the config is checked earlier, with the config's names, by
            :func:`torchrl_grpo.config.continual_domains.validate_cl_settings`).
    """

    domains: tuple[str, ...]  # cl.task_order: one task per domain, in this order
    num_steps_per_task: int  # cl.num_steps_per_task (a joint run: num_steps_per_task * len(domains) steps)
    eval_interval: int  # cl.eval_interval: score every domain every this many steps of a task (0: at boundaries only)
    metric: str  # cl.metric: the score in the accuracy matrix R (pass^1 | pass^k | reward_mean)
    save_checkpoints: bool  # cl.save_checkpoints: checkpoint_task_{k}/ at each boundary
    kl_to_base: bool  # cl.kl_to_base: each score row also has kl_base (ContinualTrainer.kl_to_base)
    kl_anchor: bool  # cl.kl_coef > 0: the KLAnchor hook runs beside the algorithm
    buffer_size: int  # cl.buffer_size: episodes the trajectory buffer keeps per domain
    config_yaml: str = ""  # the resolved run config, stored in every task checkpoint (config.yaml, step_<n>/)

    def __post_init__(self) -> None:
        d = tuple(str(x) for x in self.domains)
        object.__setattr__(self, "domains", d)
        if not d or len(set(d)) != len(d):
            raise ValueError(f"domains must be non-empty and distinct, got {list(d)}")
        if self.num_steps_per_task < 1 or self.eval_interval < 0 or self.buffer_size < 1:
            raise ValueError(f"need num_steps_per_task >= 1, eval_interval >= 0, buffer_size >= 1; got "
                             f"{self.num_steps_per_task}, {self.eval_interval}, {self.buffer_size}")
        if self.metric not in CL_METRICS:
            raise ValueError(f"metric {self.metric!r} is not one of {CL_METRICS}")
