"""The verifiers 0.4 plugin of this project: taskset id ``gym-taskset``, every registered id of :mod:`envs`.

verifiers 0.4's loader imports a taskset by its id as a top-level module (``gym-taskset`` -> ``gym_taskset``) and
takes the ``Taskset``, ``Env`` and ``Harness`` subclasses it exports; the implementation and its documentation are
in :mod:`envs.adapters.verifiers_v1_env`. Importing this package imports verifiers (0.4, its own venv).
"""
from envs.adapters.verifiers_v1_env import GymChatHarness, GymEnv, GymTaskset

__all__ = ["GymChatHarness", "GymEnv", "GymTaskset"]
