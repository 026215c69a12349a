"""Reasoning Gym's procedural reasoning tasks as a one-turn Gymnasium env (id ``ReasoningGym-v1``).

:mod:`.data` resolves task names / configs / curriculum levels and builds the disjoint train and test splits,
:mod:`.grading` extracts the answer from model text and bounds it before the library's ``score_answer``,
:mod:`.env` is the env. ``ReasoningGymEnv`` is imported lazily by the Gymnasium registry.
"""
from .data import resolve_spec, split_items, valid_tasks
from .env import DEFAULT_SYSTEM_PROMPT, ReasoningGymEnv
from .grading import answer_guard, extract_answer

__all__ = ["ReasoningGymEnv", "DEFAULT_SYSTEM_PROMPT", "resolve_spec", "split_items", "valid_tasks",
           "extract_answer", "answer_guard"]
