"""Turning episodes into weights: the update (micro-batches, gradient accumulation, anchors), the GRPO / async / SFT
trainers, checkpoints and interrupts."""
