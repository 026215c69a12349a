"""torchrl_grpo.rollout.env_side / evaluation read task lists and the do-nothing baseline from the env contract."""
import gymnasium as gym
import pytest

from envs.gsm8k.env import GSM8KEnv
from envs.tau2.env import DO_NOTHING_ACTION
from torchrl_grpo.rollout.env_side import make_env_fn, num_tasks, usable_task_indices
from torchrl_grpo.rollout.evaluation import do_nothing_baseline

TOY = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]


class _NoHooks(gym.Env):
    """A test double that lists its tasks only through ``num_tasks``."""

    num_tasks = 4


def test_task_lists_come_from_the_env():
    env = gym.make("GSM8K-v1", data=TOY)
    assert num_tasks(env) == 3 and usable_task_indices(env) == [0, 1, 2] and usable_task_indices(env, 2) == [0, 1]
    mock_solo = make_env_fn("tau2/mock-v0", user="solo")()
    assert num_tasks(mock_solo) == 9 and usable_task_indices(mock_solo) == mock_solo.usable_task_indices()
    assert len(usable_task_indices(mock_solo)) == 7
    assert num_tasks(_NoHooks()) == 4 and usable_task_indices(_NoHooks(), 3) == [0, 1, 2]
    with pytest.raises(TypeError, match="num_tasks"):
        num_tasks(gym.Env())


def test_do_nothing_baseline_uses_the_envs_action():
    assert do_nothing_baseline(lambda: GSM8KEnv(data=TOY), [0, 1]) == {}  # GSM8K has none
    make = make_env_fn("tau2/mock-v0", user="scripted")
    own = do_nothing_baseline(make, [0, 1, 2])
    assert own == do_nothing_baseline(make, [0, 1, 2], action=DO_NOTHING_ACTION)
    assert set(own) == {"eval/do_nothing_reward", "eval/do_nothing_pass^1"} and 0.0 <= own["eval/do_nothing_reward"] <= 1.0
    assert make().do_nothing_action == DO_NOTHING_ACTION
