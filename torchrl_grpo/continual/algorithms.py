"""Continual-learning algorithms as hooks on the GRPO loop, and the batch concatenation replay needs.

A :class:`CLAlgorithm` is called by :class:`torchrl_grpo.continual.trainer.ContinualTrainer` at four points (subclass
it and pass an instance as ``build_trainer(cfg, run_dir, algorithm=...)``; ``self.cl`` is the continual run, seen
through :class:`ContinualRun`: what an algorithm may use of it)::

    pre_task(trainer, domain)       before the first step on ``domain``
    augment_batch(batch, domain)    the collected batch of each step (TensorDict [N], torchrl_grpo.rollout.collector) ->
                                    the batch to train on (before advantages; may add rows, never reorder them)
    post_step(trainer, domain)      after each trainer step
    post_task(trainer, domain)      after the last step on ``domain`` (before the boundary evaluation)
    eval_context(trainer, domain)   a context manager the scoring of ``domain`` runs in (default: none)
    state_dict() / load_state_dict(trainer, state)
                                    what a resumed run needs beyond the trainer checkpoint (saved in every task
                                    checkpoint as ``cl_algorithm.pt``; loaded before the weights and optimizer state)
    on_resume_without_state(trainer, domain, task_done)
                                    resumed from a checkpoint holding no state of this hook (default: nothing)

and declares what the continual trainer asks of it instead of testing its class: ``name``, ``joint`` (True: one
joint stage over all domains, each step's domain from ``domain_for_step(step, domains)``) and the classmethod
``from_config(settings, seed=)`` (plain ``cl`` settings -> an instance).

Registry: ``@register_algorithm`` on the class puts it in :data:`ALGORITHMS` under its ``name`` (the ``cl.algorithm``
values; :func:`torchrl_grpo.assembly.continual_run.make_algorithm` builds one with its ``from_config``). The config
leaf keeps its own copy of the names (:data:`torchrl_grpo.config.choices.CL_ALGORITHMS`: ``cl`` is validated before
anything of this layer loads); ``tests/test_cl_config.py`` keeps the two equal.

An algorithm changes the training only through public methods: the update's
(:class:`torchrl_grpo.training.update.GRPOUpdate`) ``add_loss_penalty(fn, name)`` (EWC), ``set_reference(ctx_factory)``
(the KL anchor) and ``set_trainable(params)`` (LoRA per domain: the optimizer's parameters), the model's own API
(peft adapters), the backend's ``sync_from``, and the run's :class:`ContinualRun` (buffer, past domains, rollouts).

Built here (``cl.algorithm``, :data:`ALGORITHMS`):

* ``sequential`` — plain fine-tuning domain after domain (the baseline forgetting is measured against).
* ``replay`` — on-policy replay of past domains' prompts: each step adds ``ceil(cl.replay_ratio * B)`` tasks
  (B = ``train.batch_size``) drawn from the tasks seen on earlier domains (:meth:`TrajectoryBuffer.sample_tasks`:
  domain uniform, then task uniform), rolled out *now* with the current policy (``n_samples`` episodes each, so they
  form ordinary GRPO groups with their own group-relative advantages). The current domain keeps its B tasks, so
  its learning signal equals the sequential run's; replayed groups are ``r/(1+r)`` of the batch. On-policy replay
  of old prompts, rather than replaying stored off-policy trajectories, is the variant reported to work best for
  RL-trained LLMs (stored trajectories would need importance weights from a policy that no longer exists).
* ``ewc`` — elastic weight consolidation (:class:`EWC`, a baseline): a diagonal-Fisher penalty pulling the
  weights towards those that ended each earlier task (``cl.ewc_lambda``).
* ``lora_per_domain`` — one LoRA adapter per domain (:class:`LoRAPerDomain`; the no-forgetting reference point).
* ``joint`` — the upper bound: one stage over all domains, the trained domain rotating every step (round robin),
  ``cl.num_steps_per_task * T`` steps in all; the result is one row of scores, not a T x T matrix.

With ``cl.kl_coef > 0`` any of them also gets :class:`KLAnchor`: the loss's k3 KL term (``loss.kl_coef``, see
:mod:`torchrl_grpo.objectives.loss`) is taken to the policy as it was at the end of the previous task (the untrained model
during the first task) instead of to the initial model.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager, nullcontext
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from torchrl_grpo.continual.trajectory_buffer import TrajectoryBuffer
from torchrl_grpo.rollout.collector import concat_batches  # replay joins past groups to a batch (public here too, as before)
from torchrl_grpo.training.grpo_trainer import GRPOTrainer

__all__ = ["CLAlgorithm", "ContinualRun", "Sequential", "Replay", "Joint", "EWC", "LoRAPerDomain", "KLAnchor",
           "ALGORITHMS", "concat_batches"]


class ContinualRun(Protocol):
    """What an algorithm may use of the continual run it is set up on (:meth:`CLAlgorithm.setup`;
    :class:`torchrl_grpo.continual.trainer.ContinualTrainer` is one)."""

    #: the GRPO trainer of the run (model, optimizer, ``updater`` (its public methods above), step, settings, backend,
    #: device)
    trainer: GRPOTrainer
    #: the run's trajectories by domain (replay draws past tasks from it)
    buffer: TrajectoryBuffer
    #: the pad id batches are padded with (joining batches)
    pad_token_id: int

    def past_domains(self, domain: str) -> list[str]:
        """The domains trained before ``domain`` in the task order."""
        ...

    def collect(self, domain: str, tasks: list[dict]) -> TensorDict:
        """Roll out ``n_samples`` episodes per task on ``domain`` with the current policy."""
        ...


class CLAlgorithm:
    """The hook interface (module docstring). The base class is sequential fine-tuning: every hook a no-op."""

    name = "sequential"
    #: True: the continual trainer runs one joint stage over all domains and asks :meth:`domain_for_step` each step
    joint = False

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], *, seed: int = 0) -> CLAlgorithm:
        """The algorithm from plain settings: ``settings`` is the ``cl`` section as a dict (``replay_ratio``,
        ``ewc_lambda``, ...; keys an algorithm does not use are ignored), ``seed`` the run's. Default: no options.

        Raises:
            ValueError: a setting the algorithm needs is missing or out of range.
        """
        return cls()

    def setup(self, cl: ContinualRun) -> None:
        """Called once by the continual trainer before training."""
        self.cl = cl

    def pre_task(self, trainer, domain: str) -> None:
        pass

    def augment_batch(self, batch: TensorDict, domain: str) -> TensorDict:
        return batch

    def post_step(self, trainer, domain: str) -> None:
        pass

    def post_task(self, trainer, domain: str) -> None:
        pass

    def eval_context(self, trainer, domain: str):
        """A context the scoring of ``domain`` runs in (default: nothing changes)."""
        return nullcontext()

    def state_dict(self) -> dict:
        """The algorithm's own state for a checkpoint (tensors allowed; ``torch.save``-able). Default: none."""
        return {}

    def load_state_dict(self, trainer, state: dict) -> None:
        """Restore :meth:`state_dict` on resume, before the trainer checkpoint (weights, optimizer) is loaded into
        ``trainer``: structure it adds (adapters, optimizer parameter groups) is then in place for it."""

    def on_resume_without_state(self, trainer, domain: str, task_done: bool) -> None:
        """Resumed from a task checkpoint that holds no saved state of this hook (one written without it), after the
        trainer checkpoint is loaded; ``domain`` is the checkpoint's task, ``task_done`` whether it finished.
        Default: nothing."""

    def domain_for_step(self, step: int, domains: Sequence[str]) -> str:
        """The domain of trainer step ``step`` in a joint stage (called only when :attr:`joint` is true).

        Raises:
            NotImplementedError: the algorithm does not run a joint stage.
        """
        raise NotImplementedError(f"cl.algorithm={self.name} runs no joint stage")


