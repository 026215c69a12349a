"""The collector's episode status (torchrl_grpo.rollout.collector.Episode / EndReason): one end reason per episode,
set once, and the batch flags (done, terminated, truncated, context_truncated, infra_error) read from it and from
the env's last step."""
from __future__ import annotations

import pytest

from torchrl_grpo.rollout.collector import Episode, EndReason


def _flags(ep: Episode) -> tuple[bool, bool, bool, bool, bool]:
    return ep.done, ep.terminated, ep.truncated, ep.context_truncated, ep.infra_error


def test_each_end_reason_gives_its_flags():
    ep = Episode(group_id=0, task={}, index=0)
    assert _flags(ep) == (False, False, False, False, False)
    ep.end(EndReason.CONTEXT)
    assert _flags(ep) == (True, False, False, True, False)
    ep = Episode(group_id=0, task={}, index=1)
    ep.end(EndReason.TURN_LIMIT)
    assert _flags(ep) == (True, False, True, False, False)
    ep = Episode(group_id=0, task={}, index=2)
    ep.record_step({"termination_reason": "agent_stop"}, None, 1.0, True, True)  # the env may set both flags
    assert ep.end_reason is EndReason.ENV and _flags(ep) == (True, True, True, False, False) and ep.reward == 1.0


def test_an_episode_ends_once():
    ep = Episode(group_id=0, task={}, index=3)
    ep.end(EndReason.CONTEXT)
    with pytest.raises(RuntimeError, match="already ended"):
        ep.end(EndReason.TURN_LIMIT)
    assert ep.end_reason is EndReason.CONTEXT


def test_env_error_keeps_the_previous_steps_reward_and_flags_and_the_error_info():
    ep = Episode(group_id=0, task={}, index=0)
    ep.record_step({"action_error": "bad call"}, [{"role": "user", "content": "hi"}], 0.5, False, False)
    assert not ep.done and ep.action_errors == 1 and ep.reward == 0.5
    ep.record_step({"termination_reason": "env_error", "error": "down", "action_error": "x"}, None, 9.0, True, False)
    assert ep.end_reason is EndReason.ENV_ERROR and ep.infra_error
    assert (ep.reward, ep.terminated, ep.action_errors) == (0.5, False, 1)  # the failed step scored nothing
    assert ep.info == {"termination_reason": "env_error", "error": "down", "action_error": "x"}


def test_an_infrastructure_termination_reason_stays_reported_while_the_episode_goes_on():
    """``user_error`` (INFRA_TERMINATIONS) without terminated/truncated: the episode is still played, and stays
    flagged ``infra_error`` after later steps report nothing (the trainer drops its group)."""
    ep = Episode(group_id=0, task={}, index=0)
    ep.record_step({"termination_reason": "user_error"}, None, 0.0, False, False)
    assert not ep.done and ep.infra_error
    ep.record_step({}, [{"role": "user", "content": "ok"}], 1.0, True, False)
    assert ep.end_reason is EndReason.ENV and ep.infra_error
    assert ep.info == {"messages": [{"role": "user", "content": "ok"}]}
