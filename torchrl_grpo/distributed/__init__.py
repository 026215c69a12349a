"""Devices and processes: the device plan (which GPU or cores does what), CPU core placement, and data parallelism
(torchrun DDP / FSDP2 helpers)."""
