"""Devices and processes: the device plan (which GPU or cores does what), CPU core placement, and data parallelism
(torchrun DDP / FSDP2 helpers)."""
from torchrl_grpo._moved import forward as _forward

__getattr__ = _forward(__name__)  # old ``torchrl_grpo.distributed.X`` (now .data_parallel), one release
