"""Episode-level metrics of one collected batch (rewards, lengths, turns, action errors, termination reasons), the
length-hacking guard, and the decoded example rows of ``samples.jsonl``.

Every metric is a mean over the batch's episodes (B = ``batch_size * n_samples`` rows of the collector's TensorDict,
see :mod:`torchrl_grpo.rollout.collector`), except ``episode/action_error_rate`` (action errors per turn: a ratio of sums),
``termination/<reason>`` (fraction of episodes that ended for that reason) and ``rollout/grader_timeouts`` /
``rollout/grader_memory_failures`` / ``rollout/grader_errors`` (the number of episodes whose final ``info`` flags a grader that
ran past its CPU / wall bound, its memory bound, or raised: a count per step, so a run sees its grader timing out).
"""
from __future__ import annotations

import logging

from tensordict import TensorDict

__all__ = ["episode_metrics", "LengthGuard", "sample_rows", "non_tensor_list"]

log = logging.getLogger(__name__)
#: The env's grader-failure flags (``info["grader_timeout"]`` etc., envs.contract's GRADER_FAILURE_KINDS; the
#: trainer does not import envs) -> the metric that counts them.
GRADER_FAILURES = {"grader_timeout": "rollout/grader_timeouts", "grader_memory": "rollout/grader_memory_failures",
                   "grader_error": "rollout/grader_errors"}


def non_tensor_list(batch: TensorDict, key: str) -> list:
    """A non-tensor column of a collected batch (``task``, ``info``) as a Python list, one entry per episode."""
    col = batch[key]
    return col.tolist() if hasattr(col, "tolist") else list(col)


def episode_metrics(batch: TensorDict) -> dict[str, float]:
    """Reward and episode statistics of ``batch`` (see the module docstring)."""
    r = batch["reward"]
    infos = non_tensor_list(batch, "info")
    out = {
        "reward/mean": r.mean().item(), "reward/std": r.std().item() if r.numel() > 1 else 0.0,
        "reward/max": r.max().item(), "reward/success_rate": (r >= 1.0).float().mean().item(),
        "episode/response_tokens": batch["response_tokens"].float().mean().item(),
        "episode/total_tokens": batch["attention_mask"].sum(-1).float().mean().item(),
        "episode/turns": batch["num_turns"].float().mean().item(),
        "episode/context_truncated": batch["context_truncated"].float().mean().item(),
        "episode/truncated_fraction": batch["length_truncated"].float().mean().item(),
        "episode/empty_response_fraction": (batch["response_tokens"] == 0).float().mean().item(),
        "episode/action_errors": batch["action_errors"].float().mean().item(),
        "episode/action_error_rate": (batch["action_errors"].sum() / batch["num_turns"].sum().clamp_min(1)).item(),
    }
    reasons: dict[str, int] = {}
    for i in infos:
        if isinstance(i, dict) and i.get("termination_reason"):
            reasons[str(i["termination_reason"])] = reasons.get(str(i["termination_reason"]), 0) + 1
    for k, v in reasons.items():
        out[f"termination/{k}"] = v / len(infos)
    for flag, name in GRADER_FAILURES.items():  # episodes whose grader (envs.grader_process) failed: a count per step
        out[name] = float(sum(1 for i in infos if isinstance(i, dict) and i.get(flag) is True))
    return out


class LengthGuard:
    """Warns against length-driven reward hacking (issue 14: a format credit made a wrong one-line answer beat
    reasoning cut off at ``max_new_tokens``, and responses shrank 236 -> 52 tokens while accuracy fell): when the
    mean response length falls below 40% of the first step's, and when over half the episodes hit
    ``max_new_tokens``."""

    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.first_response_tokens: float | None = None

    def check(self, metrics: dict[str, float], step: int) -> None:
        """Log the warnings for the :func:`episode_metrics` of trainer step ``step`` (1-based)."""
        resp, trunc = metrics["episode/response_tokens"], metrics["episode/truncated_fraction"]
        if self.first_response_tokens is None:
            self.first_response_tokens = resp
        elif resp < 0.4 * self.first_response_tokens:
            log.warning("step %d: mean response length %.1f tokens is below 40%% of the first step's %.1f: the policy "
                        "may be learning to skip reasoning (check the reward for credit a short answer can earn, "
                        "e.g. econfig.format_reward)", step, resp, self.first_response_tokens)
        if trunc > 0.5:
            log.warning("step %d: %.0f%% of episodes were truncated at max_new_tokens=%d (unfinished attempts score "
                        "as failures); raise gconfig.max_new_tokens", step, 100 * trunc, self.max_new_tokens)


def sample_rows(batch: TensorDict, tokenizer, k: int) -> list[dict]:
    """The first episode of each of the first ``k`` groups, decoded after its prompt (``samples.jsonl`` rows:
    ``group_id``, ``task``, ``reward``, ``response_tokens``, ``text``)."""
    gids = batch["group_id"].tolist()
    firsts = [i for i, g in enumerate(gids) if i == 0 or gids[i - 1] != g][:k]
    tasks = non_tensor_list(batch, "task")
    out = []
    for i in firsts:
        row = batch[i]
        ids = row["tokens"][row["attention_mask"]][int(row["prompt_length"]):]  # everything after the prompt
        out.append({"group_id": gids[i], "task": tasks[i], "reward": float(row["reward"]),
                    "response_tokens": int(row["response_mask"].sum()),
                    "text": tokenizer.decode(ids, skip_special_tokens=False)})
    return out
