"""tau2-bench domains (airline, retail, telecom, mock) as Gymnasium text environments.

Usage::

    import gymnasium as gym, envs
    gym.register_envs(envs)
    env = gym.make("tau2/airline-v0", split="test", user="scripted")
    obs, info = env.reset(seed=0, options={"task_id": "3"})
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": ...}</tool_call>')

Modules (one concept each):

- :mod:`envs.tau2.env` -- :class:`Tau2Env`, the Gymnasium environment.
- :mod:`envs.tau2.tasks` -- splits and tasks through tau2's registry, loaded once per process.
- :mod:`envs.tau2.task_file` -- a user's own task file (``tasks_path=``), checked and cached per file version.
- :mod:`envs.tau2.domain` -- per-domain runtime: policy, tools, prompts, fresh tau2
  ``Environment`` per episode, cached gold databases.
- :mod:`envs.tau2.cow` -- copy-on-write database tables (fast resets, fast DB comparison).
- :mod:`envs.tau2.actions` -- model text / message dicts -> tool calls.
- :mod:`envs.tau2.messages` -- OpenAI dicts <-> tau2 message objects.
- :mod:`envs.tau2.users` -- scripted, LLM (tau2 ``UserSimulator``) and callable users.
- :mod:`envs.tau2.rewards` -- tau2's reward (``evaluate_simulation``) and the partial reward.
- :mod:`envs.tau2.logs` -- tau2's loguru output switch (off by default).

Importing this package sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (unless already set) so that
litellm, which tau2 imports, never fetches its model cost map over the network, and turns tau2's
loguru output off (unless ``$TAU2_LOG`` is ``1``; see :mod:`envs.tau2.logs`); tau2 itself is
imported only by the submodules that need it.
"""
import os as _os

_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from .logs import set_tau2_logging as _set_tau2_logging, tau2_logging_default as _tau2_logging_default

# tau2 logs at import time too (".env", litellm cache notes): silence it before any import of tau2.
_set_tau2_logging(_tau2_logging_default())

__all__ = ["Tau2Env"]


def __getattr__(name):
    # Lazy: ``import envs.tau2`` stays cheap; tau2 (and litellm) load on first use.
    if name == "Tau2Env":
        from .env import Tau2Env

        return Tau2Env
    raise AttributeError(f"module 'envs.tau2' has no attribute {name!r}")
