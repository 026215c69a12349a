"""Group rollout collector: a TorchRL collector (:class:`torchrl.collectors.BaseCollector`) that runs
``n_samples`` episodes per task on the TorchRL env :class:`envs.adapters.torchrl_env.TextEnv`, batching every model call
across all live episodes, token-in/token-out.

Data path of one batch (``N = n_tasks * n_samples`` episodes, one ``TextEnv`` of batch size ``[N]``)::

    TextEnv.reset(options [N])  -> "observation" (first messages), "tools"   -> prompt token ids
    per turn:  backend.generate(token ids of the live episodes)           -> sampled ids + behaviour log-probs
               TextEnv.step("action" [N] text, "_step" [N] live mask)     -> "observation" (new messages),
                                                                             "reward", "terminated", "truncated", "info"
               token ids += sampled ids (assistant mask 1) + the new messages as chat-template ids (mask 0)

Per turn, every live episode's accumulated token ids go to the backend in one ``generate`` call; the sampled
tokens and their behaviour log-probs are appended as-is (assistant mask 1), the decoded text is the env's
action, and the env's new messages (tool results, user replies) are appended as chat-template tokens
(assistant mask 0). Earlier turns are never re-tokenised (``TextEnv`` is built without a tokenizer: its
re-rendered prompts are for TorchRL's LLM wrappers, not for this collector). An episode that would exceed
``max_context_tokens`` is cut there and flagged ``context_truncated`` (reward 0: the env never scored it). An env
that raises ends its own episode (``TextEnv(catch_env_errors=True)``: ``infra_error``), never the batch.

As a TorchRL collector: iterating yields one batch per trainer step for the ``tasks(step)`` it was built with;
:meth:`GroupCollector.update_policy_weights_` syncs the rollout backend from the trained model;
:meth:`~GroupCollector.set_seed`, :meth:`~GroupCollector.state_dict` / :meth:`~GroupCollector.load_state_dict`
and :meth:`~GroupCollector.shutdown` as for any TorchRL collector. A trainer that picks the tasks of each step
itself calls :meth:`GroupCollector.collect` directly.

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
policy_version         [N] long      oldest policy version of the episode's sampled tokens (the backend's version
                                     at its first generation)
token_policy_version   [N, T] long   policy version that sampled each token (``Generation.versions``; the backend's
                                     version after the call when it records none), -1 off ``response_mask``; two
                                     or more versions in one episode with partial rollouts (async mode)
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

import enum
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import gymnasium as gym
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from tensordict import is_non_tensor as _is_non_tensor
from torchrl.collectors import BaseCollector

from envs.adapters.torchrl_env import TextEnv

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.rollout.chat_tokens import ChatRenderer

__all__ = ["GroupCollector", "Episode", "EndReason", "INFRA_TERMINATIONS", "concat_batches"]

#: ``info["termination_reason"]`` values that mean the episode failed for reasons outside the policy: an env
#: exception caught by the collector, or tau2's customer simulator failing (``user_error``).
INFRA_TERMINATIONS = frozenset({"env_error", "user_error"})


log = logging.getLogger(__name__)


class EndReason(enum.Enum):
    """Why an episode stopped being played (:attr:`Episode.end_reason`; set once, by :meth:`Episode.end`)."""

    ENV = "env"  # the env's step returned terminated or truncated
    TURN_LIMIT = "turn_limit"  # max_turns assistant turns played: reported as truncated
    CONTEXT = "context"  # the prompt, a generation or an env reply reached max_context_tokens: context_truncated
    ENV_ERROR = "env_error"  # the env raised (TextEnv ended the episode): infra_error, its data kept


@dataclass
class Episode:
    """Mutable state of one episode during collection.

    Its status is :attr:`end_reason` (None while it is played), the env's own flags and reward of its last step
    (:meth:`record_step`), and whether its latest generation stopped at ``max_new_tokens`` (``length_truncated``);
    the batch's flags ``done``, ``truncated``, ``context_truncated`` and ``infra_error`` are read from them.
    """

    group_id: int
    task: dict
    index: int  # its env's position in the batch TextEnv
    tokens: list[int] = field(default_factory=list)
    response_mask: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # policy version per token, -1 for tokens not sampled
    prompt_length: int = 0
    reward: float = 0.0
    end_reason: EndReason | None = None
    terminated: bool = False  # the env's flag at its last step
    env_truncated: bool = False  # the env's flag at its last step
    length_truncated: bool = False  # the latest generation's finish_reason was "length"
    infra_reported: bool = False  # a step's info["termination_reason"] was one of INFRA_TERMINATIONS
    num_turns: int = 0
    action_errors: int = 0
    policy_version: int = -1
    info: dict = field(default_factory=dict)
    renderer: ChatRenderer | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def truncated(self) -> bool:
        """The env truncated it, or it ran out of turns."""
        return self.env_truncated or self.end_reason is EndReason.TURN_LIMIT

    @property
    def context_truncated(self) -> bool:
        return self.end_reason is EndReason.CONTEXT

    @property
    def infra_error(self) -> bool:
        """The env raised, or reported an infrastructure failure (:data:`INFRA_TERMINATIONS`)."""
        return self.end_reason is EndReason.ENV_ERROR or self.infra_reported

    def end(self, reason: EndReason) -> None:
        """Stop playing this episode, for ``reason``.

        Raises:
            RuntimeError: it has already ended.
        """
        if self.end_reason is not None:
            raise RuntimeError(f"episode {self.index} already ended ({self.end_reason.value}); cannot end it "
                               f"again ({reason.value})")
        self.end_reason = reason

    def extend(self, ids: list[int], sampled: bool, lps: list[float] | None = None,
               versions: list[int] | None = None) -> None:
        self.tokens.extend(ids)
        self.response_mask.extend([sampled] * len(ids))
        self.log_probs.extend(lps if lps is not None else [0.0] * len(ids))
        self.versions.extend(versions if versions is not None else [-1] * len(ids))

    def record_step(self, info: dict, messages: list | None, reward: float, terminated: bool,
                    truncated: bool) -> None:
        """The env's answer to this episode's action: its info (with the conversation ``messages`` when the env
        gave them), and unless the env raised, its reward and flags and whether the action was unusable
        (``info["action_error"]``). Ends the episode when the env raised (``info["termination_reason"] ==
        "env_error"``: reward and flags stay those of the step before) or ended it."""
        self.info = info if messages is None else {**info, "messages": messages}
        reason = info.get("termination_reason")
        if reason == "env_error":  # TextEnv caught the env's exception: keep the data, the trainer drops the group
            self.end(EndReason.ENV_ERROR)
            return
        if info.get("action_error"):
            self.action_errors += 1
        self.reward, self.terminated, self.env_truncated = float(reward), bool(terminated), bool(truncated)
        if reason in INFRA_TERMINATIONS:
            self.infra_reported = True
        if self.terminated or self.env_truncated:
            self.end(EndReason.ENV)


class GroupCollector(BaseCollector):
    """Collects GRPO groups from text envs with a rollout backend (a TorchRL collector; module docstring).

    Args:
        make_env: zero-argument callable returning a Gymnasium env that follows the env contract
            (:mod:`envs.contract`: ``reset(options=task)`` → chat messages; ``step(text)``; ``info["tools"]``
            optional). ``N`` of them are built once and reused, wrapped in a :class:`envs.adapters.torchrl_env.TextEnv` of batch
            size ``[N]``.
        backend: the rollout engine.
        tokenizer: HF tokenizer with a chat template (its eos ends assistant turns).
        sampling: sampling settings (``stop_token_ids`` defaults to the end-of-turn ids).
        max_turns: most assistant turns per episode (envs usually end earlier).
        max_context_tokens: longest episode in tokens; longer ones are cut and flagged.
        seed: base seed; the episode ``i`` of the batch at ``step`` resets with seed ``seed + step * 100003 + i``
            and samples with seeds derived from (seed, step, turn).
        user_batcher: a :class:`torchrl_grpo.rollout.local_user.LocalUser` whose simulated-customer calls are batched: env
            resets and steps then run in threads inside its ``batched`` scope.
        tasks: for iteration: ``tasks(step)`` -> the reset options of that step's tasks (``None``: iteration
            raises; :meth:`collect` still works).
        n_samples: group size ``G`` of the iterated batches.
        total_batches: iteration stops after this many batches (``-1``: never).

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
        tasks: Callable[[int], list[dict]] | None = None,
        n_samples: int = 1,
        total_batches: int = -1,
    ) -> None:
        super().__init__()
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
        self.tasks, self.n_samples, self.total_batches = tasks, int(n_samples), int(total_batches)
        self._batches = 0  # batches yielded by iteration
        self._pool: list[gym.Env] = []
        self._text_envs: dict[int, TextEnv] = {}
        self._renderers: dict[str, ChatRenderer] = {}
        probe = ChatRenderer(tokenizer)
        self.end_of_turn = probe.end_of_turn_ids()
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=sorted(self.end_of_turn))
        self.sampling = sampling
        self.last_stats: dict[str, float] = {}

    def _run_all(self, fns: list[Callable[[], Any]]) -> list[Any]:
        """Run env resets/steps; each result is the return value or the exception raised.

        With a ``user_batcher`` (:class:`torchrl_grpo.rollout.local_user.LocalUser`) they run in threads inside its
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

    @property
    def probe_env(self) -> gym.Env:
        """One pooled Gymnasium env (built on first use), for reading task lists and spaces without stepping."""
        return self._envs(1)[0]

    def _envs(self, n: int) -> list[gym.Env]:
        while len(self._pool) < n:
            self._pool.append(self.make_env())
        return self._pool[:n]

    def _text_env(self, n: int) -> TextEnv:
        """The ``[n]`` TorchRL env over the first ``n`` pooled Gymnasium envs (built once per size)."""
        if n not in self._text_envs:
            self._text_envs[n] = TextEnv(self._envs(n), history=False, runner=self._run_all, catch_env_errors=True)
        return self._text_envs[n]

    def collect(
        self,
        tasks: list[dict],
        n_samples: int,
        *,
        step: int = 0,
        sampling: SamplingConfig | None = None,
        on_turn: Callable[[int, int, int], None] | None = None,
    ) -> TensorDict:
        """Roll out ``n_samples`` episodes for each task.

        Args:
            tasks: reset options per task (e.g. ``{"index": 3}`` or ``{"task_id": "7"}``).
            n_samples: group size G.
            step: trainer step, used to derive sampling seeds.
            sampling: overrides the collector's sampling settings (e.g. greedy for evaluation).
            on_turn: called after each turn with (turns played, episodes still running, tokens generated so far):
                the progress of a long multi-turn call (:func:`torchrl_grpo.rollout.evaluation.evaluate`).

        Returns:
            TensorDict [len(tasks) * n_samples] (see module docstring). ``self.last_stats`` holds timing and
            token counts of this call (seconds, tokens): ``rollout/time_s`` the whole call, ``rollout/generate_time_s``
            the backend's ``generate`` calls, ``rollout/env_time_s`` the env's side (resets, decoding the actions,
            steps with their grading and customer replies, the new messages' token ids), of which
            ``rollout/reset_time_s`` the resets; ``rollout/generated_tokens`` the sampled tokens kept (the batch's
            ``response_mask`` sum), ``rollout/tokens_per_s`` those over the generate time.

        Raises:
            ValueError: no tasks, or ``n_samples < 1``.
        """
        if not tasks:
            raise ValueError("collect() needs at least one task")
        if n_samples < 1:
            raise ValueError("n_samples must be >= 1")
        sampling = sampling or self.sampling
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=sorted(self.end_of_turn))
        t0 = time.perf_counter()
        jobs = [(g, task) for g, task in enumerate(tasks) for _ in range(n_samples)]
        env = self._text_env(len(jobs))
        episodes = self._reset(env, jobs, step)
        # env time: the resets (with the prompts' chat-template ids), then per turn everything after generate()
        # returns (decoding the actions, env.step with its grading, the replies' ids); generate time: the backend's
        # calls, which return host lists (wall time at the sync that exists: no extra device sync)
        reset_time = time.perf_counter() - t0
        gen_time, gen_tokens, env_time = 0.0, 0, reset_time
        for turn in range(self.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            tg = time.perf_counter()
            gens = self.backend.generate([e.tokens for e in live], self._turn_sampling(sampling, step, turn))
            te = time.perf_counter()
            gen_time += te - tg
            generated = [(ep, self._append_generation(ep, gen)) for ep, gen in zip(live, gens)]
            gen_tokens += sum(len(ids) for _ep, ids in generated)
            acting = [(ep, ids) for ep, ids in generated if not ep.done]
            if acting:
                self._step_envs(env, acting, last_turn=turn == self.max_turns - 1)
            env_time += time.perf_counter() - te
            if on_turn is not None:
                on_turn(turn + 1, sum(not e.done for e in episodes), gen_tokens)
        for ep in episodes:
            if not ep.done:  # played its last turn
                ep.end(EndReason.TURN_LIMIT)
        td = self._to_tensordict(episodes)
        self.last_stats = {
            "rollout/time_s": time.perf_counter() - t0,
            "rollout/generate_time_s": gen_time,
            "rollout/env_time_s": env_time,
            "rollout/reset_time_s": reset_time,
            "rollout/generated_tokens": float(gen_tokens),
            "rollout/tokens_per_s": gen_tokens / gen_time if gen_time > 0 else 0.0,
            "rollout/episodes": float(len(episodes)),
        }
        return td

    # ------------------------------------------------------------------ one rollout's steps
    def _reset(self, env: TextEnv, jobs: list[tuple[int, dict]], step: int) -> list[Episode]:
        """Reset the batch's envs (episode ``i`` with seed ``seed + step * 100003 + i``) and start one episode per
        ``(group id, task)`` of ``jobs`` from its prompt's chat-template ids; one whose prompt reaches
        ``max_context_tokens`` ends unplayed (with a warning)."""
        n = len(jobs)
        env.set_seed(self.seed + step * 100_003)  # episode i resets with seed + step * 100003 + i
        td = env.reset(TensorDict({"options": _stack([dict(task) for _, task in jobs])}, batch_size=[n]))
        episodes: list[Episode] = []
        for i, ((g, task), obs, tools, info) in enumerate(zip(jobs, _items(td, "observation"),
                                                             _items(td, "tools"), _items(td, "info"))):
            ren = self._renderer(tools)
            ep = Episode(group_id=g, task=dict(task), index=i, renderer=ren, info=info)
            ep.extend(ren.prompt_ids(list(obs)), sampled=False)
            ep.prompt_length = len(ep.tokens)
            self._end_if_over_context(ep, ep.prompt_length, sampled=False)
            episodes.append(ep)
        over = [e.prompt_length for e in episodes if e.context_truncated]
        if over:
            log.warning("%d of %d episodes start with a prompt of %d+ tokens, at or over max_context_tokens=%d: they "
                        "end unplayed (context_truncated, reward 0); raise rollout.max_context_tokens (and the model's "
                        "context) or shorten the prompt", len(over), len(episodes), min(over), self.max_context_tokens)
        return episodes

    def _turn_sampling(self, sampling: SamplingConfig, step: int, turn: int) -> SamplingConfig:
        """``sampling`` with the seed of this (collector seed, step, turn)."""
        turn_seed = (self.seed * 1_000_003 + step * 1009 + turn + (sampling.seed or 0)) % (2**31)
        return replace(sampling, seed=turn_seed)

    def _end_if_over_context(self, ep: Episode, length: int, *, sampled: bool) -> bool:
        """End ``ep`` (:attr:`EndReason.CONTEXT`) if ``length`` tokens are past the context: sampled tokens may fill
        ``max_context_tokens``, a prompt or an env reply must leave room for one sampled token. Returns whether it
        ended."""
        if length > self.max_context_tokens - (0 if sampled else 1):
            ep.end(EndReason.CONTEXT)
            return True
        return False

    def _append_generation(self, ep: Episode, gen) -> list[int]:
        """Append the part of the :class:`~torchrl_grpo.backends.base.Generation` ``gen`` that fits the context to
        ``ep`` (sampled tokens, their behaviour log-probs and policy versions); the episode ends if it did not all
        fit. Returns the appended ids."""
        room = self.max_context_tokens - len(ep.tokens)
        ids, lps = gen.token_ids[:room], gen.logprobs[:room]
        vers = gen.versions[:room] if gen.versions is not None else [self.backend.policy_version] * len(ids)
        if ep.policy_version < 0:
            ep.policy_version = min(vers) if vers else self.backend.policy_version
        self._end_if_over_context(ep, len(ep.tokens) + len(gen.token_ids), sampled=True)
        ep.extend(ids, sampled=True, lps=lps, versions=vers)
        ep.num_turns += 1
        ep.length_truncated = gen.finish_reason == "length"  # of the latest generation
        return ids

    def _step_envs(self, env: TextEnv, acting: list[tuple[Episode, list[int]]], *, last_turn: bool) -> None:
        """One step of the batch ``env`` for the episodes of ``acting`` (each with its latest generation's ids;
        the decoded text is its action), the other envs masked out; each records the env's answer and, still
        live and with turns left, gets the env's new messages appended."""
        n = env.batch_size[0]
        actions: list[str] = [""] * n
        step_mask = torch.zeros(n, dtype=torch.bool)
        for ep, ids in acting:
            actions[ep.index] = self.tokenizer.decode(ids, skip_special_tokens=True)
            step_mask[ep.index] = True
        out = env.step(TensorDict({"action": _stack(actions), "_step": step_mask}, batch_size=[n]))["next"]
        obs_all, info_all, msgs_all = _items(out, "observation"), _items(out, "info"), _items(out, "messages")
        rewards, terms, truncs = (out[k].reshape(n).tolist() for k in ("reward", "terminated", "truncated"))
        for ep, ids in acting:
            b = ep.index
            ep.record_step(info_all[b], msgs_all[b], rewards[b], terms[b], truncs[b])
            if not ep.done and not last_turn:
                self._append_env_reply(ep, ids, obs_all[b])

    def _append_env_reply(self, ep: Episode, ids: list[int], observation: list[dict]) -> None:
        """Close the assistant turn of ``ids`` the way the chat template would, then append the env's new messages
        ``observation`` as chat-template ids (not sampled); the episode ends instead if they do not fit."""
        closing = [] if (ids and ids[-1] in self.end_of_turn) else [self.tokenizer.eos_token_id]
        cont = closing + ep.renderer.assistant_suffix + ep.renderer.continuation_ids(list(observation))
        if not self._end_if_over_context(ep, len(ep.tokens) + len(cont), sampled=False):
            ep.extend(cont, sampled=False)

    def _to_tensordict(self, episodes: list[Episode]) -> TensorDict:
        N = len(episodes)
        T = max(len(e.tokens) for e in episodes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        tokens = torch.full((N, T), pad, dtype=torch.long)
        attn = torch.zeros((N, T), dtype=torch.bool)
        rmask = torch.zeros((N, T), dtype=torch.bool)
        lps = torch.zeros((N, T), dtype=torch.float32)
        vers = torch.full((N, T), -1, dtype=torch.long)
        for i, e in enumerate(episodes):
            L = len(e.tokens)
            tokens[i, :L] = torch.tensor(e.tokens, dtype=torch.long)
            attn[i, :L] = True
            rmask[i, :L] = torch.tensor(e.response_mask, dtype=torch.bool)
            lps[i, :L] = torch.tensor(e.log_probs, dtype=torch.float32)
            vers[i, :L] = torch.tensor(e.versions, dtype=torch.long)
        td = TensorDict(
            {
                "tokens": tokens,
                "attention_mask": attn,
                "response_mask": rmask,
                "sample_log_probs": lps,
                "reward": torch.tensor([e.reward for e in episodes], dtype=torch.float32),
                "group_id": torch.tensor([e.group_id for e in episodes], dtype=torch.long),
                "policy_version": torch.tensor([e.policy_version for e in episodes], dtype=torch.long),
                "token_policy_version": vers,
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

    # ------------------------------------------------------------------ TorchRL collector API
    def iterator(self) -> Iterator[TensorDict]:
        """Yield ``collect(tasks(k), n_samples, step=k)`` for ``k = 0, 1, …`` (``total_batches`` of them).

        Raises:
            RuntimeError: the collector was built without ``tasks``.
        """
        if self.tasks is None:
            raise RuntimeError("iterating a GroupCollector needs tasks=callable(step) -> list of reset options; "
                               "or call collect(tasks, n_samples, step=...)")
        while self.total_batches < 0 or self._batches < self.total_batches:
            batch = self.collect(self.tasks(self._batches), self.n_samples, step=self._batches)
            self._batches += 1
            yield batch

    def __len__(self) -> int:
        """``total_batches`` (the number of batches iteration yields).

        Raises:
            TypeError: an endless collector (``total_batches=-1``) has no length.
        """
        if self.total_batches < 0:
            raise TypeError("an endless GroupCollector (total_batches=-1) has no length")
        return self.total_batches

    def update_policy_weights_(self, policy_or_weights: torch.nn.Module | None = None, *,
                               probe: list[int] | None = None, **kwargs) -> None:
        """Sync the rollout backend from the trained model (:meth:`RolloutBackend.sync_from`): nothing to do for a
        backend that shares the module, export + load (+ the optional check on ``probe``) for a copy or vLLM.
        ``self.backend.last_sync_stats`` then holds the sync's diagnostics.

        Raises:
            TypeError: ``policy_or_weights`` is not an ``nn.Module`` (weight dicts are not accepted: a backend
                exports them itself).
        """
        if policy_or_weights is None:
            return
        if not isinstance(policy_or_weights, torch.nn.Module):
            raise TypeError(f"update_policy_weights_ takes the trained nn.Module, got {type(policy_or_weights).__name__}")
        self.backend.sync_from(policy_or_weights, probe=probe)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Base seed of every later batch (module docstring); returns it."""
        self.seed = int(seed)
        return self.seed

    def state_dict(self) -> dict[str, Any]:
        """What resuming iteration needs: the base seed and the number of batches yielded."""
        return {"seed": self.seed, "batches": self._batches}

    def load_state_dict(self, state_dict: dict[str, Any], **kwargs) -> None:
        self.seed, self._batches = int(state_dict["seed"]), int(state_dict["batches"])

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Close every pooled env (the backend belongs to the caller)."""
        if close_env:
            for env in self._pool:
                env.close()
        self._pool.clear()
        self._text_envs.clear()

    close = shutdown


def _stack(items: list) -> NonTensorStack:
    """``NonTensorStack [len(items)]`` with one datum per item (dicts and strings are not unrolled)."""
    return NonTensorStack(*[NonTensorData(x) for x in items])


def _items(td: TensorDict, key: str) -> list:
    """The per-env Python objects of a NonTensor entry of a ``TextEnv`` output, as a list."""
    value = td.get(key)
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _slim_info(info: dict[str, Any]) -> dict[str, Any]:
    """Keep the parts of an env info dict worth logging (drops tool schemas)."""
    return {k: v for k, v in info.items() if k != "tools"}


def concat_batches(batches: Sequence[TensorDict], pad_token_id: int) -> TensorDict:
    """Stack collector batches ([N_i, T_i], :mod:`torchrl_grpo.rollout.collector`) into one [Σ N_i, max T_i] batch.

    Per-token entries ([N_i, T_i]) are right-padded as the collector pads: ``tokens`` with ``pad_token_id``,
    ``token_policy_version`` with -1, masks with False, log-probs with 0 (padding is outside ``attention_mask`` and ``response_mask``, so no loss term sees it). ``group_id`` of
    batch i is shifted past every id of batches < i, so groups stay distinct. Non-tensor entries (``task``,
    ``info``) are concatenated as lists.

    Raises:
        ValueError: no batches, or batches with different keys.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return batches[0]
    keys = set(batches[0].keys())
    for b in batches[1:]:
        if set(b.keys()) != keys:
            raise ValueError(f"batches have different keys: {sorted(keys ^ set(b.keys()))}")
    T = max(int(b["tokens"].shape[1]) for b in batches)
    tensors: dict[str, list[torch.Tensor]] = {}
    lists: dict[str, list] = {}
    offset = 0
    for b in batches:
        Tb = int(b["tokens"].shape[1])
        for k in b.keys():
            v = b.get(k)
            if _is_non_tensor(v):
                lists.setdefault(k, []).extend(v.tolist())
                continue
            if k == "group_id":
                v = v + offset
            elif v.ndim >= 2 and v.shape[1] == Tb and Tb < T:
                fill = {"tokens": pad_token_id, "token_policy_version": -1}.get(k, 0)  # as _to_tensordict pads
                pad = torch.full((v.shape[0], T - Tb, *v.shape[2:]), fill, dtype=v.dtype)
                v = torch.cat([v, pad], dim=1)
            tensors.setdefault(k, []).append(v)
        offset = int(tensors["group_id"][-1].max()) + 1
    n = sum(b.shape[0] for b in batches)
    out = TensorDict({k: torch.cat(v) for k, v in tensors.items()}, batch_size=[n])
    for k, v in lists.items():
        out[k] = NonTensorStack(*v)
    return out
