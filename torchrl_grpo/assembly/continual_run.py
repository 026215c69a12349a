"""A continual run built from its config: :func:`build_continual_trainer` (what :func:`torchrl_grpo.assembly.build_trainer`
returns when ``cl.task_order`` is set). Here, and in :mod:`torchrl_grpo.config.continual_domains` (the per-domain configs and
the checks that need no env), the ``cl`` section becomes plain values and built objects: the continual trainer reads no
config.

The phases, in order (each a function of its own):

1. :func:`check_continual`: the ``cl`` section, every domain's splits (envs are built, never a model:
   :func:`validate_cl_config`) and the resume checkpoint's state (:func:`read_resume_state`) — a bad setting fails
   here, before any model loads;
2. :func:`torchrl_grpo.assembly.build` on the first domain's config (:func:`torchrl_grpo.config.continual_domains.domain_config`):
   model, backend, optimizer, the LR schedule over the whole sequence (``train.steps`` = steps per task x domains),
   logger;
3. :func:`domain_sides`: one :class:`~torchrl_grpo.rollout.env_side.EnvSide` per domain on that backend (the first
   domain's is the components' own);
4. :func:`continual_settings` (:class:`~torchrl_grpo.continual.settings.ContinualSettings`) and
   :func:`make_algorithm` (``cl.algorithm``);
5. the trainer class on them.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.assembly.phases import build
from torchrl_grpo.assembly.environments import build_env_side, env_kwargs_from_config
from torchrl_grpo.config.continual_domains import domain_config, validate_cl_settings
from torchrl_grpo.continual.algorithms import ALGORITHMS, CLAlgorithm
from torchrl_grpo.continual.task_checkpoints import read_resume_state
from torchrl_grpo.continual.settings import ContinualSettings
from torchrl_grpo.continual.trainer import ContinualTrainer
from torchrl_grpo.rollout.env_side import EnvSide, make_env_fn, train_task_indices
from torchrl_grpo.training.components import Components

__all__ = ["build_continual_trainer", "check_continual", "validate_cl_config", "check_domain_tasks", "domain_sides",
           "continual_settings", "make_algorithm"]


def validate_cl_config(cfg, *, check_tasks: bool = True) -> None:
    """Check the ``cl`` section: names, ranges, the user mode of every domain
    (:func:`torchrl_grpo.config.continual_domains.validate_cl_settings`) and (``check_tasks``) that every domain's train and
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
        train = kind == "train"
        env_id, kw = env_kwargs_from_config(dcfg, ds.split, ds.path or dcfg.train_dataset.path,
                                            user_fn=lambda *a, **k: "",
                                            max_intents=dcfg.train_dataset.max_intents if train else None)
        if kw.get("user") == "callable":
            kw = {k: v for k, v in kw.items() if k != "user_fn"} | {"user": "scripted"}
        try:
            env = make_env_fn(env_id, **kw)()
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise ValueError(f"cl domain {domain!r}: cannot build its {kind} env ({ds.split!r} split): {e}") from None
        try:
            n = len(train_task_indices(env, limit, int(dcfg.train_dataset.start) if train else 0))
        finally:
            env.close()
        if n < 1:
            raise ValueError(f"cl domain {domain!r}: the {kind} split {ds.split!r} has no usable tasks as configured "
                             f"(econfig.solo_mode={dcfg.econfig.get('solo_mode')})")
        out[kind] = n
    return out


def check_continual(cfg) -> dict | None:
    """Phase 1: :func:`validate_cl_config` and, with ``cl.resume_from``, its checked state
    (:func:`torchrl_grpo.continual.task_checkpoints.read_resume_state`; None without). Builds envs, never a model.

    Raises:
        ValueError: as :func:`validate_cl_config`; a resume checkpoint from another task order, of a joint run, or
            of a finished run.
        FileNotFoundError: ``cl.resume_from`` without its ``cl_state.json``.
    """
    validate_cl_config(cfg)
    c = cfg.cl
    return read_resume_state(c.resume_from, [str(d) for d in c.task_order]) if c.resume_from else None


