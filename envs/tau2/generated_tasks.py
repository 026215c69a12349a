"""Generated tau2 mock tasks: ``split="generated_train"`` (2,000) and ``split="generated_test"`` (200).

tau2's mock domain (4 tools, a 5-line policy) is the one tau2 domain whose prompt fits a laptop model (~0.9k
SmolLM2 tokens, where airline, retail and telecom take 5.8k-10.9k), but it ships only 9 tasks. This module composes
more, the way tau2 composes telecom's 2,285-task ``full`` split (``tau2/domains/telecom/tasks/``: sub-tasks with
their own setup and fix, combined over selection sets): each task is

- a seeded initial database: 2-5 users with generated names (``user_1`` ... ``user_k``) and 1-8 tasks with
  contiguous ids ``task_1`` ... ``task_m`` (so ``create_task``'s next id, ``task_{m+1}``, is known), each owned by
  one user, ``pending`` or ``completed``; given as ``initial_state.initialization_data.agent_data`` (tau2 merges it
  over the mock ``db.json``, whose ``task_1`` / ``user_1`` it overwrites);
- 1-3 sub-intents, each a sentence of the ticket and a run of gold actions:

  ==================  ==========================================================  ==================================
  sub-intent          ticket says                                                 gold actions
  ==================  ==========================================================  ==================================
  ``set_status``      set ``task_i`` to pending / completed                       ``update_task_status``
  ``create_named``    create a titled task for a user named (not by id)           ``get_users``, ``create_task``
  ``create_complete`` create a titled task for ``user_j``, then complete it       ``create_task``, ``update_task_status``
                                                                                  (the id ``create_task`` returns)
  ``complete_all``    complete all of a named user's pending tasks                ``get_users``, one
                                                                                  ``update_task_status`` each
  ``delete``          delete a task (policy rule 4: not allowed -> a human)       ``transfer_to_human_agents``
  ==================  ==========================================================  ==================================

  At least one sub-intent of every task writes, and ``delete`` (which ends with a transfer) comes last;
- graded on the database only (``reward_basis=["DB"]``: no LLM-judged criterion), so a task's reward is tau2's
  ``evaluate_simulation`` DB check: the final database must equal the gold replay's.

Train and test are disjoint by construction: test tasks use held-out user names and task titles (no name or
title of one pool appears in the other), and no test ticket equals a train ticket (checked at generation). The
sets are fixed by committed seeds and regenerated bit-identically on first use (~1 s); ``tests/test_tau2_generated_tasks.py``
checks the digest of each split against :data:`SPLIT_DIGESTS`, every gold replay (1.0), the do-nothing agent (0.0),
a dropped write (< 1.0) and our reward against tau2's evaluator on perturbed trajectories.

Both a ticket (solo mode: the agent works it alone and ends with ``done``) and a ``user_scenario`` (the scripted
or LLM customer) are written for every task.
"""
from __future__ import annotations

import functools
import hashlib
import json
import random
from typing import Any

__all__ = ["GENERATED_SPLITS", "SPLIT_SIZES", "SPLIT_SEEDS", "SPLIT_DIGESTS", "generate_split", "generated_tasks", "intents",
           "select_tasks", "split_digest", "split_json"]

#: split name -> number of tasks
SPLIT_SIZES = {"generated_train": 2000, "generated_test": 200}
#: split name -> the seed of its random.Random (committed: the sets are part of the env's version)
SPLIT_SEEDS = {"generated_train": 20261202, "generated_test": 20261203}
#: the splits this module serves (mock domain only)
GENERATED_SPLITS = tuple(SPLIT_SIZES)
#: split name -> sha256 of :func:`split_json` (a test regenerates each split and compares)
SPLIT_DIGESTS = {
    "generated_train": "51e004115a6fc791e079019cdb0fa7e2afc0776098af51f5196dea5c35009327",
    "generated_test": "ca124acd1ba81604eb0fbea82f45573a8ac7d4f28e5815f40b3969fae7fcd0ab",
}

_FIRST_TRAIN = ("Alice", "Bruno", "Chen", "Dara", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemi",
                "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera",
                "Wei", "Ximena", "Yusuf", "Zoe", "Aaron", "Beatriz", "Caleb", "Dmitri")
_LAST_TRAIN = ("Garcia", "Smith", "Kim", "Novak", "Okafor", "Rossi", "Sato", "Meyer", "Silva", "Haddad",
               "Larsen", "Moreau", "Patel", "Quispe", "Ivanova", "Nguyen", "Costa", "Fischer", "Dubois", "Reyes")
