"""The domain sequence of a continual run: the per-domain defaults, the run config of one domain and the checks of
the ``cl.*`` section that must fail before any model loads.

The config side (:data:`DOMAIN_DEFAULTS`, :func:`domain_config`, the checks of names and ranges) is rules about
config values and lives in :mod:`torchrl_grpo.config.continual` (re-exported here); this module adds what needs the
envs: every domain's train and eval split must have usable tasks (:func:`check_domain_tasks`,
:func:`validate_cl_config`). See :mod:`torchrl_grpo.config.continual` for how a domain's config is made.
"""
from __future__ import annotations

from torchrl_grpo.config.choices import CL_METRICS as METRICS  # cl.metric: the scores an accuracy matrix can hold
from torchrl_grpo.config.continual import CL_DOMAINS, DOMAIN_DEFAULTS, domain_config, validate_cl_settings
from torchrl_grpo.rollout.env_side import env_kwargs_from_config, make_env_fn, usable_task_indices

__all__ = ["CL_DOMAINS", "DOMAIN_DEFAULTS", "METRICS", "domain_config", "validate_cl_config", "check_domain_tasks"]


def validate_cl_config(cfg, *, check_tasks: bool = True) -> None:
    """Check the ``cl`` section: names, ranges, the user mode of every domain
    (:func:`torchrl_grpo.config.continual.validate_cl_settings`) and (``check_tasks``) that every domain's train and
    eval split has usable tasks (:func:`check_domain_tasks`). Builds envs, never a model.

    Raises:
        ValueError: an empty or unknown ``cl.task_order`` entry (or one listed twice), ``num_steps_per_task < 1``,
            a bad ``max_tasks_per_domain`` / ``eval_interval`` / ``replay_ratio`` / ``kl_coef`` / ``buffer_size``,
            an unknown ``metric`` / ``algorithm``, ``mode=async``, a per-domain setting for an unknown domain or with
            an unknown econfig key, a domain without a usable user mode (airline/retail with ``solo_mode=true``),
            an unknown or empty split.
    """
    validate_cl_settings(cfg)
    if check_tasks:
        for d in [str(d) for d in cfg.cl.task_order]:
            check_domain_tasks(domain_config(cfg, d), d)


def check_domain_tasks(dcfg, domain: str) -> dict[str, int]:
    """Build ``domain``'s train and eval envs as configured (a local user is checked as a scripted one: which tasks
    are usable depends on solo vs. customer, not on who plays the customer) and count their usable tasks.

    Returns:
        ``{"train": n_train, "eval": n_eval}`` (eval: at most ``eval.n_problems``).

    Raises:
        ValueError: an unknown split (the env's message lists the valid ones) or one without usable tasks.
    """
    out = {}
    for kind, ds, limit in (("train", dcfg.train_dataset, dcfg.train_dataset.limit),
                            ("eval", dcfg.valid_dataset, dcfg.eval.n_problems)):
        env_id, kw = env_kwargs_from_config(dcfg, ds.split, ds.path or dcfg.train_dataset.path,
                                            user_fn=lambda *a, **k: "")
        if kw.get("user") == "callable":
            kw = {k: v for k, v in kw.items() if k != "user_fn"} | {"user": "scripted"}
        try:
            env = make_env_fn(env_id, **kw)()
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise ValueError(f"cl domain {domain!r}: cannot build its {kind} env ({ds.split!r} split): {e}") from None
        try:
            n = len(usable_task_indices(env, limit))
        finally:
            env.close()
        if n < 1:
            raise ValueError(f"cl domain {domain!r}: the {kind} split {ds.split!r} has no usable tasks as configured "
                             f"(econfig.solo_mode={dcfg.econfig.get('solo_mode')})")
        out[kind] = n
    return out