def domain_sides(cfg, components: Components) -> dict[str, EnvSide]:
    """Phase 3: domain -> its env side, in task order, on ``components``' backend, tokenizer and sampling settings:
    the first domain's is the components' own ``env_side`` (the same object), every other one is built from its
    :func:`~torchrl_grpo.config.continual_domains.domain_config` (:func:`torchrl_grpo.assembly.environments.build_env_side`).
    Sides built before a failure are closed.

    Raises:
        ValueError: a domain's bad env settings or empty train split.
    """
    c = components
    domains = [str(d) for d in cfg.cl.task_order]
    sides = {domains[0]: c.env_side}  # the components' own (one object: use_env switches between these)
    try:
        for d in domains[1:]:
            sides[d] = build_env_side(domain_config(cfg, d), c.backend, c.tokenizer, c.sampling)
    except Exception:
        for d in domains[1:]:
            if d in sides:
                sides[d].close()
        raise
    return sides


def continual_settings(cfg) -> ContinualSettings:
    """Phase 4: the plain settings of the continual trainer from the ``cl`` section (and the resolved config, kept
    in every task checkpoint)."""
    c = cfg.cl
    return ContinualSettings(
        domains=tuple(str(d) for d in c.task_order), num_steps_per_task=int(c.num_steps_per_task),
        eval_interval=int(c.eval_interval), metric=str(c.metric), save_checkpoints=bool(c.save_checkpoints),
        kl_to_base=bool(c.kl_to_base), kl_anchor=c.kl_coef > 0, buffer_size=int(c.buffer_size),
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True))


def make_algorithm(cl_cfg, seed: int = 0) -> CLAlgorithm:
    """Phase 4: the algorithm named by ``cl.algorithm`` (:data:`torchrl_grpo.continual.algorithms.ALGORITHMS`), built
    by its own ``from_config`` from the ``cl`` section as plain values (``replay_ratio``, ``ewc_lambda``, ...) and
    ``seed``.

    Raises:
        ValueError: an unknown name; a setting the algorithm needs missing or out of range.
    """
    settings = OmegaConf.to_container(cl_cfg, resolve=True) if OmegaConf.is_config(cl_cfg) else dict(cl_cfg)
    name = settings.get("algorithm")
    if name not in ALGORITHMS:
        raise ValueError(f"cl.algorithm={name!r} is not one of {tuple(ALGORITHMS)}")
    return ALGORITHMS[name].from_config(settings, seed=seed)


def build_continual_trainer(cfg, run_dir: str | Path | None, *, trainer_cls: type = ContinualTrainer, model=None,
                            tokenizer=None, backend: RolloutBackend | None = None,
                            algorithm: CLAlgorithm | None = None, **trainer_kw) -> ContinualTrainer:
    """The :class:`~torchrl_grpo.continual.trainer.ContinualTrainer` (or ``trainer_cls``, a subclass) of ``cfg``, in
    the phases of the module docstring.

    Args:
        cfg: the run config with a ``cl`` section (:class:`torchrl_grpo.config.ContinualConfig`).
        run_dir: output directory (default ``cfg.output_dir``, else ``outputs/continual``).
        model / tokenizer / backend: optional preloaded policy and rollout backend, passed to
            :func:`~torchrl_grpo.assembly.build`.
        algorithm: the :class:`~torchrl_grpo.continual.algorithms.CLAlgorithm` (default: :func:`make_algorithm`).
        **trainer_kw: further keyword arguments of ``trainer_cls``.

    Raises:
        ValueError, FileNotFoundError: as :func:`check_continual` (before any model loads) and
            :func:`~torchrl_grpo.assembly.build`.
    """
    resume = check_continual(cfg)
    run_dir = Path(run_dir or cfg.output_dir or "outputs/continual")
    components = build(domain_config(cfg, str(cfg.cl.task_order[0])), run_dir, model=model, tokenizer=tokenizer,
                       backend=backend)
    try:
        sides = domain_sides(cfg, components)
    except Exception:
        for part in (components.env_side, components.logger, components.backend):
            part.close()
        raise
    return trainer_cls(components, sides, continual_settings(cfg),
                       algorithm=algorithm or make_algorithm(cfg.cl, seed=cfg.seed), resume=resume, **trainer_kw)