#: ``cl.algorithm`` name -> class, in registration order (:func:`register_algorithm`); the names are
#: :data:`torchrl_grpo.config.choices.CL_ALGORITHMS` (tests/test_cl_config.py checks it).
ALGORITHMS: dict[str, type[CLAlgorithm]] = {}


def register_algorithm(cls: type[CLAlgorithm]) -> type[CLAlgorithm]:
    """Class decorator: register ``cls`` under ``cls.name`` in :data:`ALGORITHMS` (subclasses are not registered
    unless decorated themselves). Returns ``cls``.

    Raises:
        TypeError: ``cls`` is not a :class:`CLAlgorithm`.
        ValueError: an empty name, or a name another class holds.
    """
    if not (isinstance(cls, type) and issubclass(cls, CLAlgorithm)):
        raise TypeError(f"register_algorithm takes a CLAlgorithm subclass, got {cls!r}")
    name = cls.__dict__.get("name")  # its own, not an inherited one
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs its own non-empty class attribute 'name' to be registered")
    held = ALGORITHMS.get(name)
    if held is not None and held is not cls:
        raise ValueError(f"cl.algorithm {name!r} is registered twice ({held.__qualname__} and {cls.__qualname__})")
    ALGORITHMS[name] = cls
    return cls


def _setting(settings: Mapping[str, Any], key: str, algorithm: str) -> Any:
    if settings.get(key) is None:
        raise ValueError(f"cl.algorithm={algorithm} needs cl.{key}")
    return settings[key]


