"""Evaluation of a policy on a fixed subset of tasks: greedy accuracy, pass@k and pass^k.

* pass@k — probability that at least one of k samples succeeds; unbiased estimator from n >= k samples with
  c successes (Chen et al., 2021, "Evaluating LLMs Trained on Code", arXiv:2107.03374, Eq. 1):
  ``1 - C(n - c, k) / C(n, k)``.
* pass^k — probability that *all* k i.i.d. samples succeed (tau-bench, Yao et al., 2024, arXiv:2406.12045,
  Sec. 4): ``C(c, k) / C(n, k)``, averaged over tasks.

Sampling: the greedy and the sampled (pass@k) episodes use the run's one :class:`SamplingConfig` (built once from
``gconfig`` by :func:`torchrl_grpo.assembly.build`), derived by :func:`eval_samplings`: temperature 0, or the run's
temperature, ``top_p`` and ``top_k`` with a fixed seed. Under torchrun every rank evaluates its share of the tasks
(:func:`evaluate`, ``dp``).

An episode succeeds when its reward is >= ``success_threshold`` (1.0: a correct GSM8K answer; a full tau2
reward). The GSM8K format credit (0.1) is therefore not counted as success.

Given a list (``episodes=``), :func:`evaluate` also appends one row per evaluated episode
(:func:`eval_episode_rows`): which task, greedy or sampled, reward, turns, tokens, how it ended, and for greedy
episodes the conversation. The trainer writes them to ``<run_dir>/eval_episodes.jsonl``: the per-task outcomes a
paired comparison of two checkpoints needs, and the samples to read before believing an accuracy.
"""
from __future__ import annotations

from dataclasses import replace
from math import comb

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.rollout.collector import GroupCollector

__all__ = ["pass_at_k", "pass_hat_k", "evaluate", "EvalProgress", "eval_samplings", "eval_episode_rows",
           "do_nothing_baseline", "format_eval_table"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task (Chen et al., 2021, Eq. 1). Raises ValueError if k > n or c > n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one task (tau-bench): C(c, k) / C(n, k). Raises ValueError if k > n or c > n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return comb(c, k) / comb(n, k)


#: Seconds between two progress lines in the log of a running evaluation (the bar itself moves every turn).
EVAL_LOG_EVERY_S = 60.0


class EvalProgress:
    """The progress of one :func:`evaluate` call, inside its collector calls: a multi-turn chunk (up to
    :data:`EVAL_CHUNK` tasks whose episodes of up to ``max_turns`` turns finish together) moves the bar's postfix
    every turn (turn, episodes still running, tokens generated, ETA) and writes a log line at most every
    :data:`EVAL_LOG_EVERY_S` seconds, so a 7-minute evaluation no longer sits at ``0/4 episodes``.

    The ETA is an upper bound: the turns left to this chunk's turn limit at this chunk's mean seconds per turn, plus
    the chunks not started at the mean seconds of a finished chunk (before one finished: of a chunk run to its turn
    limit at the current pace). Episodes that end early make the evaluation finish sooner.

    Args:
        bar: a tqdm bar over the episodes (``update(n)``, ``set_postfix_str``), or None: log lines only.
        desc: the log lines' prefix (``"eval (step 2)"``).
        chunks: collector calls this evaluation makes. max_turns: the collector's turn limit.
        log: where the lines go. clock: seconds (monotonic; a test passes its own).
    """

    def __init__(self, bar, desc: str, chunks: int, max_turns: int, log=None, clock=None) -> None:
        import logging
        import time

        self.bar, self.desc, self.chunks, self.max_turns = bar, desc, max(1, chunks), max(1, int(max_turns))
        self.log = log or logging.getLogger(__name__)
        self.clock = clock or time.monotonic
        self.t0 = self.chunk_t0 = self.logged_at = self.clock()
        self.done_chunks, self.done_episodes = 0, 0
        self.tokens_before = 0  # tokens of the finished chunks

    def eta_s(self, turn: int) -> float:
        """Upper bound of the seconds left after ``turn`` turns of the current chunk (class docstring)."""
        now = self.clock()
        per_turn = (now - self.chunk_t0) / max(1, turn)
        per_chunk = (self.chunk_t0 - self.t0) / self.done_chunks if self.done_chunks else per_turn * self.max_turns
        return max(0, self.max_turns - turn) * per_turn + max(0, self.chunks - self.done_chunks - 1) * per_chunk

    def on_turn(self, turn: int, live: int, tokens: int) -> None:
        """The collector's per-turn callback (:meth:`GroupCollector.collect` ``on_turn``)."""
        eta = self.eta_s(turn)
        text = (f"chunk {self.done_chunks + 1}/{self.chunks}: turn {turn}/{self.max_turns}, {live} running, "
                f"{self.tokens_before + tokens:,} tokens, ETA <= {_minutes(eta)}")
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)
        now = self.clock()
        if now - self.logged_at >= EVAL_LOG_EVERY_S:
            self.logged_at = now
            self.log.info("%s: %d episodes done; %s", self.desc, self.done_episodes, text)

    def chunk_done(self, episodes: int, tokens: int) -> None:
        """A collector call returned ``episodes`` episodes after generating ``tokens`` tokens."""
        self.done_chunks += 1
        self.done_episodes += episodes
        self.tokens_before += tokens
        self.chunk_t0 = self.clock()
        if self.bar is not None:
            self.bar.update(episodes)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


