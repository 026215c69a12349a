"""The gold-replay agent: a task's gold actions as a sequence of agent actions.

Used by the test suite (gold replay must score what tau2's ``evaluate_simulation`` scores it: 1.0 except on the two
tau2 mock tasks named in ``Tau2Env.demonstration``)
and by ``benchmarks/env_bench.py`` (the same episodes through ``Tau2Env`` and tau2's
``AgentGymEnv``). Not a policy: it reads the task's evaluation criteria.

Sequence for a task: one assistant message per gold action, as a tool call (in solo mode the
customer's gold actions are called by the agent, tau2 routes them to the user tools; without
solo mode they are skipped -- the customer would have to perform them); then, if the task lists
``communicate_info``, one message to the customer containing all of it; then the stop: a
``done`` call in solo mode, ``###STOP###`` otherwise. ``reads_first`` (``Tau2Env(gold_reads_first=)``) puts calls of
read-only tools without arguments before the gold actions, unless the gold already opens with them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .domain import STOP_TOKEN, STOP_TOOL
from .messages import openai_tool_call

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

__all__ = ["oracle_actions", "oracle_functional_actions"]


def _gold(task: "Task", solo: bool) -> list:
    criteria = task.evaluation_criteria
    actions = (criteria.actions or []) if criteria is not None else []
    return [a for a in actions if solo or a.requestor == "assistant"]


def oracle_actions(task: "Task", solo: bool, reads_first: tuple[str, ...] = ()) -> list[dict]:
    """Assistant message dicts replaying ``task``'s gold actions (see module docstring); ``reads_first``: names of
    read-only tools without arguments called first (each unless the gold's calls already open with it)."""
    out: list[dict] = []
    gold = _gold(task, solo)
    opening = [a.name for a in gold[:len(reads_first)]]
    for j, name in enumerate(reads_first):
        if name not in opening:
            out.append({"role": "assistant", "content": None, "tool_calls": [openai_tool_call(f"read_{j}", name, {})]})
    for i, a in enumerate(gold):
        out.append({"role": "assistant", "content": None, "tool_calls": [openai_tool_call(f"gold_{i}", a.name, a.arguments)]})
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria is not None else []
    if infos:
        out.append({"role": "assistant", "content": "Here is the information you asked for: " + "; ".join(infos) + "."})
    if solo:
        out.append({"role": "assistant", "content": None, "tool_calls": [openai_tool_call("gold_done", STOP_TOOL, {})]})
    else:
        out.append({"role": "assistant", "content": f"Thank you for contacting us. {STOP_TOKEN}"})
    return out


def oracle_functional_actions(task: "Task", solo: bool) -> list[str]:
    """The same sequence as :func:`oracle_actions` as action strings for tau2's ``AgentGymEnv``
    (JSON tool calls, which tau2's ``parse_action_string`` reads, and plain text)."""
    import json

    out: list[str] = []
    for a in _gold(task, solo):
        out.append(json.dumps({"name": a.name, "arguments": a.arguments}))
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria is not None else []
    if infos:
        out.append("Here is the information you asked for: " + "; ".join(infos) + ".")
    out.append(json.dumps({"name": STOP_TOOL, "arguments": {}}) if solo else f"Thank you for contacting us. {STOP_TOKEN}")
    return out
