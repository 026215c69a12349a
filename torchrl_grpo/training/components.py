"""What a training loop runs: :class:`Components` (the built objects) and :class:`LoopSettings` (the plain settings
it reads). Defined here, beside the loops that consume them; :func:`torchrl_grpo.assembly.build` produces them from a
config, a test or notebook may assemble them by hand."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["Components", "LoopSettings"]


@dataclass(frozen=True)
class LoopSettings:
    """The plain settings a training loop reads (copied from the config by :func:`torchrl_grpo.assembly.build`)."""

    steps: int  # train.steps
    batch_size: int  # tasks per step
    n_samples: int  # episodes per task (group size)
    seed: int
    adv_scale: str  # loss.adv_scale (torchrl_grpo.objectives.advantage)
    adv_baseline: str  # loss.adv_baseline
    filter_zero_variance_groups: bool
    max_new_tokens: int  # gconfig.max_new_tokens (truncation warning)
    samples_per_step: int  # episodes decoded into samples.jsonl per step
    eval_every: int
    eval_at_start: bool
    eval_at_end: bool
    eval_n_problems: int
    eval_greedy: bool
    eval_pass_k: int
    checkpoint_every: int
    checkpoint_keep_last: int
    checkpoint_save_final: bool
    checkpoint_on_interrupt: bool
    progress_bar: bool
    max_staleness: int  # async only (build.max_staleness)
    config_yaml: str  # the resolved config, stored with every checkpoint
    partial_rollout_chunk: int = 0  # async only: tokens between checks for new weights (0: off)
    final_model: bool = False  # checkpoint.final_model: <run_dir>/final_model (weights + tokenizer, no optimizer) at the end


@dataclass
class Components:
    """Everything a training loop needs, built by :func:`torchrl_grpo.assembly.build`.

    ``collector`` / ``eval_collector`` sample train / greedy-eval episodes with ``backend``; ``train_tasks`` are the
    usable train task indices; ``eval_tasks()`` lists the first usable eval tasks and ``eval_baseline(tasks)`` scores
    the env's do-nothing action on them (``{}`` for envs without one); ``update`` is the optimizer side of a step.
    """

    model: torch.nn.Module
    tokenizer: Any
    backend: RolloutBackend
    sampling: SamplingConfig
    user_fn: Any  # local LLM user (None unless econfig.user / user_llm is "local")
    collector: Any
    eval_collector: Any
    train_tasks: list[int]
    eval_tasks: Callable[[], list[int]]
    eval_baseline: Callable[[list[int]], dict[str, float]]
    loss_fn: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    update: GRPOUpdate
    logger: Any
    device: torch.device
    settings: LoopSettings
    run_dir: Path
    start_step: int = 0
    load_time_s: float = 0.0
    dp: Any = None  # torchrl_grpo.distributed.data_parallel.DataParallel (None: one process)
    plan: Any = None  # torchrl_grpo.distributed.device_plan.AllocationPlan
    placement: Any = None  # torchrl_grpo.distributed.placement.Placement (this process's part of the plan, applied)

    def close(self) -> None:
        """Flush the logger, close the environments, then (even if that failed) shut the rollout backend down (a
        vLLM engine frees its memory), leave the data-parallel group and give the trainer thread its CPU mask back."""
        try:
            self.logger.close()
            self.collector.close()
            self.eval_collector.close()
        finally:
            self.backend.close()
            if self.dp is not None:
                self.dp.close()
            if self.placement is not None:
                self.placement.release()
