"""Continual learning across domains: the continual trainer, the algorithms (replay, penalties), the domain
sequence, transfer metrics (backward/forward transfer, forgetting) with their plots, and the trajectory buffer."""
from torchrl_grpo._moved import forward as _forward

__getattr__ = _forward(__name__)  # old ``torchrl_grpo.continual.X`` (now .transfer), one release