@register_algorithm
class Sequential(CLAlgorithm):
    """Sequential fine-tuning (the baseline)."""

    name = "sequential"


@register_algorithm
class Replay(CLAlgorithm):
    """On-policy replay of past domains' prompts (module docstring).

    Args:
        ratio: replayed tasks per step = ``ceil(ratio * batch_size)``.
        seed: seeds the task draws (with the trainer step, so a resumed run draws the same tasks).

    Raises:
        ValueError: ``ratio <= 0``.
    """

    name = "replay"

    def __init__(self, ratio: float, seed: int = 0) -> None:
        if ratio <= 0:
            raise ValueError(f"replay ratio must be > 0, got {ratio}")
        self.ratio, self.seed = float(ratio), int(seed)
        self.last_replayed = 0  # episodes added to the last batch

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], *, seed: int = 0) -> Replay:
        """``cl.replay_ratio``, and the run's seed for the task draws."""
        return cls(float(_setting(settings, "replay_ratio", cls.name)), seed=seed)

    def augment_batch(self, batch: TensorDict, domain: str) -> TensorDict:
        cl = self.cl
        past = cl.past_domains(domain)
        self.last_replayed = 0
        if not past:
            return batch
        n = math.ceil(self.ratio * cl.trainer.settings.batch_size)
        rng = np.random.default_rng([self.seed, cl.trainer.step])
        pairs = cl.buffer.sample_tasks(n, past, rng)
        parts = [batch]
        for d in past:
            tasks = [t for dd, t in pairs if dd == d]
            if tasks:
                parts.append(cl.collect(d, tasks))
        out = concat_batches(parts, cl.pad_token_id)
        self.last_replayed = out.shape[0] - batch.shape[0]
        return out


@register_algorithm
class Joint(CLAlgorithm):
    """Joint multi-domain training (the upper bound): the continual trainer runs one stage of
    ``num_steps_per_task * T`` steps and calls :meth:`domain_for_step` to pick each step's domain."""

    name = "joint"
    joint = True

    def domain_for_step(self, step: int, domains: Sequence[str]) -> str:
        """Round robin: domain ``step mod T``."""
        return domains[step % len(domains)]


