"""What a training loop runs: :class:`Components` (the built objects) and :class:`LoopSettings` (the plain settings
it reads). Defined here, beside the loops that consume them; :func:`torchrl_grpo.assembly.build` produces them from a
config, a test or notebook may assemble them by hand."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.training.update import GRPOUpdate

if TYPE_CHECKING:  # a trainer never imports the env side's constructors (and envs) itself: build() hands them over
    from torchrl_grpo.rollout.env_side import EnvSide

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

    ``env_side`` is the environment the loop trains and evaluates on (:class:`~torchrl_grpo.rollout.env_side.EnvSide`:
    the train / greedy-eval collectors sampling with ``backend``, the usable train task indices, the eval tasks and
    the do-nothing baseline, each listed once); it is the one owner of those: the trainer, its evaluator and
    :meth:`close` read them through this field, and a continual run switches env by replacing it
    (:meth:`torchrl_grpo.training.grpo_trainer.GRPOTrainer.use_env`). ``update`` is the optimizer side of a step.
    """

    model: torch.nn.Module
    tokenizer: Any
    backend: RolloutBackend
    sampling: SamplingConfig
    env_side: EnvSide
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
            self.env_side.close()
        finally:
            self.backend.close()
            if self.dp is not None:
                self.dp.close()
            if self.placement is not None:
                self.placement.release()
