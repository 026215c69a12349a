"""Text environments for LLM agents: GSM8K, IFEval (instruction following), Reasoning Gym and tau2-bench domains.

Importing this package registers the Gymnasium ids::

    import gymnasium as gym, envs
    gym.register_envs(envs)
    env = gym.make("GSM8K-v1", split="test")
    env = gym.make("IFEval-v0", split="train")       # extra [ifeval]
    env = gym.make("ReasoningGym-v1", task="chain_sum", split="test")
    env = gym.make("tau2/telecom-v0")

Every registered env follows the contract written in :mod:`envs.contract` (observation, action,
reward, ``info`` keys, step order, task listing, training hooks), checked on every registered id
by ``tests/test_env_contract.py``.

Each family registers itself from its own folder (``envs/<family>/family.py``, :mod:`envs.families`); importing
``envs`` discovers them. Registration is lazy (entry-point strings): importing ``envs`` loads neither tau2 nor any
data.
This package never imports ``torchrl_grpo``.

Versioning policy (Gymnasium's): an id's version is bumped whenever its reward semantics change -- the
reward an answer or trajectory gets (grader, reward function, a default reward option), or the problems of
a split -- since results are quoted by id (``benchmarks/results/*.md``) and must stay comparable under it.
Fixes that only turn a crash or a hang into an error observation change no scored episode and keep the
version. Each env class ends its docstring with a ``## Version History``: Gymnasium's semantic bullets, one per
version, oldest first, ``- v<N> (<date>[, <sha>]): <what changed in rewards / observations / actions>``, checked by
``tests/test_env_version_history.py``. A superseded id is
not registered: ``gym.make`` of it raises Gymnasium's ``DeprecatedEnv`` naming the current one. Two
changes were made under a v0 id before the policy was applied (GSM8K: format credit off by default in
ad0c272; ReasoningGym: hash-partitioned splits in 79adad0); the ids were bumped to v1 on 2026-11-26 and
their Version History entries say which recorded results are v0 and which v1.
"""
from envs.families import compat_ids as _compat_ids, contract_ids as _contract_ids, discover as _discover

__all__ = ["TAU2_DOMAINS", "ENV_IDS", "COMPAT_IDS"]

#: the registered families (:mod:`envs.families`: each ``envs/<family>/family.py`` registers its ids)
_FAMILIES = _discover()

#: the tau2 domains registered as ``tau2/<domain>-v0`` (:mod:`envs.tau2.family`)
TAU2_DOMAINS = tuple(i.split("/")[1].rsplit("-v", 1)[0] for i in _FAMILIES["tau2"].ids
                     if i not in _FAMILIES["tau2"].compat_ids)

#: Ids that follow :mod:`envs.contract`, derived from the family registry (checked on every id by
#: ``tests/test_env_contract.py``).
ENV_IDS = _contract_ids()

#: Ids that follow another project's API instead of :mod:`envs.contract` (each tested in its own
#: file): ``tau2/agent-gym-v0`` is tau2's ``tau-bench-v0`` API (string observations) over our
#: Tau2Env (:mod:`envs.tau2.agent_gym_compat`).
COMPAT_IDS = _compat_ids()
