"""What a run shows: the metrics logger (jsonl, wandb, progress bar) and the learning-curve PNG with interval
statistics."""
