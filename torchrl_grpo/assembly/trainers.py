"""Which loop a config asks for, and that loop built from it: ``build_trainer(cfg, run_dir) -> trainer``.

The components come from :func:`torchrl_grpo.assembly.phases.build`; the trainer classes receive them and never read
a config section.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.assembly.phases import build
from torchrl_grpo.assembly.continual_run import build_continual_trainer
from torchrl_grpo.config import check_sft_run
from torchrl_grpo.continual.trainer import ContinualTrainer
from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.training.sft_trainer import SFTSettings, SFTTrainer, read_sft_resume, sft_update

__all__ = ["build_trainer", "trainer_class", "sft_settings"]


def trainer_class(cfg) -> type:
    """The loop a config asks for: :class:`~torchrl_grpo.continual.trainer.ContinualTrainer` when ``cl.task_order``
    is set, :class:`~torchrl_grpo.training.async_trainer.AsyncGRPOTrainer` for ``mode=async``, else
    :class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer` (``sft.py`` names
    :class:`~torchrl_grpo.training.sft_trainer.SFTTrainer` itself)."""
    if OmegaConf.select(cfg, "cl.task_order"):
        return ContinualTrainer
    return AsyncGRPOTrainer if cfg.mode == "async" else GRPOTrainer


def sft_settings(cfg) -> SFTSettings:
    """``sft.*`` and the ``optimizer.*`` schedule values of an SFT run (:class:`~torchrl_grpo.training.sft_trainer.SFTSettings`)."""
    s, o = cfg.sft, cfg.optimizer
    return SFTSettings(source=s.source, epochs=s.epochs, minibatch_size=s.minibatch_size, min_reward=s.min_reward,
                       rft_rounds=s.rft_rounds, rft_samples=s.rft_samples, save_model=s.save_model, lr=o.lr,
                       scheduler=o.scheduler, warmup_steps=o.warmup_steps)


def build_trainer(cfg, run_dir: str | Path | None, *, trainer_cls: type | None = None, model=None, tokenizer=None,
                  backend: RolloutBackend | None = None, **trainer_kw):
    """Build a run's trainer from its config: the components (:func:`build`) handed to the trainer class.

    Args:
        cfg: the config (an OmegaConf node of :class:`torchrl_grpo.config.GRPOConfig`).
        run_dir: output directory (a continual run: default ``cfg.output_dir``, else ``outputs/continual``).
        trainer_cls: the loop; default :func:`trainer_class` ``(cfg)``. A GRPO-style class (``GRPOTrainer`` and its
            subclasses) gets ``build(cfg, run_dir, own_backend_copy=trainer_cls.own_backend_copy)``; a
            ``ContinualTrainer`` is built by :func:`torchrl_grpo.assembly.continual_run.build_continual_trainer` (checks,
            :func:`build` on the first domain's config, one env side per domain); ``SFTTrainer`` is refused Ray workers first (:func:`torchrl_grpo.config.check_sft_run`),
            reads ``train.resume_from``'s SFT state before the model loads
            (:func:`~torchrl_grpo.training.sft_trainer.read_sft_resume`: a non-SFT checkpoint is refused there) and
            gets :func:`sft_settings`, the SFT update (:func:`~torchrl_grpo.training.sft_trainer.sft_update`) and
            that state.
        model / tokenizer / backend: optional preloaded policy and rollout backend (tests, notebooks), passed to
            :func:`build`.
        **trainer_kw: further keyword arguments of the trainer class (``algorithm=`` of a continual run).

    Returns:
        The trainer, ready to ``fit()`` (``train()`` for a continual run); a GRPO-style or SFT trainer with
        ``trainer.cfg = cfg`` (for callers: the trainer never reads it).

    Raises:
        ValueError, FileNotFoundError: as :func:`build` and the trainer class.
    """
    cls = trainer_cls or trainer_class(cfg)
    if issubclass(cls, ContinualTrainer):
        return build_continual_trainer(cfg, run_dir, trainer_cls=cls, model=model, tokenizer=tokenizer,
                                       backend=backend, **trainer_kw)
    sft_resume = None
    if issubclass(cls, SFTTrainer):
        check_sft_run(cfg)  # before build(): it would start the Ray workers
        if cfg.train.resume_from and not cfg.eval_only:  # before the model loads: an SFT checkpoint, where its
            sft_resume = read_sft_resume(cfg.train.resume_from)  # recipe stands (eval_only: any weights)
    components = build(cfg, run_dir, model=model, tokenizer=tokenizer, backend=backend,
                       own_backend_copy=cls.own_backend_copy)
    if issubclass(cls, SFTTrainer):
        trainer_kw = {"settings": sft_settings(cfg), "update": sft_update(components.update), "resume": sft_resume,
                      **trainer_kw}
    trainer = cls(components, **trainer_kw)
    trainer.cfg = cfg  # the config it was built from, for callers (the trainer itself never reads it)
    return trainer
