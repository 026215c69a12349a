"""A per-domain store of finished episodes: filled from collector batches, saved/loaded as JSON lines, summarised,
exported for SFT, and sampled for replay (:mod:`torchrl_grpo.continual.algorithms`).

One :class:`Trajectory` per episode, built from one row of a :class:`torchrl_grpo.rollout.collector.GroupCollector` batch
(module docstring there): ``reward`` [N], ``num_turns`` [N], ``response_tokens`` [N], ``infra_error`` [N] and the
non-tensor ``task`` (reset options, e.g. ``{"index": 3}``) and ``info`` (the env's final info: ``messages``,
``task_id``, ``termination_reason``). Token ids are not kept: the chat messages are the portable record (any
tokenizer can re-render them), and on-policy replay only needs the task.

Episodes that ended on an infrastructure failure (``infra_error``: env exception, failed customer simulator) are not
stored: their reward says nothing about the policy (the trainer drops them from training for the same reason).

Each domain keeps at most ``capacity_per_domain`` episodes, oldest dropped first (``None``: no bound; a telecom
episode with its system prompt is ~40 kB of JSON).

File format (``save`` / ``load``): one JSON object per line with the :class:`Trajectory` fields. ``export`` writes
the SFT subset: ``{"domain", "task_id", "reward", "messages"}`` for episodes with ``reward >= min_reward``.
"""
from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["Trajectory", "TrajectoryBuffer"]


@dataclass
class Trajectory:
    """One finished episode of one domain."""

    domain: str
    task: dict  # reset options, e.g. {"index": 3}
    reward: float
    step: int = 0  # trainer step that collected it
    task_id: str | None = None  # the env's info["task_id"]
    messages: list = field(default_factory=list)  # whole conversation, OpenAI chat format
    num_turns: int = 0
    response_tokens: int = 0
    termination: str | None = None  # info["termination_reason"]

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        """Inverse of ``asdict``. Raises ValueError naming a missing required field."""
        missing = [k for k in ("domain", "task", "reward") if k not in d]
        if missing:
            raise ValueError(f"trajectory record lacks {missing}: {str(d)[:200]}")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def _col(batch, key: str) -> list:
    col = batch[key]
    return col.tolist() if hasattr(col, "tolist") else list(col)