_FIRST_TEST = ("Amara", "Bjorn", "Chiara", "Desmond", "Esther", "Fatima", "Gideon", "Hana", "Ibrahim", "Juno")
_LAST_TEST = ("Abara", "Lindqvist", "Marchetti", "Oyelaran", "Takeda", "Vasquez", "Whitfield", "Zielinski")

_TITLES_TRAIN = ("Quarterly report", "Team standup notes", "Budget review", "Client onboarding", "Update website",
                 "Fix login bug", "Plan offsite", "Order supplies", "Write newsletter", "Prepare slides",
                 "Review contract", "Book travel", "Hire designer", "Migrate database", "Call supplier",
                 "Renew license", "Draft proposal", "Clean backlog", "Test release", "Archive emails",
                 "Audit expenses", "Schedule interviews", "Backup laptop", "Train new hire", "Submit timesheet",
                 "Update roadmap", "Refactor billing", "Send invoices", "Organize files", "Research vendors")
_TITLES_TEST = ("Inventory count", "Security training", "Publish blog post", "Renew domain", "Design survey",
                "Reply to feedback", "Tax filing", "Replace printer", "Sprint retrospective", "Update handbook")

_INTENTS = ("set_status", "create_named", "create_complete", "complete_all", "delete")
_WRITE_INTENTS = ("set_status", "create_named", "create_complete", "complete_all")