#: Tasks per collector call in :func:`evaluate` (the transformers backend's default ``max_batch_size``): a long
#: evaluation advances in these steps, which its progress bar shows. Fixed, so no display setting changes a result.
EVAL_CHUNK = 64


def _tool_calls(messages: list) -> list[dict]:
    """``{"name", "arguments"}`` of every assistant tool call in ``messages`` (OpenAI format), in order."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                f = c.get("function", c) if isinstance(c, dict) else {}
                if isinstance(f, dict):
                    out.append({"name": f.get("name"), "arguments": f.get("arguments")})
    return out


def eval_episode_rows(td, mode: str, n_samples: int, transcript: bool) -> list[dict]:
    """One JSON-ready row per episode of a collector batch ``td`` ([N] with N = tasks x ``n_samples``, task-major;
    :mod:`torchrl_grpo.rollout.collector`): ``mode`` ("greedy" | "sampled"), ``task`` (the reset options), ``task_id`` (the
    env's ``info["task_id"]`` when it reports one), ``sample`` (0 .. n_samples - 1), ``reward``, ``num_turns``,
    ``response_tokens``, ``action_errors``, ``termination_reason``, ``length_truncated``, ``context_truncated``,
    ``infra_error``, ``tool_calls`` (the episode's calls in order, ``{"name", "arguments"}`` as the agent wrote them;
    ``[]`` for an env without tools); with ``transcript`` also ``messages``: the conversation without its system
    messages (the domain policy, the same in every episode)."""
    from torchrl_grpo.rollout.episode_stats import non_tensor_list

    tasks, infos = non_tensor_list(td, "task"), non_tensor_list(td, "info")
    rows = []
    for i in range(td.shape[0]):
        info = infos[i] if isinstance(infos[i], dict) else {}
        row = {"mode": mode, "task": tasks[i], "task_id": info.get("task_id"), "sample": i % n_samples,
               "reward": float(td["reward"][i]), "num_turns": int(td["num_turns"][i]),
               "response_tokens": int(td["response_tokens"][i]), "action_errors": int(td["action_errors"][i]),
               "termination_reason": info.get("termination_reason"),
               "length_truncated": bool(td["length_truncated"][i]), "context_truncated": bool(td["context_truncated"][i]),
               "infra_error": bool(td["infra_error"][i]),
               "tool_calls": _tool_calls(info.get("messages") or [])}
        if transcript:
            row["messages"] = [m for m in info.get("messages") or [] if not (isinstance(m, dict) and m.get("role") == "system")]
        rows.append(row)
    return rows


def _rewards(collector: GroupCollector, tasks: list[dict], n: int, step: int, sampling: SamplingConfig,
             progress: EvalProgress | None, stats: dict[str, float], episodes: list | None = None,
             mode: str = "greedy"):
    """Final rewards ``[len(tasks) * n]`` (task-major) collected :data:`EVAL_CHUNK` tasks at a time; rows of
    :func:`eval_episode_rows` appended to ``episodes`` when given (greedy ones with their conversation);
    ``progress`` told of every turn and every chunk."""
    import torch

    out = [torch.zeros(0)]
    for s in range(0, len(tasks), EVAL_CHUNK):
        part = tasks[s : s + EVAL_CHUNK]
        # our collector reports each turn; another object with collect() (a test's stand-in) is told per chunk
        hook = {"on_turn": progress.on_turn} if progress is not None and isinstance(collector, GroupCollector) else {}
        td = collector.collect(part, n, step=step, sampling=sampling, **hook)
        out.append(td["reward"].float())
        if episodes is not None:
            episodes.extend(eval_episode_rows(td, mode, n, transcript=mode == "greedy"))
        for k in ("rollout/generated_tokens", "rollout/generate_time_s"):
            stats[k] = stats.get(k, 0.0) + float(collector.last_stats.get(k, 0.0))
        if progress is not None:
            progress.chunk_done(len(part) * n, int(collector.last_stats.get("rollout/generated_tokens", 0)))
    return torch.cat(out)


#: seed of the sampled (pass@k) evaluation episodes: the same checkpoint gets the same samples
EVAL_SEED = 12345


def eval_samplings(sampling: SamplingConfig) -> tuple[SamplingConfig, SamplingConfig]:
    """The greedy and the sampled (pass@k) evaluation settings, both derived from the run's one ``sampling`` (built
    once from ``gconfig`` by :func:`torchrl_grpo.assembly.build`) with ``dataclasses.replace``: greedy = temperature 0
    (no truncation applies then); sampled = the run's ``top_p`` / ``top_k`` / ``max_new_tokens`` at its temperature,
    or at 1 when the run itself decodes greedily (pass@k needs samples), with the fixed seed :data:`EVAL_SEED`."""
    greedy = replace(sampling, temperature=0.0, seed=None)
    sampled = replace(sampling, temperature=sampling.temperature or 1.0, seed=EVAL_SEED)
    return greedy, sampled


def _merge_shares(parts: list, n_tasks: int, world: int) -> list:
    """Per-task items back in task order from the ranks' round-robin shares: rank r held tasks r, r + world, ..."""
    out: list = [None] * n_tasks
    for r, part in enumerate(parts):
        for j, item in enumerate(part):
            out[r + j * world] = item
    return out