class TrajectoryBuffer:
    """Episodes per domain, in insertion order (module docstring).

    Args:
        capacity_per_domain: most episodes kept per domain, oldest dropped first (``None``: unbounded).

    Raises:
        ValueError: ``capacity_per_domain < 1``.
    """

    def __init__(self, capacity_per_domain: int | None = None) -> None:
        if capacity_per_domain is not None and capacity_per_domain < 1:
            raise ValueError(f"capacity_per_domain must be >= 1 or None, got {capacity_per_domain}")
        self.capacity = capacity_per_domain
        self._data: dict[str, deque[Trajectory]] = {}

    # ------------------------------------------------------------------ filling
    def add(self, traj: Trajectory) -> None:
        self._data.setdefault(traj.domain, deque(maxlen=self.capacity)).append(traj)

    def add_batch(self, batch, domain: str, step: int = 0) -> int:
        """Store every episode of a collector batch (TensorDict [N]) under ``domain``, except infrastructure
        failures. Returns the number stored."""
        rewards = batch["reward"].tolist()
        turns = batch["num_turns"].tolist()
        resp = batch["response_tokens"].tolist()
        infra = batch["infra_error"].tolist() if "infra_error" in batch.keys() else [False] * len(rewards)
        tasks, infos = _col(batch, "task"), _col(batch, "info")
        n = 0
        for i, r in enumerate(rewards):
            if infra[i]:
                continue
            info = infos[i] if isinstance(infos[i], dict) else {}
            # rewards arrive as float32 (0.7 -> 0.69999999): 6 decimals give back the env's value for thresholds
            self.add(Trajectory(domain=domain, task=dict(tasks[i]), reward=round(float(r), 6), step=int(step),
                                task_id=None if info.get("task_id") is None else str(info["task_id"]),
                                messages=list(info.get("messages") or []), num_turns=int(turns[i]),
                                response_tokens=int(resp[i]), termination=info.get("termination_reason")))
            n += 1
        return n

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return sum(len(v) for v in self._data.values())

    @property
    def domains(self) -> list[str]:
        """Domains with at least one episode, in the order they were first added."""
        return [d for d, v in self._data.items() if v]

    def episodes(self, domain: str | None = None) -> list[Trajectory]:
        """The stored episodes of ``domain`` (all domains: ``None``), oldest first."""
        if domain is not None:
            return list(self._data.get(domain, ()))
        return [t for v in self._data.values() for t in v]

    def tasks(self, domain: str) -> list[dict]:
        """The distinct reset options of ``domain``'s stored episodes, in first-seen order."""
        seen: dict[str, dict] = {}
        for t in self._data.get(domain, ()):
            seen.setdefault(json.dumps(t.task, sort_keys=True), t.task)
        return list(seen.values())

    def stats(self) -> dict[str, dict[str, float]]:
        """Per domain: ``episodes``, ``tasks`` (distinct), ``reward_mean``, ``reward_max``, ``success_rate``
        (reward >= 1), ``turns_mean``."""
        out = {}
        for d in self.domains:
            eps = self._data[d]
            r = np.array([t.reward for t in eps], dtype=np.float64)
            out[d] = {"episodes": float(len(eps)), "tasks": float(len(self.tasks(d))), "reward_mean": float(r.mean()),
                      "reward_max": float(r.max()), "success_rate": float((r >= 1.0).mean()),
                      "turns_mean": float(np.mean([t.num_turns for t in eps]))}
        return out

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int, *, domains: Sequence[str] | None = None, min_reward: float | None = None,
               rng: np.random.Generator | None = None) -> list[Trajectory]:
        """``n`` episodes drawn uniformly with replacement from ``domains`` (all: ``None``) with
        ``reward >= min_reward`` (any: ``None``).

        Raises:
            ValueError: ``n < 0``, or ``n > 0`` and no episode qualifies.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = [t for d in (domains if domains is not None else self.domains) for t in self._data.get(d, ())
                if min_reward is None or t.reward >= min_reward]
        if n and not pool:
            raise ValueError(f"no stored episode of {list(domains) if domains is not None else 'any domain'}"
                             f"{'' if min_reward is None else f' with reward >= {min_reward}'}")
        rng = rng or np.random.default_rng()
        return [pool[int(i)] for i in rng.integers(0, len(pool), size=n)] if n else []

    def sample_tasks(self, n: int, domains: Sequence[str], rng: np.random.Generator) -> list[tuple[str, dict]]:
        """``n`` (domain, reset options) pairs for on-policy replay: a domain uniformly among ``domains`` that have
        episodes, then one of its distinct tasks uniformly (so a domain with many stored episodes is not favoured).

        Raises:
            ValueError: ``n > 0`` and none of ``domains`` has an episode.
        """
        usable = [d for d in domains if self._data.get(d)]
        if n and not usable:
            raise ValueError(f"no stored episode of {list(domains)} to replay")
        out = []
        for _ in range(n):
            d = usable[int(rng.integers(len(usable)))]
            ts = self.tasks(d)
            out.append((d, ts[int(rng.integers(len(ts)))]))
        return out

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write every episode as JSON lines (atomically: a temp file renamed over ``path``). Returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for t in self.episodes():
                fh.write(json.dumps(asdict(t), default=str) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, capacity_per_domain: int | None = None) -> "TrajectoryBuffer":
        """Read a :meth:`save` file.

        Raises:
            FileNotFoundError: no file; ValueError: a line that is not a trajectory record (with its line number).
        """
        buf = cls(capacity_per_domain)
        with open(path, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    buf.add(Trajectory.from_dict(json.loads(line)))
                except (json.JSONDecodeError, ValueError, TypeError) as e:
                    raise ValueError(f"{path}:{no}: not a trajectory record ({e})") from None
        return buf

    def export(self, path: str | os.PathLike, min_reward: float = 0.7, domains: Iterable[str] | None = None) -> int:
        """Write the episodes with ``reward >= min_reward`` as SFT records ``{"domain", "task_id", "reward",
        "messages"}`` (JSON lines). Returns the number written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        with open(path, "w", encoding="utf-8") as fh:
            for d in (list(domains) if domains is not None else self.domains):
                for t in self._data.get(d, ()):
                    if t.reward >= min_reward:
                        fh.write(json.dumps({"domain": t.domain, "task_id": t.task_id, "reward": t.reward,
                                             "messages": t.messages}, default=str) + "\n")
                        n += 1
        return n

    def state(self) -> dict[str, Any]:
        """Small summary for logs: ``{"episodes": N, "per_domain": stats()}``."""
        return {"episodes": len(self), "per_domain": self.stats()}