@register_algorithm
class EWC(CLAlgorithm):
    """Elastic weight consolidation, online form (a baseline): after each task, a diagonal Fisher of the policy on
    that task's own trajectories is added to the running one and the weights are remembered; later updates pay

        L_EWC = (λ/2) Σ_i F_i (θ_i − θ*_i)²        (Kirkpatrick et al., 2017, PNAS 114(13), Eq. 3;
                                                    online accumulation F ← F + F_task: Schwarz et al., 2018, Sec. 3)

    F_i = mean over episodes e of (∂/∂θ_i Σ_{t ∈ response(e)} log π_θ(a_t | s_t))², the empirical Fisher of the
    sampled responses (per-episode gradients, so N backward passes per task), over the trainable parameters only
    (LoRA: the adapter). The episodes are the last ``fisher_batches`` collected batches of the task.

    The penalty is one of the update's penalties (:meth:`GRPOUpdate.add_loss_penalty`, named ``ewc``): its own
    loss entry and metric ``loss_penalty_ewc`` (:func:`torchrl_grpo.objectives.loss.total_loss` backpropagates it with
    the loss's terms; ``loss_kl`` stays the KL term's), so neither the loss module nor the update's algorithm
    changes. F, θ*, the episode count and the batches kept for the next Fisher are in :meth:`state_dict`, so a resumed
    run pays the uninterrupted run's penalty.

    Args:
        lam: λ (``cl.ewc_lambda``).
        fisher_batches: how many of the task's last batches estimate F.

    Raises:
        ValueError: ``lam < 0`` or ``fisher_batches < 1``.
    """

    name = "ewc"
    #: the update's penalty name: logged as ``loss_penalty_ewc`` (:func:`torchrl_grpo.objectives.loss_interface.penalty_key`)
    penalty_name = "ewc"

    @classmethod
    def from_config(cls, settings: Mapping[str, Any], *, seed: int = 0) -> EWC:
        """``cl.ewc_lambda`` (λ)."""
        return cls(float(_setting(settings, "ewc_lambda", cls.name)))

    def __init__(self, lam: float, fisher_batches: int = 1) -> None:
        if lam < 0 or fisher_batches < 1:
            raise ValueError(f"EWC needs lam >= 0 and fisher_batches >= 1, got {lam}, {fisher_batches}")
        self.lam, self.fisher_batches = float(lam), int(fisher_batches)
        self.terms: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []  # (θ, F, θ*)
        self.fisher_episodes = 0  # episodes behind the current F
        self._recent: list[TensorDict] = []

    def setup(self, cl: ContinualRun) -> None:
        super().setup(cl)
        cl.trainer.updater.add_loss_penalty(self.penalty, self.penalty_name)

    def augment_batch(self, batch: TensorDict, domain: str) -> TensorDict:
        self._recent = (self._recent + [batch.exclude("task", "info").clone()])[-self.fisher_batches:]
        return batch

    def penalty(self) -> torch.Tensor:
        """(λ/2) Σ F (θ − θ*)², a scalar with gradient (0 before the first task ends)."""
        if not self.terms:
            return torch.zeros((), device=self.cl.trainer.device)
        return 0.5 * self.lam * sum((f * (p - star) ** 2).sum() for p, f, star in self.terms)

    def post_task(self, trainer, domain: str) -> None:
        from torchrl_grpo.objectives.log_probs import token_log_probs

        model, lf, dev = trainer.model, trainer.updater.loss_fn, trainer.device
        params = [p for p in model.parameters() if p.requires_grad]
        fisher = [torch.zeros_like(p) for p in params]
        was, n = model.training, 0
        model.eval()
        try:
            for b in self._recent:
                for i in range(b.shape[0]):
                    row = b[i : i + 1]
                    if not row["response_mask"].any():
                        continue
                    model.zero_grad(set_to_none=True)
                    lp, _ = token_log_probs(model, row["tokens"].to(dev), row["attention_mask"].to(dev),
                                            temperature=lf.temperature, top_p=lf.top_p, top_k=lf.top_k,
                                            response_mask=row["response_mask"].to(dev))
                    mask = row["response_mask"][:, : lp.shape[-1]].to(dev, lp.dtype)
                    (lp * mask).sum().backward()
                    for f, p in zip(fisher, params):
                        if p.grad is not None:
                            f += p.grad.detach() ** 2
                    n += 1
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was)
        fisher = [f / max(n, 1) for f in fisher]
        if self.terms:  # online EWC: accumulate F over tasks, anchor at the newest weights
            fisher = [f + old for f, (_, old, _) in zip(fisher, self.terms)]
        self.terms = [(p, f, p.detach().clone()) for p, f in zip(params, fisher)]
        self.fisher_episodes += n
        self._recent = []

    def state_dict(self) -> dict:
        """``fisher`` and ``anchor`` (θ*): lists of tensors in the order of the trainable parameters (the ones the
        penalty covers), ``fisher_episodes``, and ``recent``: the batches kept for the next Fisher."""
        return {"fisher": [f.detach().cpu() for _, f, _ in self.terms],
                "anchor": [a.detach().cpu() for _, _, a in self.terms],
                "fisher_episodes": self.fisher_episodes, "recent": [b.cpu() for b in self._recent]}

    def load_state_dict(self, trainer, state: dict) -> None:
        """Pair the saved F and θ* with this model's trainable parameters (same order as when saved).

        Raises:
            ValueError: the saved tensors do not match the trainable parameters (count or shapes).
        """
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        fisher, anchor = state["fisher"], state["anchor"]
        if fisher and (len(fisher) != len(params) or any(f.shape != p.shape for f, p in zip(fisher, params))):
            raise ValueError(f"EWC state has {len(fisher)} tensors that do not match the model's {len(params)} "
                             "trainable parameters (another model or LoRA setting?)")
        dev = trainer.device
        self.terms = [(p, f.to(dev), a.to(dev)) for p, f, a in zip(params, fisher, anchor)]
        self.fisher_episodes = int(state["fisher_episodes"])
        self._recent = list(state["recent"])


