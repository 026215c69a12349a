"""Group rollout collector: runs ``n_samples`` episodes per task against text Gymnasium envs, batching
every model call across all live episodes, token-in/token-out.

Per turn, every live episode's accumulated token ids go to the backend in one ``generate`` call; the sampled
tokens and their behaviour log-probs are appended as-is (assistant mask 1), the decoded text is sent to the
env as the action, and the env's new messages (tool results, user replies) are appended as chat-template tokens
(assistant mask 0). Earlier turns are never re-tokenised. An episode that would exceed ``max_context_tokens``
is cut there and flagged ``context_truncated`` (reward 0: the env never scored it).

Output: one TensorDict row per episode, batch size [N] with N = n_tasks * n_samples, padded (right) to the
longest episode T:

=====================  ============  =====================================================================
key                    shape/dtype   meaning
=====================  ============  =====================================================================
tokens                 [N, T] long   whole episode (prompt, assistant turns, env turns)
attention_mask         [N, T] bool   real tokens
response_mask          [N, T] bool   tokens the policy sampled (assistant mask)
sample_log_probs       [N, T] float  behaviour log-prob of each sampled token (nats), 0 elsewhere
reward                 [N] float     final env reward
group_id               [N] long      episodes of the same task in this batch share it
policy_version         [N] long      backend policy version at the episode's first generation
prompt_length          [N] long      tokens before the first assistant turn
response_tokens        [N] long      number of sampled tokens
num_turns              [N] long      assistant turns
action_errors          [N] long      turns whose action the env could not use (``info["action_error"]``:
                                     malformed tool call, empty message)
terminated/truncated   [N] bool      env flags at the end
context_truncated      [N] bool      cut at ``max_context_tokens``
length_truncated       [N] bool      the episode's last generation stopped at ``max_new_tokens`` (backend
                                     ``finish_reason == "length"``): an unfinished attempt, e.g. reasoning cut
                                     off before its final answer. The env cannot see this; the trainer logs its
                                     mean as ``episode/truncated_fraction`` (the guard against rewards that make
                                     cut-off reasoning score below a short answer, issue 14)
infra_error            [N] bool      the episode ended on an infrastructure failure, not on the policy: the env
                                     raised (``termination_reason`` ``env_error``) or its customer simulator failed
                                     (``user_error``); its reward says nothing about the policy (the trainer drops
                                     the whole group)
=====================  ============  =====================================================================

plus non-tensor entries ``task`` (the reset options) and ``info`` (the env's final info dict, with
``messages``), kept for logging and evaluation.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import gymnasium as gym
import torch
from tensordict import NonTensorStack, TensorDict

from .backends.base import RolloutBackend, SamplingConfig
from .chat_tokens import ChatRenderer

__all__ = ["GroupCollector", "Episode", "INFRA_TERMINATIONS"]

#: ``info["termination_reason"]`` values that mean the episode failed for reasons outside the policy: an env
#: exception caught by the collector, or tau2's customer simulator failing (``user_error``).
INFRA_TERMINATIONS = frozenset({"env_error", "user_error"})


log = logging.getLogger(__name__)


@dataclass
class Episode:
    """Mutable state of one episode during collection."""

    group_id: int
    task: dict
    env: gym.Env
    tokens: list[int] = field(default_factory=list)
    response_mask: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    reward: float = 0.0
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    context_truncated: bool = False
    length_truncated: bool = False
    infra_error: bool = False
    num_turns: int = 0
    action_errors: int = 0
    policy_version: int = -1
    info: dict = field(default_factory=dict)
    renderer: ChatRenderer | None = None

    def extend(self, ids: list[int], sampled: bool, lps: list[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.response_mask.extend([sampled] * len(ids))
        self.log_probs.extend(lps if lps is not None else [0.0] * len(ids))


class GroupCollector:
    """Collects GRPO groups from text envs with a rollout backend.

    Args:
        make_env: zero-argument callable returning a Gymnasium env that follows the project's env contract
            (``reset(options=task)`` → chat messages; ``step(text)``; ``info["tools"]`` optional).
        backend: the rollout engine.
        tokenizer: HF tokenizer with a chat template (its eos ends assistant turns).
        sampling: sampling settings (``stop_token_ids`` defaults to the end-of-turn ids).
        max_turns: most assistant turns per episode (envs usually end earlier).
        max_context_tokens: longest episode in tokens; longer ones are cut and flagged.
        seed: base seed; the batch at ``step`` samples with seeds derived from (seed, step, turn).

    Raises:
        ValueError: bad sizes.
    """

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        backend: RolloutBackend,
        tokenizer,
        sampling: SamplingConfig,
        *,
        max_turns: int = 1,
        max_context_tokens: int = 2048,
        seed: int = 0,
        user_batcher=None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if max_context_tokens < 8:
            raise ValueError("max_context_tokens must be >= 8")
        self.make_env = make_env
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.seed = seed
        self.user_batcher = user_batcher
        self._pool: list[gym.Env] = []
        self._renderers: dict[str, ChatRenderer] = {}
        probe = ChatRenderer(tokenizer)
        self.end_of_turn = probe.end_of_turn_ids()
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=sorted(self.end_of_turn))
        self.sampling = sampling
        self.last_stats: dict[str, float] = {}

    def _run_all(self, fns: list[Callable[[], Any]]) -> list[Any]:
        """Run env resets/steps; each result is the return value or the exception raised.

        With a ``user_batcher`` (:class:`torchrl_grpo.local_user.LocalUser`) they run in threads inside its
        ``batched`` scope, so the customer replies they ask for are generated in one batched backend call."""
        results: list[Any] = [None] * len(fns)
        threaded = self.user_batcher is not None and len(fns) > 1

        def run(i: int) -> None:
            try:
                if threaded:
                    self.user_batcher.step_begin(i)
                results[i] = fns[i]()
            except Exception as exc:
                results[i] = exc
            finally:
                if threaded:
                    self.user_batcher.step_done()

        if not threaded:
            for i in range(len(fns)):
                run(i)
            return results
        with self.user_batcher.batched(len(fns)):
            threads = [threading.Thread(target=run, args=(i,), name=f"env-step-{i}") for i in range(len(fns))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return results

    def _renderer(self, tools: list[dict] | None) -> ChatRenderer:
        import json

        key = json.dumps(tools, sort_keys=True) if tools else ""
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools)
        return self._renderers[key]

    def _envs(self, n: int) -> list[gym.Env]:
        while len(self._pool) < n:
            self._pool.append(self.make_env())
        return self._pool[:n]

    def collect(
        self,
        tasks: list[dict],
        n_samples: int,
        *,
        step: int = 0,
        sampling: SamplingConfig | None = None,
    ) -> TensorDict:
        """Roll out ``n_samples`` episodes for each task.

        Args:
            tasks: reset options per task (e.g. ``{"index": 3}`` or ``{"task_id": "7"}``).
            n_samples: group size G.
            step: trainer step, used to derive sampling seeds.
            sampling: overrides the collector's sampling settings (e.g. greedy for evaluation).

        Returns:
            TensorDict [len(tasks) * n_samples] (see module docstring). ``self.last_stats`` holds timing and
            token counts of this call.
        """
        if not tasks:
            raise ValueError("collect() needs at least one task")
        if n_samples < 1:
            raise ValueError("n_samples must be >= 1")
        sampling = sampling or self.sampling
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=sorted(self.end_of_turn))
        t0 = time.perf_counter()
        envs = self._envs(len(tasks) * n_samples)
        episodes: list[Episode] = []
        jobs = [(g, task, g * n_samples + s) for g, task in enumerate(tasks) for s in range(n_samples)]
        resets = self._run_all([
            (lambda e=envs[i], i=i, task=task: e.reset(seed=self.seed + step * 100_003 + i, options=dict(task)))
            for g, task, i in jobs
        ])
        for res in resets:
            if isinstance(res, Exception):
                raise res
        for (g, task, i), (obs, info) in zip(jobs, resets):
            ren = self._renderer(info.get("tools"))
            ep = Episode(group_id=g, task=dict(task), env=envs[i], renderer=ren, info=info)
            ep.extend(ren.prompt_ids(list(obs)), sampled=False)
            ep.prompt_length = len(ep.tokens)
            if ep.prompt_length >= self.max_context_tokens:
                ep.done = ep.context_truncated = True
            episodes.append(ep)
        over = [e.prompt_length for e in episodes if e.context_truncated]
        if over:
            log.warning("%d of %d episodes start with a prompt of %d+ tokens, at or over max_context_tokens=%d: they "
                        "end unplayed (context_truncated, reward 0); raise rollout.max_context_tokens (and the model's "
                        "context) or shorten the prompt", len(over), len(episodes), min(over), self.max_context_tokens)
        gen_time, gen_tokens, env_time = 0.0, 0, 0.0
        for turn in range(self.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            turn_seed = (self.seed * 1_000_003 + step * 1009 + turn + (sampling.seed or 0)) % (2**31)
            turn_sampling = replace(sampling, seed=turn_seed)
            tg = time.perf_counter()
            gens = self.backend.generate([e.tokens for e in live], turn_sampling)
            gen_time += time.perf_counter() - tg
            te = time.perf_counter()
            stepping: list[tuple[Episode, list[int], str]] = []
            for ep, gen in zip(live, gens):
                if ep.policy_version < 0:
                    ep.policy_version = self.backend.policy_version
                room = self.max_context_tokens - len(ep.tokens)
                ids, lps = gen.token_ids[:room], gen.logprobs[:room]
                gen_tokens += len(ids)
                ep.extend(ids, sampled=True, lps=lps)
                ep.num_turns += 1
                ep.length_truncated = gen.finish_reason == "length"  # of the latest generation
                if len(gen.token_ids) > room:
                    ep.done = ep.context_truncated = True
                    continue
                stepping.append((ep, ids, self.tokenizer.decode(ids, skip_special_tokens=True)))
            results = self._run_all([(lambda e=ep, t=text: e.env.step(t)) for ep, _, text in stepping])
            for (ep, ids, _), res in zip(stepping, results):
                if isinstance(res, Exception):  # an env bug must not kill a training run: end the episode, keep the data
                    ep.done = ep.infra_error = True
                    ep.info = {**ep.info, "error": f"{type(res).__name__}: {res}", "termination_reason": "env_error"}
                    continue
                obs, reward, terminated, truncated, info = res
                ep.info = info
                if info.get("action_error"):
                    ep.action_errors += 1
                ep.reward = float(reward)
                ep.terminated, ep.truncated = bool(terminated), bool(truncated)
                if info.get("termination_reason") in INFRA_TERMINATIONS:
                    ep.infra_error = True
                if terminated or truncated:
                    ep.done = True
                    continue
                if turn == self.max_turns - 1:
                    ep.done = ep.truncated = True
                    continue
                # close the assistant turn the way the template would, then append the env's messages
                closing = [] if (ids and ids[-1] in self.end_of_turn) else [self.tokenizer.eos_token_id]
                cont = closing + ep.renderer.assistant_suffix + ep.renderer.continuation_ids(list(obs))
                if len(ep.tokens) + len(cont) >= self.max_context_tokens:
                    ep.done = ep.context_truncated = True
                    continue
                ep.extend(cont, sampled=False)
            env_time += time.perf_counter() - te
        for ep in episodes:
            if not ep.done:  # ran out of turns
                ep.done = ep.truncated = True
        td = self._to_tensordict(episodes)
        wall = time.perf_counter() - t0
        self.last_stats = {
            "rollout/time_s": wall,
            "rollout/generate_time_s": gen_time,
            "rollout/env_time_s": env_time,
            "rollout/generated_tokens": float(gen_tokens),
            "rollout/tokens_per_s": gen_tokens / gen_time if gen_time > 0 else 0.0,
            "rollout/episodes": float(len(episodes)),
        }
        return td

    def _to_tensordict(self, episodes: list[Episode]) -> TensorDict:
        N = len(episodes)
        T = max(len(e.tokens) for e in episodes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        tokens = torch.full((N, T), pad, dtype=torch.long)
        attn = torch.zeros((N, T), dtype=torch.bool)
        rmask = torch.zeros((N, T), dtype=torch.bool)
        lps = torch.zeros((N, T), dtype=torch.float32)
        for i, e in enumerate(episodes):
            L = len(e.tokens)
            tokens[i, :L] = torch.tensor(e.tokens, dtype=torch.long)
            attn[i, :L] = True
            rmask[i, :L] = torch.tensor(e.response_mask, dtype=torch.bool)
            lps[i, :L] = torch.tensor(e.log_probs, dtype=torch.float32)
        td = TensorDict(
            {
                "tokens": tokens,
                "attention_mask": attn,
                "response_mask": rmask,
                "sample_log_probs": lps,
                "reward": torch.tensor([e.reward for e in episodes], dtype=torch.float32),
                "group_id": torch.tensor([e.group_id for e in episodes], dtype=torch.long),
                "policy_version": torch.tensor([e.policy_version for e in episodes], dtype=torch.long),
                "prompt_length": torch.tensor([e.prompt_length for e in episodes], dtype=torch.long),
                "response_tokens": rmask.sum(-1),
                "num_turns": torch.tensor([e.num_turns for e in episodes], dtype=torch.long),
                "action_errors": torch.tensor([e.action_errors for e in episodes], dtype=torch.long),
                "terminated": torch.tensor([e.terminated for e in episodes], dtype=torch.bool),
                "truncated": torch.tensor([e.truncated for e in episodes], dtype=torch.bool),
                "context_truncated": torch.tensor([e.context_truncated for e in episodes], dtype=torch.bool),
                "length_truncated": torch.tensor([e.length_truncated for e in episodes], dtype=torch.bool),
                "infra_error": torch.tensor([e.infra_error for e in episodes], dtype=torch.bool),
            },
            batch_size=[N],
        )
        td["task"] = NonTensorStack(*[e.task for e in episodes])
        td["info"] = NonTensorStack(*[_slim_info(e.info) for e in episodes])
        return td

    def close(self) -> None:
        for env in self._pool:
            env.close()
        self._pool.clear()


def _slim_info(info: dict[str, Any]) -> dict[str, Any]:
    """Keep the parts of an env info dict worth logging (drops tool schemas)."""
    return {k: v for k, v in info.items() if k != "tools"}