def _pools(split: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    if split == "generated_test":
        return _FIRST_TEST, _LAST_TEST, _TITLES_TEST
    return _FIRST_TRAIN, _LAST_TRAIN, _TITLES_TRAIN


class _World:
    """The database a task starts from, and its state as the gold actions run (a simulation of the mock tools)."""

    def __init__(self, rng: random.Random, split: str):
        first, last, titles = _pools(split)
        n_users = rng.randint(2, 5)
        names: list[str] = []
        while len(names) < n_users:  # distinct full names; first names distinct too (tickets may say "Maya's")
            name = f"{rng.choice(first)} {rng.choice(last)}"
            if name.split()[0] not in {n.split()[0] for n in names}:
                names.append(name)
        self.users = {f"user_{i + 1}": {"user_id": f"user_{i + 1}", "name": n, "tasks": []} for i, n in enumerate(names)}
        self.tasks: dict[str, dict] = {}
        for i in range(rng.randint(1, 8)):
            tid = f"task_{i + 1}"
            owner = rng.choice(sorted(self.users))
            self.tasks[tid] = {"task_id": tid, "title": rng.choice(titles), "description": None,
                               "status": rng.choice(("pending", "completed"))}
            self.users[owner]["tasks"].append(tid)
        self.titles = titles

    def initial_data(self) -> dict:
        return json.loads(json.dumps({"tasks": self.tasks, "users": self.users}))

    def owner(self, task_id: str) -> str:
        return next(u for u, rec in self.users.items() if task_id in rec["tasks"])

    def create(self, user_id: str, title: str) -> str:
        tid = f"task_{len(self.tasks) + 1}"
        self.tasks[tid] = {"task_id": tid, "title": title, "description": None, "status": "pending"}
        self.users[user_id]["tasks"].append(tid)
        return tid


def _action(n: int, name: str, arguments: dict, info: str) -> dict:
    return {"action_id": f"gold_{n}", "requestor": "assistant", "name": name, "arguments": arguments, "info": info}


def _compose(rng: random.Random, world: _World, intents: list[str]) -> tuple[list[str], list[dict]] | None:
    """Ticket sentences and gold actions of ``intents`` over ``world`` (mutated), or None if they do not fit."""
    sentences: list[str] = []
    actions: list[dict] = []
    touched: set[str] = set()  # tasks and users a sub-intent used: later ones pick others (no interference)
    looked_up = False

    def lookup() -> None:
        nonlocal looked_up
        if not looked_up:
            actions.append(_action(len(actions), "get_users", {}, "look the user up by name"))
            looked_up = True

    for kind in intents:
        if kind == "set_status":
            free = [t for t in sorted(world.tasks) if t not in touched and world.owner(t) not in touched]
            if not free:
                return None
            tid = rng.choice(free)
            new = "pending" if world.tasks[tid]["status"] == "completed" else "completed"
            touched.add(tid)
            sentences.append(rng.choice((
                f"Set the status of {tid} to {new}.",
                f"Please mark {tid} as {new}.",
                f"{tid} should be {new} now; update it.")))
            actions.append(_action(len(actions), "update_task_status", {"task_id": tid, "status": new},
                                   f"{tid} -> {new}"))
            world.tasks[tid]["status"] = new
        elif kind in ("create_named", "create_complete"):
            free = [u for u in sorted(world.users) if u not in touched]
            if not free:
                return None
            uid = rng.choice(free)
            touched.add(uid)
            title = rng.choice(world.titles)
            name = world.users[uid]["name"]
            if kind == "create_named":
                sentences.append(rng.choice((
                    f"Create a new task titled '{title}' for {name}.",
                    f"{name} needs a task called '{title}'; please create it.",
                    f"Add a task '{title}' for the user named {name}.")))
                lookup()
                actions.append(_action(len(actions), "create_task", {"user_id": uid, "title": title},
                                       f"create '{title}' for {name}"))
                world.create(uid, title)
            else:
                sentences.append(rng.choice((
                    f"Create a task titled '{title}' for {uid} and then mark it as completed.",
                    f"For {uid}, add a task called '{title}' and set it to completed right away.",
                    f"Log '{title}' as a new task for {uid}; it is already done, so mark it completed.")))
                actions.append(_action(len(actions), "create_task", {"user_id": uid, "title": title},
                                       f"create '{title}' for {uid}"))
                tid = world.create(uid, title)
                touched.add(tid)
                actions.append(_action(len(actions), "update_task_status", {"task_id": tid, "status": "completed"},
                                       f"complete the new {tid}"))
                world.tasks[tid]["status"] = "completed"
        elif kind == "complete_all":
            cands = [u for u in sorted(world.users) if u not in touched and not (set(world.users[u]["tasks"]) & touched)
                     and any(world.tasks[t]["status"] == "pending" for t in world.users[u]["tasks"])]
            if not cands:
                return None
            uid = rng.choice(cands)
            touched.add(uid)
            name = world.users[uid]["name"]
            sentences.append(rng.choice((
                f"Mark all of {name}'s pending tasks as completed.",
                f"{name} has finished everything: complete all of their pending tasks.",
                f"Please complete every pending task that belongs to {name}.")))
            lookup()
            for tid in world.users[uid]["tasks"]:  # completing one already completed leaves the DB as it is
                touched.add(tid)
                if world.tasks[tid]["status"] == "pending":
                    actions.append(_action(len(actions), "update_task_status", {"task_id": tid, "status": "completed"},
                                           f"complete {name}'s {tid}"))
                    world.tasks[tid]["status"] = "completed"
        elif kind == "delete":
            free = [t for t in sorted(world.tasks) if t not in touched]
            if not free:
                return None
            tid = rng.choice(free)
            touched.add(tid)
            sentences.append(rng.choice((
                f"Also, delete {tid} entirely.",
                f"Finally, please remove {tid} from the system.",
                f"And get rid of {tid}: delete it.")))
            actions.append(_action(len(actions), "transfer_to_human_agents",
                                   {"summary": f"The user asks to delete {tid}; deleting tasks is not allowed."},
                                   "policy rule 4: deletion goes to a human"))
    return sentences, actions


def _one_task(rng: random.Random, split: str, index: int) -> dict:
    while True:
        world = _World(rng, split)
        initial = world.initial_data()
        k = rng.choice((1, 1, 2, 2, 3))
        intents = [rng.choice(_WRITE_INTENTS)] + [rng.choice(_INTENTS) for _ in range(k - 1)]
        rng.shuffle(intents)
        if "delete" in intents:  # the transfer comes last
            intents = [i for i in intents if i != "delete"] + ["delete"]
            intents = intents[: intents.index("delete") + 1]
        composed = _compose(rng, world, intents)
        if composed is not None:
            break
    sentences, actions = composed
    ticket = " ".join(sentences)
    task_id = f"{split.split('_', 1)[1]}_{index:04d}"
    return {
        "id": task_id,
        "description": {"purpose": f"generated mock task ({'+'.join(intents)})",
                        "notes": "torchrl-grpo envs/tau2/generated_tasks.py"},
        "user_scenario": {
            "persona": None,
            "instructions": {"domain": "mock",
                             "reason_for_call": ticket,
                             "known_info": "You are a team member with access to the task tracker.",
                             "unknown_info": None,
                             "task_instructions": "Ask the agent to do exactly what you need; stop when it is done."},
        },
        "ticket": ticket,
        "initial_state": {"initialization_data": {"agent_data": initial, "user_data": None},
                          "initialization_actions": None, "message_history": None},
        "evaluation_criteria": {"actions": actions, "env_assertions": None, "communicate_info": None,
                                "nl_assertions": None, "reward_basis": ["DB"]},
    }


@functools.lru_cache(maxsize=None)
def generate_split(split: str) -> tuple[dict, ...]:
    """The tasks of a generated split as tau2 ``Task`` dicts (JSON-ready), regenerated from :data:`SPLIT_SEEDS`.

    Raises:
        ValueError: ``split`` is not one of :data:`GENERATED_SPLITS`.
    """
    if split not in SPLIT_SIZES:
        raise ValueError(f"unknown generated split {split!r}; expected one of {GENERATED_SPLITS}")
    rng = random.Random(SPLIT_SEEDS[split])
    out = []
    seen: set[str] = set()
    forbidden = {t["ticket"] for t in generate_split("generated_train")} if split == "generated_test" else set()
    while len(out) < SPLIT_SIZES[split]:
        task = _one_task(rng, split, len(out))
        if task["ticket"] in forbidden:  # no test ticket equal to a train ticket
            continue
        out.append(task)
        seen.add(task["ticket"])
    return tuple(out)


def split_json(split: str) -> str:
    """The split as canonical JSON text (sorted keys): what :data:`SPLIT_DIGESTS` hashes and what
    ``python -m envs.tau2.generated_tasks SPLIT`` writes (a tasks file for ``tasks_path=``)."""
    return json.dumps(list(generate_split(split)), sort_keys=True, indent=1)


def split_digest(split: str) -> str:
    """sha256 (hex) of :func:`split_json`."""
    return hashlib.sha256(split_json(split).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def generated_tasks(split: str) -> tuple[Any, ...]:
    """The split's tasks as tau2 ``Task`` objects (validated by tau2's pydantic model; cached per process)."""
    from tau2.data_model.tasks import Task

    return tuple(Task.model_validate(t) for t in generate_split(split))


def intents(task) -> tuple[str, ...]:
    """The sub-intents a generated task was composed of, in ticket order (from its ``description.purpose``, e.g.
    ``("create_named", "delete")``). ``task``: a task as a dict (a tasks file's JSON) or a tau2 ``Task``.

    Raises:
        ValueError: ``task`` is not a generated task (no ``generated mock task (...)`` purpose).
    """
    if isinstance(task, dict):
        task_id = task.get("id")
        purpose = (task.get("description") or {}).get("purpose") or ""
    else:
        task_id = getattr(task, "id", None)
        purpose = getattr(getattr(task, "description", None), "purpose", None) or ""
    head = "generated mock task ("
    if not (purpose.startswith(head) and purpose.endswith(")")):
        raise ValueError(f"task {task_id!r} is not a generated mock task (purpose {purpose[:80]!r})")
    return tuple(purpose[len(head):-1].split("+"))


def select_tasks(split: str, *, max_intents: int | None = None, start: int = 0, stop: int | None = None) -> list[dict]:
    """Tasks ``start:stop`` of a generated split (its index order), keeping those of at most ``max_intents``
    sub-intents (``None``: all): a training set for ``train_dataset.path`` (a curriculum of shorter tasks, or tasks
    disjoint from the first ``start`` that an SFT phase used), written by ``python -m envs.tau2.generated_tasks``.

    Raises:
        ValueError: an unknown split, ``max_intents`` < 1, or ``start`` < 0.
    """
    if max_intents is not None and int(max_intents) < 1:
        raise ValueError(f"max_intents must be >= 1, got {max_intents!r}")
    if int(start) < 0:
        raise ValueError(f"start must be >= 0, got {start!r}")
    tasks = generate_split(split)[start:stop]
    return [t for t in tasks if max_intents is None or len(intents(t)) <= max_intents]


def main(argv: list[str] | None = None) -> int:
    """``python -m envs.tau2.generated_tasks SPLIT [--max-intents K] [--start N] [--stop M]``: the split (or the
    selection of :func:`select_tasks`) as a JSON tasks file on stdout; with no split, each split's digest."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m envs.tau2.generated_tasks", description=main.__doc__)
    p.add_argument("split", nargs="?", choices=GENERATED_SPLITS)
    p.add_argument("--max-intents", type=int, default=None, help="keep tasks of at most K sub-intents (1-3)")
    p.add_argument("--start", type=int, default=0, help="first task index (e.g. past the SFT phase's sft.limit)")
    p.add_argument("--stop", type=int, default=None, help="one past the last task index")
    a = p.parse_args(argv)
    if a.split is None:
        for s in GENERATED_SPLITS:
            print(s, split_digest(s))
        return 0
    try:
        tasks = select_tasks(a.split, max_intents=a.max_intents, start=a.start, stop=a.stop)
    except ValueError as e:
        p.error(str(e))
    if not tasks:
        p.error("the selection is empty")
    sys.stdout.write(json.dumps(tasks, sort_keys=True, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through main() in tests
    raise SystemExit(main())
