"""A run config's rollout side -> objects: the one :class:`SamplingConfig`, the backend, the Ray rollout workers.

- :func:`sampling_config`: ``gconfig`` -> the run's one :class:`~torchrl_grpo.backends.base.SamplingConfig`, derived
  once by :func:`torchrl_grpo.assembly.build`; every other sampling setting of the run is a ``dataclasses.replace`` of
  it (evaluation's greedy / sampled: :func:`torchrl_grpo.rollout.evaluation.eval_samplings`; the local LLM user:
  :func:`torchrl_grpo.assembly.environments.local_user_sampling`; the loss's: :func:`loss_sampling`; the Ray workers get
  the object itself);
- :func:`backend_from_config`: ``rollout.backend``, the settings that backend registered (``rollout.*`` keys and its
  own section), ``actor.path`` / ``actor.peft.enable`` / ``seed`` -> a rollout backend
  (:func:`torchrl_grpo.backends.factory.make_backend`);
- :func:`worker_rollout`: the picklable recipe a Ray rollout actor runs in its own process (its model, backend and
  collector from the run config as a plain dict); :func:`ray_collector` hands it to
  :class:`torchrl_grpo.rollout.ray_workers.RayRolloutCollector`, which never sees the config.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
from omegaconf import OmegaConf

from torchrl_grpo.assembly.environments import build_env_side
from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.backends.factory import backend_spec, make_backend
from torchrl_grpo.model_store import load_model_and_tokenizer

# imports ray only when one is constructed
from torchrl_grpo.rollout.ray_workers import RayRolloutCollector
from torchrl_grpo.seeding import seed_everything

__all__ = ["backend_from_config", "loss_sampling", "ray_collector", "sampling_config", "worker_rollout"]


def sampling_config(cfg) -> SamplingConfig:
    """The run's one sampling config: ``gconfig.max_new_tokens`` / ``temperature`` / ``top_p`` / ``top_k``.

    Raises:
        ValueError: values :class:`SamplingConfig` refuses (``max_new_tokens < 1``, a negative temperature, ...).
    """
    g = cfg.gconfig
    return SamplingConfig(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k)


def loss_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """The distribution the loss scores under (:class:`torchrl_grpo.objectives.loss.GRPOLoss`'s ``temperature`` /
    ``top_p`` / ``top_k``): the rollouts' own, except that greedy rollouts (temperature 0) report the raw softmax,
    with no truncation (see :mod:`torchrl_grpo.objectives.loss`)."""
    if sampling.temperature <= 0:
        return replace(sampling, temperature=1.0, top_p=1.0, top_k=0)
    return sampling


def backend_from_config(cfg, model: torch.nn.Module, tokenizer, *, own_copy: bool,
                        device: torch.device | str | None = None) -> RolloutBackend:
    """:func:`~torchrl_grpo.backends.factory.make_backend` with the settings of a run config: ``rollout.backend``,
    the keys under ``rollout`` that backend registered (:attr:`~torchrl_grpo.backends.factory.BackendSpec.settings`:
    transformers ``max_batch_size`` / ``decode``, vLLM its ``rollout.vllm`` section), and the engine-neutral
    ``actor.path`` (the checkpoint an engine with its own weights loads), ``actor.peft.enable`` (a LoRA policy) and
    ``seed``. ``own_copy`` and ``device`` as in ``make_backend`` (the build's placement decides them).

    Raises:
        ValueError / ImportError: as ``make_backend``; a ``rollout.backend`` that is not registered is refused there
            (and at start-up by :func:`torchrl_grpo.config.validate_config`, against
            :data:`~torchrl_grpo.config.choices.BACKENDS`).
    """
    r = cfg.rollout
    spec = backend_spec(r.backend)
    absent = object()
    values = {name: OmegaConf.select(r, key, default=absent) for key, name in zip(spec.settings, spec.setting_names)}
    settings = {name: v for name, v in values.items() if v is not absent}  # absent keys: the factory's defaults
    return make_backend(r.backend, model, tokenizer, own_copy=own_copy, device=device, model_path=cfg.actor.path,
                        seed=cfg.seed, lora=bool(cfg.actor.peft.enable), **settings)


def worker_rollout(config: dict, sampling: SamplingConfig, device: str):
    """What one Ray rollout actor builds in its process (:class:`~torchrl_grpo.rollout.ray_workers.RolloutWorker`
    calls it): seeds (``seed``), its own copy of ``actor.path`` on ``device``, frozen, a backend on it that takes
    synced weights by ``load_weights`` (never shared with a trainer module), and the train collector of the run's
    env side (:func:`torchrl_grpo.assembly.environments.build_env_side`) with the run's ``sampling``.

    Args:
        config: the run config as plain containers (``OmegaConf.to_container(cfg, resolve=True)``: picklable).
        sampling: the run's one sampling config (:func:`sampling_config`).
        device: ``cpu`` or ``cuda`` (the actor's GPU).

    Returns:
        ``(backend, collector)``.
    """
    c = OmegaConf.create(config)
    seed_everything(c.seed)
    model, tokenizer = load_model_and_tokenizer(c.actor.path, dtype=c.actor.dtype, device=device)
    model.eval().requires_grad_(False)
    backend = backend_from_config(c, model, tokenizer, own_copy=False)  # the worker's own module: sync copies in
    if getattr(backend, "share_module", False):
        backend.share_module = False  # weights arrive by load_weights into this actor's module
    return backend, build_env_side(c, backend, tokenizer, sampling).collector


def ray_collector(cfg, sampling: SamplingConfig, local_backend: RolloutBackend):
    """``rollout.num_workers`` Ray actors (``rollout.launcher=ray``), each running :func:`worker_rollout` on the run
    config; ``rollout.max_worker_restarts``, ``rollout.worker_timeout_s``, ``train.device`` (``cpu``: CPU actors).

    Raises:
        ImportError / ValueError: as :class:`~torchrl_grpo.rollout.ray_workers.RayRolloutCollector`.
    """
    recipe = functools.partial(worker_rollout, OmegaConf.to_container(cfg, resolve=True), sampling)
    r = cfg.rollout
    return RayRolloutCollector(recipe, r.num_workers, device=cfg.train.device, local_backend=local_backend,
                               max_restarts=r.max_worker_restarts, worker_timeout_s=r.worker_timeout_s)