def _evaluate_mode(collector, tasks, n, step, sampling, progress, episodes, mode, dp, world):
    """One mode (greedy: n = 1, sampled: n = k) on this rank's share, gathered: per-task reward lists in task order,
    summed generated tokens and the longest rank's generation time; rank 0's ``episodes`` gets every row, in task
    order."""
    share = tasks[(dp.rank if world > 1 else 0)::world]
    stats: dict[str, float] = {}
    rows: list | None = [] if episodes is not None else None
    r = _rewards(collector, share, n, step, sampling, progress, stats, rows, mode).reshape(len(share), n).tolist()
    per_task_rows = [rows[i * n:(i + 1) * n] for i in range(len(share))] if rows is not None else None
    parts = dp.all_gather_object((r, stats, per_task_rows)) if dp is not None else [(r, stats, per_task_rows)]
    rewards = _merge_shares([p[0] for p in parts], len(tasks), world)
    if episodes is not None:
        for task_rows in _merge_shares([p[2] for p in parts], len(tasks), world):
            episodes.extend(task_rows)
    tokens = sum(p[1].get("rollout/generated_tokens", 0.0) for p in parts)
    gen_s = max(p[1].get("rollout/generate_time_s", 0.0) for p in parts)
    return rewards, tokens, gen_s


