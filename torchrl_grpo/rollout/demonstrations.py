"""Demonstrations for supervised fine-tuning, as collector batches: gold replays (SFT) and the policy's own
successful episodes (rejection-sampling fine-tuning, RFT).

Gold demonstrations come from the env's optional ``demonstration(options)`` hook (:mod:`envs.contract`: tau2's gold
actions as tool calls and the stop, GSM8K's worked solution). They are not rendered by a separate code path: a
:class:`ScriptedBackend` "samples" the tokens of each demonstration message
(:meth:`torchrl_grpo.rollout.chat_tokens.ChatRenderer.assistant_ids`) through the same :class:`~torchrl_grpo.rollout.collector.
GroupCollector` and env as RL rollouts. The batch therefore has the collector's layout (``tokens``,
``response_mask`` = the demonstration's assistant tokens, ``reward`` = the env's score of the replay, ...) and holds
exactly the token-in/token-out rendering the policy later samples and the env parses; replays the env scores below
``min_reward`` (a demonstration the env does not accept as written) are dropped and counted.

RFT keeps the policy's own sampled episodes whose reward reaches ``min_reward`` (rejection sampling fine-tuning:
STaR, Zelikman et al., 2022, arXiv:2203.14465, Sec. 3.1; RFT, Yuan et al., 2023, arXiv:2308.01825, Sec. 3.3).
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch
from tensordict import TensorDict

from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
from torchrl_grpo.rollout.chat_tokens import ChatRenderer
from torchrl_grpo.rollout.collector import GroupCollector, concat_batches

__all__ = ["ScriptedBackend", "gold_demonstrations", "successful_episodes"]

log = logging.getLogger(__name__)


class ScriptedBackend(RolloutBackend):
    """A rollout backend that plays one scripted episode: its ``k``-th ``generate`` call returns the ``k``-th turn's
    token ids (log-prob 0, ``finish_reason="stop"``); past the script's end it returns an end-of-turn token alone.

    Args:
        eos_id: the token returned past the end of the script (an empty assistant turn: the env answers it as an
            unusable action and the replay scores 0, so a demonstration that does not end its episode is dropped).

    Use :meth:`play` before each ``collect`` of one task with one sample.
    """

    exact_log_probs = False

    def __init__(self, eos_id: int) -> None:
        self.eos_id = int(eos_id)
        self._turns: list[list[int]] = []
        self._next = 0

    def play(self, turns: list[list[int]]) -> None:
        """Script the next episode: ``turns[k]`` are the token ids of its ``k``-th assistant turn."""
        self._turns, self._next = [list(t) for t in turns], 0

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        """One generation for the one live episode.

        Raises:
            ValueError: more than one prompt (a scripted episode is collected alone), or an empty prompt.
        """
        if len(prompts) != 1 or not prompts[0]:
            raise ValueError(f"ScriptedBackend plays one episode at a time, got {len(prompts)} prompts")
        ids = self._turns[self._next] if self._next < len(self._turns) else [self.eos_id]
        self._next += 1
        return [Generation(token_ids=list(ids), logprobs=[0.0] * len(ids), finish_reason="stop")]

    def load_weights(self, weights) -> None:
        raise TypeError("a ScriptedBackend replays demonstrations; it has no weights to load")

    def sync_from(self, model: torch.nn.Module, *, probe: list[int] | None = None) -> None:
        raise TypeError("a ScriptedBackend replays demonstrations; it has no weights to sync")


def gold_demonstrations(collector, task_indices: Iterable[int], *, min_reward: float = 1.0,
                        progress: bool = False) -> tuple[TensorDict | None, dict[str, float]]:
    """Replay each task's gold demonstration through ``collector``'s env and keep the replays scored
    ``>= min_reward`` (module docstring).

    Args:
        collector: a :class:`~torchrl_grpo.rollout.collector.GroupCollector` (its env, tokenizer, ``max_turns`` and
            ``max_context_tokens`` are used; its backend is not: each task is played by a :class:`ScriptedBackend`
            through a collector of the same settings).
        task_indices: train-split task indices (``reset(options={"index": i})``).
        min_reward: keep replays whose env reward is at least this.
        progress: a tqdm bar over the tasks.

    Returns:
        ``(batch, stats)``: the kept episodes as one collector batch [K, T] (``None`` when none is kept), and
        ``demo/tasks``, ``demo/kept``, ``demo/reward_mean`` (of all replays), ``demo/dropped_no_demo`` (the env
        raised ``ValueError`` for the task: it has none), ``demo/assistant_tokens`` (kept),
        ``demo/episode_tokens_mean`` (kept). The tasks without a demonstration are logged once, grouped by the
        env's reason (e.g. ReasoningGym's "task 'rubiks_cube' gives its items no gold answer"), with their indices.

    Raises:
        TypeError: the env has no ``demonstration`` hook.
    """
    probe = collector.probe_env.unwrapped
    if not hasattr(probe, "demonstration"):
        raise TypeError(f"{type(probe).__name__} has no demonstration(options) hook: it ships no demonstrations "
                        "(see envs.contract); use sft.source=rft to fine-tune on the policy's own successes")
    tok = collector.tokenizer
    scripted = ScriptedBackend(tok.eos_token_id)
    player = GroupCollector(collector.make_env, scripted, tok, collector.sampling, max_turns=collector.max_turns,
                            max_context_tokens=collector.max_context_tokens, seed=collector.seed)
    renderer = ChatRenderer(tok)  # an assistant turn renders the same with or without tool schemas (system turn)
    indices = [int(i) for i in task_indices]
    kept, rewards, no_demo = [], [], 0
    missing: dict[str, list[int]] = {}  # the env's reason -> the tasks it gave it for
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(indices), desc="gold demonstrations", unit="task", leave=False)
    try:
        for i in indices:
            try:
                messages = probe.demonstration({"index": i})
            except ValueError as exc:
                missing.setdefault(str(exc), []).append(i)
                no_demo += 1
                continue
            scripted.play([renderer.assistant_ids(m) for m in messages])
            td = player.collect([{"index": i}], 1)
            r = float(td["reward"][0])
            rewards.append(r)
            if r >= min_reward and not bool(td["context_truncated"][0]) and not bool(td["infra_error"][0]):
                kept.append(td)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        player.close()
    batch = concat_batches(kept, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id) if kept else None
    stats = {
        "demo/tasks": float(len(indices)),
        "demo/kept": float(len(kept)),
        "demo/reward_mean": float(sum(rewards) / len(rewards)) if rewards else 0.0,
        "demo/dropped_no_demo": float(no_demo),
        "demo/assistant_tokens": float(batch["response_mask"].sum()) if batch is not None else 0.0,
        "demo/episode_tokens_mean": float(batch["attention_mask"].sum(-1).float().mean()) if batch is not None else 0.0,
    }
    if missing:
        log.warning("gold demonstrations: %d of %d tasks have no demonstration: %s", no_demo, len(indices),
                    "; ".join(f"{why} ({len(ix)} tasks: {', '.join(map(str, ix[:10]))}{', ...' if len(ix) > 10 else ''})"
                              for why, ix in missing.items()))
    if len(kept) < len(indices):
        log.info("gold demonstrations: kept %d of %d tasks (replay reward >= %g)", len(kept), len(indices), min_reward)
    return batch, stats


def successful_episodes(batch: TensorDict, min_reward: float = 1.0) -> TensorDict | None:
    """The episodes of a collected batch that rejection sampling keeps: reward ``>= min_reward``, not cut at the
    context limit, no infrastructure failure, at least one sampled token. ``None`` when none qualifies."""
    ok = ((batch["reward"] >= min_reward) & ~batch["context_truncated"] & ~batch["infra_error"]
          & (batch["response_mask"].sum(-1) > 0))
    if not bool(ok.any()):
        return None
    return batch[ok.nonzero().squeeze(-1)]