@register_algorithm
class LoRAPerDomain(CLAlgorithm):
    """One LoRA adapter per domain (the reference point: no forgetting by construction). Task k trains a fresh
    adapter (same LoRA config as ``actor.peft``; the first domain uses the ``default`` adapter build() made) while the
    earlier ones are frozen; domain j is scored with its own adapter once trained, and before that with the newest
    adapter (so FWT measures what the latest adapter carries over). Needs ``actor.peft.enable=true``.

    Where we diverge, and why: the optimizer keeps its one parameter group and the LR schedule; the group's
    parameters are replaced by the new adapter's at each task start (Adam moments start at zero for it, as for a new
    run). The rollout backend is re-synced after each adapter switch (a no-op for the colocated backend). Resuming:
    :meth:`state_dict` holds every adapter's weights and the domain -> adapter map; :meth:`load_state_dict` re-creates
    the adapters, loads them and makes the newest one the trained one (the trainer checkpoint holds the ``default``
    adapter only).

    Raises:
        ValueError (at setup): the policy has no LoRA adapter.
    """

    name = "lora_per_domain"

    def setup(self, cl: ContinualRun) -> None:
        super().setup(cl)
        model = cl.trainer.model
        if not hasattr(model, "peft_config") or "default" not in model.peft_config:
            raise ValueError("cl.algorithm=lora_per_domain needs actor.peft.enable=true (a LoRA adapter per domain)")
        self.lora_config = copy.deepcopy(model.peft_config["default"])
        self.adapters: dict[str, str] = {}  # domain -> adapter name, in training order

    def _activate(self, trainer, name: str) -> None:
        if trainer.model.active_adapter != name:
            trainer.model.set_adapter(name)  # peft: the active adapter becomes the only trainable one
            trainer.backend.sync_from(trainer.model)

    def adapter_for(self, domain: str) -> str:
        """``domain``'s own adapter once trained, else the newest one (``default`` before any task)."""
        if domain in self.adapters:
            return self.adapters[domain]
        return list(self.adapters.values())[-1] if self.adapters else "default"

    def pre_task(self, trainer, domain: str) -> None:
        name = self.adapters.get(domain) or ("default" if not self.adapters else domain)  # resumed: it exists
        if name not in trainer.model.peft_config:
            trainer.model.add_adapter(name, copy.deepcopy(self.lora_config))
        self._activate(trainer, name)
        self.adapters[domain] = name
        self._train_params(trainer)

    @staticmethod
    def _train_params(trainer) -> None:
        """The optimizer's group becomes the active adapter's parameters (:meth:`GRPOUpdate.set_trainable`: the Adam
        moments of the ones it drops are dropped too; they are frozen from now on)."""
        trainer.updater.set_trainable([p for p in trainer.model.parameters() if p.requires_grad])

    def state_dict(self) -> dict:
        """``adapters`` (domain -> adapter name, in training order), ``active`` (the adapter being trained) and
        ``weights`` (adapter name -> its peft state dict, CPU tensors)."""
        from peft import get_peft_model_state_dict

        model = self.cl.trainer.model
        return {"adapters": dict(self.adapters), "active": model.active_adapter,
                "weights": {n: {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model, adapter_name=n).items()}
                            for n in dict.fromkeys(self.adapters.values())}}

    def load_state_dict(self, trainer, state: dict) -> None:
        """Re-create every saved adapter, load its weights, activate the one being trained and give the optimizer its
        parameters (so the checkpoint's optimizer state loads into them).

        Raises:
            ValueError: an adapter's saved weights do not fit (unexpected keys).
        """
        from peft import set_peft_model_state_dict

        model = trainer.model
        for name, weights in state["weights"].items():
            if name not in model.peft_config:
                model.add_adapter(name, copy.deepcopy(self.lora_config))
            res = set_peft_model_state_dict(model, weights, adapter_name=name)
            if getattr(res, "unexpected_keys", None):
                raise ValueError(f"adapter {name!r}: unexpected keys in the saved weights, e.g. {res.unexpected_keys[:3]}")
        self.adapters = dict(state["adapters"])
        self._activate(trainer, state["active"])
        self._train_params(trainer)

    def eval_context(self, trainer, domain: str):
        @contextmanager
        def ctx():
            before = trainer.model.active_adapter
            self._activate(trainer, self.adapter_for(domain))
            try:
                yield
            finally:
                self._activate(trainer, before)

        return ctx()


