"""A continual run built from its config: :func:`build_continual_trainer` (what :func:`torchrl_grpo.build.build_trainer`
returns when ``cl.task_order`` is set)."""
from __future__ import annotations

from pathlib import Path

from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.build.components import build
from torchrl_grpo.continual.trainer import ContinualTrainer

__all__ = ["build_continual_trainer"]


def build_continual_trainer(cfg, run_dir: str | Path | None, *, trainer_cls: type = ContinualTrainer, model=None,
                            tokenizer=None, backend: RolloutBackend | None = None, **trainer_kw) -> ContinualTrainer:
    """The :class:`~torchrl_grpo.continual.trainer.ContinualTrainer` (or ``trainer_cls``, a subclass) of ``cfg``:
    :func:`~torchrl_grpo.build.components.build` is its ``build_components`` (called after its checks, for the
    first domain's config, with the preloaded ``model`` / ``tokenizer`` / ``backend`` if given).
    ``**trainer_kw``: further keyword arguments of the class (``algorithm=``)."""
    def build_components(domain_cfg, domain_run_dir):
        return build(domain_cfg, domain_run_dir, model=model, tokenizer=tokenizer, backend=backend)

    return trainer_cls(cfg, run_dir, build_components=build_components, **trainer_kw)
