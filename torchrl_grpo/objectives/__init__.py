"""The learning signal: group advantages, the clipped GRPO surrogate and its terms, token log-probabilities, sampling
transforms shared by rollout and update, and the shared-prefix layout of multi-turn episodes."""