class KLAnchor(CLAlgorithm):
    """k3 KL to the previous task's policy: at each task's end, the update's KL reference becomes a frozen copy of
    the policy (a second copy of the model in memory, LoRA included). Needs ``loss.kl_coef > 0``
    (:func:`torchrl_grpo.config.continual_domains.domain_config` sets it from ``cl.kl_coef``). The anchor becomes the update's
    reference through :meth:`GRPOUpdate.set_reference`.

    Resuming (:meth:`state_dict` / :meth:`load_state_dict`, then :meth:`pre_task`): the anchor is rebuilt from a copy
    of the resumed model, with the saved weights loaded, the adapters the anchor did not have removed and, with LoRA,
    the adapter it ran with made active again. That copy is taken after the other hooks' ``pre_task``: with
    ``lora_per_domain`` the model then already trains the new domain's (zero-initialised) adapter, which the anchor
    of the uninterrupted run never had, so the adapter it ran with is part of the saved state (issue 36: the resumed
    anchor was the untrained model)."""

    name = "kl_anchor"

    anchor = None
    _pending: dict | None = None  # saved anchor state, applied when the resumed task starts

    def post_task(self, trainer, domain: str) -> None:
        self._set(trainer, copy.deepcopy(trainer.model).eval().requires_grad_(False))

    def on_resume_without_state(self, trainer, domain: str, task_done: bool) -> None:
        """A checkpoint without the anchor's state: after a finished task the anchor is the loaded weights (what
        :meth:`post_task` took at that boundary); mid-task it stays as the resumed task starts it."""
        if task_done:
            self.post_task(trainer, domain)

    def _set(self, trainer, frozen) -> None:
        trainer.updater.set_reference(lambda: nullcontext(frozen))
        self.anchor = frozen

    def state_dict(self) -> dict:
        """``anchor``: the anchor's weights that can differ from the untrained model's (with LoRA the ``lora_``
        tensors of every adapter it has; else every tensor, a full copy of the model), or None during the first
        task. With LoRA also ``adapters`` (the anchor's adapter names) and ``active_adapter`` (the one it runs)."""
        if self.anchor is None:
            return {"anchor": None}
        lora = hasattr(self.anchor, "peft_config")
        out = {"anchor": {k: v.detach().cpu() for k, v in self.anchor.state_dict().items()
                          if not lora or "lora_" in k}}
        if lora:
            out.update(adapters=list(self.anchor.peft_config), active_adapter=self.anchor.active_adapter)
        return out

    def load_state_dict(self, trainer, state: dict) -> None:
        """Keep ``state`` (:meth:`state_dict`) for :meth:`pre_task` of the resumed task, which builds the anchor from
        it once the checkpoint's weights are loaded and the other hooks have set the model up.

        Raises (from that :meth:`pre_task`):
            ValueError: the state names an adapter the model lacks, or holds tensors the model does not have."""
        self._pending = state

    def pre_task(self, trainer, domain: str) -> None:
        if self._pending is None or self._pending.get("anchor") is None:
            self._pending = None
            return
        state, self._pending = self._pending, None
        frozen = copy.deepcopy(trainer.model)
        adapters, active = state.get("adapters"), state.get("active_adapter")
        if adapters is not None and hasattr(frozen, "peft_config"):
            missing = [a for a in adapters if a not in frozen.peft_config]
            if missing:
                raise ValueError(f"KL anchor state names adapters {missing} that the resumed model lacks "
                                 f"(it has {list(frozen.peft_config)})")
            if active is not None:
                frozen.set_adapter(active)  # before deleting: peft refuses to delete the active adapter
            for name in [a for a in frozen.peft_config if a not in adapters]:  # added after the anchor was taken
                frozen.delete_adapter(name)
        res = frozen.load_state_dict(state["anchor"], strict=False)  # LoRA: the lora_ tensors only
        if res.unexpected_keys:
            raise ValueError(f"KL anchor state does not fit the model: unexpected keys, e.g. {res.unexpected_keys[:3]}")
        self._set(trainer, frozen.eval().requires_grad_(False))


__all__ += ["register_algorithm"]