def evaluate(
    collector: GroupCollector,
    *,
    task_indices: list[int],
    sampling: SamplingConfig | None = None,
    greedy: bool = True,
    pass_k: int = 0,
    step: int = 0,
    success_threshold: float = 1.0,
    prefix: str = "eval",
    progress: bool = False,
    episodes: list | None = None,
    dp=None,
) -> dict[str, float]:
    """Evaluate on a fixed subset of the collector env's tasks (``options={"index": i}`` for i in ``task_indices``),
    :data:`EVAL_CHUNK` tasks per collector call (``progress``: a tqdm bar over the episodes; either way a running
    evaluation logs its turn, tokens and ETA at most every :data:`EVAL_LOG_EVERY_S` s: :class:`EvalProgress`).
    ``episodes``: a list that receives one :func:`eval_episode_rows` row per episode, greedy ones first.

    Args:
        sampling: the run's sampling config (``gconfig``; default ``SamplingConfig()``); the greedy and sampled
            settings are derived from it by :func:`eval_samplings`.
        dp: the data-parallel group (:class:`torchrl_grpo.distributed.data_parallel.DataParallel`; None: one process). Every rank
            calls :func:`evaluate` with the same tasks and evaluates its round-robin share (task ``i`` on rank
            ``i % world_size``); the rewards and episode rows are all-gathered (two collectives: one per mode), so
            every rank returns the metrics of all tasks, equal to one process's for the greedy ones. The sampled
            episodes are seeded per collector call, so a task's k samples depend on the world size. No rank waits
            in a collective while another evaluates alone: the evaluation time divides by the ranks.

    Returns:
        ``{prefix}/accuracy`` (greedy success rate), ``{prefix}/reward`` (greedy mean reward),
        ``{prefix}/tokens_per_s`` (greedy generated tokens of all ranks over the longest rank's generation seconds),
        and when ``pass_k > 0``: ``{prefix}/pass@k``, ``{prefix}/pass^k`` and ``{prefix}/pass@1`` from k samples per
        task; plus ``{prefix}/time_s``.
    """
    import time

    t0 = time.perf_counter()
    tasks = [{"index": int(i)} for i in task_indices]
    world = dp.world_size if dp is not None and dp.enabled else 1
    greedy_cfg, sampled_cfg = eval_samplings(sampling or SamplingConfig())
    out: dict[str, float] = {}
    bar = shown = None
    if world == 1 or dp.is_main:  # the log lines always, the bar when asked
        share = len(tasks[((dp.rank if world > 1 else 0))::world])
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=share * ((1 if greedy else 0) + pass_k), desc=f"{prefix} (step {step})",
                       unit="episode", leave=False)
        chunks = -(-share // EVAL_CHUNK) * ((1 if greedy else 0) + (1 if pass_k > 0 else 0))
        shown = EvalProgress(bar, f"{prefix} (step {step})", chunks, getattr(collector, "max_turns", 1))
    try:
        if greedy:
            r, tokens, gen_s = _evaluate_mode(collector, tasks, 1, step, greedy_cfg, shown, episodes, "greedy", dp,
                                              world)
            flat = [x for row in r for x in row]
            n = len(flat) or float("nan")  # no task: NaN, as the mean of nothing
            out[f"{prefix}/accuracy"] = sum(x >= success_threshold for x in flat) / n
            out[f"{prefix}/reward"] = sum(flat) / n
            out[f"{prefix}/tokens_per_s"] = tokens / gen_s if gen_s > 0 else 0.0
        if pass_k > 0:
            r, _, _ = _evaluate_mode(collector, tasks, pass_k, step, sampled_cfg, shown, episodes, "sampled", dp,
                                     world)
            c = [sum(x >= success_threshold for x in row) for row in r]
            out[f"{prefix}/pass@{pass_k}"] = sum(pass_at_k(pass_k, ci, pass_k) for ci in c) / len(c)
            out[f"{prefix}/pass^{pass_k}"] = sum(pass_hat_k(pass_k, ci, pass_k) for ci in c) / len(c)
            out[f"{prefix}/pass@1"] = sum(pass_at_k(pass_k, ci, 1) for ci in c) / len(c)
    finally:
        if bar is not None:
            bar.close()
    out[f"{prefix}/time_s"] = time.perf_counter() - t0
    return out


def do_nothing_baseline(make_env, task_indices: list[int], action=None, prefix: str = "eval/do_nothing") -> dict[str, float]:
    """Reward of an agent that takes ``action`` once on the given tasks: the floor a trained policy must beat
    (tau2 gives ~0.38 on airline base for ending at once: some tasks require no change).

    Args:
        make_env: zero-argument env constructor.
        task_indices: task indices (``reset(options={"index": i})``).
        action: the action; default the env's own ``env.unwrapped.do_nothing_action`` (:mod:`envs.contract`).

    Returns:
        ``{prefix}_reward`` (mean reward) and ``{prefix}_pass^1`` (fraction with reward >= 1); ``{}`` when the env
        has no do-nothing action (``do_nothing_action is None``, e.g. GSM8K) and none is given.
    """
    env = make_env()
    if action is None:
        action = getattr(env.unwrapped, "do_nothing_action", None)
        if action is None:
            env.close()
            return {}
    rewards = []
    for i in task_indices:
        env.reset(seed=i, options={"index": i})
        _, r, term, trunc, _ = env.step(action)
        rewards.append(float(r))
    env.close()
    return {f"{prefix}_reward": sum(rewards) / max(1, len(rewards)),
            f"{prefix}_pass^1": sum(r >= 1.0 for r in rewards) / max(1, len(rewards))}


def format_eval_table(metrics: dict[str, float]) -> str:
    """A fixed-width two-column table of evaluation metrics, for the console."""
    rows = [(k, v) for k, v in sorted(metrics.items()) if isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rows), default=10)
    line = "+" + "-" * (width + 2) + "+" + "-" * 12 + "+"
    body = [f"| {k:<{width}} | {v:>10.4f} |" for k, v in rows]
    return "\n".join([line, f"| {'metric':<{width}} | {'value':>10} |", line, *body, line])
