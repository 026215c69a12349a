"""Every choice set of the run config, defined once (issue 27: config is a leaf).

A config key's allowed values live here; the module that implements the choice imports its tuple from here (the
same object: ``tests/test_config_cli.py`` checks identity), so validation (:func:`torchrl_grpo.config.validate_config`)
and implementation cannot drift apart. This module imports nothing (no torch, nothing of ``torchrl_grpo``): ``grpo.py
--help`` and Hydra's schema registration stay fast, and any layer may import it (``tests/test_import_graph.py``).

``econfig.reward`` (:data:`TAU2_REWARD_KINDS`) is the one set that also lives outside ``torchrl_grpo``: the tau2 env
checks its own ``envs.tau2.env.REWARD_KINDS`` (``envs`` never imports ``torchrl_grpo``), and this leaf must not import
``envs.tau2`` (a ReasoningGym run would load tau2's whole import chain to validate its config), so the two are equal
tuples, not one object (``tests/test_reasoning_gym_imports.py`` keeps them equal).
"""
from __future__ import annotations

__all__ = [
    "MODES", "DTYPES", "BACKENDS", "DECODE_MODES", "AGGREGATIONS", "SCALES", "BASELINES", "BEHAVIOUR_WEIGHT_MODES", "ANCHORS",
    "SHARED_PREFIX_MODES", "SCHEDULERS", "WANDB_MODES", "DEVICES", "STRATEGIES", "LAUNCHERS", "SFT_SOURCES", "USERS",
    "INFERENCE_ENGINES", "TRAIN_ENGINES", "FOREIGN_ENGINES", "CL_METRICS", "CL_ALGORITHMS", "TAU2_REWARD_KINDS",
    "IMPORTANCE_LEVELS", "BY_KEY",
]

#: ``mode``: the sync trainer (:mod:`torchrl_grpo.training.grpo_trainer`) or the async one
#: (:mod:`torchrl_grpo.training.async_trainer`).
MODES = ("sync", "async")

#: ``actor.dtype`` (:func:`torchrl_grpo.model_store.loading.load_model_and_tokenizer`).
DTYPES = ("float32", "bfloat16", "float16", "auto")

#: ``rollout.backend``: the names of the registered backends (:func:`torchrl_grpo.backends.factory.backend_names`; a
#: backend module registers itself, this leaf cannot import it: tests/test_backend_registry.py keeps the two equal).
BACKENDS = ("transformers", "vllm")
# rollout.decode: the transformers backend's decode loop (torchrl_grpo/backends/transformers_backend.py)
DECODE_MODES = ("auto", "eager", "static", "graph")

#: ``loss.aggregation`` (:func:`torchrl_grpo.objectives.loss.masked_aggregate`).
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")

#: ``loss.adv_scale`` (:func:`torchrl_grpo.objectives.advantage.group_advantages`): GRPO's group std, Dr. GRPO's
#: none, or the batch std.
SCALES = ("group", "none", "batch")

#: ``loss.adv_baseline`` (:func:`torchrl_grpo.objectives.advantage.group_advantages`): group mean or leave-one-out.
BASELINES = ("mean", "loo")

#: ``loss.behaviour_weight_mode`` (:class:`torchrl_grpo.objectives.loss.GRPOLoss`): truncate or mask.
BEHAVIOUR_WEIGHT_MODES = ("truncate", "mask")

#: ``loss.importance_level`` (:class:`torchrl_grpo.objectives.loss.GRPOLoss`): GRPO's per-token importance ratio or
#: GSPO's sequence-level one.
IMPORTANCE_LEVELS = ("token", "sequence")

#: ``loss.anchor``: accepted ``anchor=`` values of :class:`torchrl_grpo.training.update.GRPOUpdate` (see its
#: ``needs_anchor_recompute``).
ANCHORS = ("auto", "recompute", "behaviour")

#: ``train.shared_prefix``: accepted ``shared_prefix=`` values of :class:`torchrl_grpo.training.update.GRPOUpdate`
#: (see its ``shared_prefix_for``).
SHARED_PREFIX_MODES = ("auto", "off")

#: ``optimizer.scheduler`` (:func:`torchrl_grpo.training.optimizer.make_scheduler`).
SCHEDULERS = ("constant", "cosine", "linear")

#: ``stats_logger.wandb.mode`` (:class:`torchrl_grpo.reporting.stats_logger.StatsLogger`).
WANDB_MODES = ("online", "offline", "disabled")

#: ``train.device`` (:func:`torchrl_grpo.assembly.resolve_device`).
DEVICES = ("auto", "cpu", "cuda")

#: ``train.strategy`` (:func:`torchrl_grpo.distributed.data_parallel.init_data_parallel`).
STRATEGIES = ("single", "ddp", "fsdp")

#: ``rollout.launcher``: the rollout in the trainer process, or Ray actors (:mod:`torchrl_grpo.rollout.ray_workers`).
LAUNCHERS = ("local", "ray")

#: ``sft.source`` (:class:`torchrl_grpo.training.sft_trainer.SFTTrainer`): ``gold`` fine-tunes on the env's
#: demonstrations first; ``rft`` starts from the policy's own successes (envs without demonstrations). Either is
#: followed by ``sft.rft_rounds`` rounds of RFT.
SFT_SOURCES = ("gold", "rft")

#: ``econfig.user``: who plays the tau2 customer when ``econfig.solo_mode=false`` (``local``: our own backend, through
#: ``user_fn``). Solo play is ``econfig.solo_mode=true``, never ``user=solo`` (:func:`torchrl_grpo.config.tau2_user`).
USERS = ("scripted", "llm", "local")

#: ``econfig.reward`` (tau2 envs, ``envs.tau2.env.Tau2Env(reward=)``): tau2's binary reward or its partial / progress
#: reward; equal to ``envs.tau2.env.REWARD_KINDS`` (see the module docstring).
TAU2_REWARD_KINDS = ("binary", "partial", "partial_on_stop")

#: ``allocation_mode`` engines (:func:`torchrl_grpo.config.parse_allocation_mode`): inference engines (the rollout
#: backends themselves) and training engines (``train.strategy``-like).
INFERENCE_ENGINES = BACKENDS
TRAIN_ENGINES = ("fsdp", "ddp")
#: engines AReaL knows that this trainer does not run (named in the error, not silently ignored)
FOREIGN_ENGINES = ("sglang", "megatron", "trtllm")

#: ``cl.metric``: the scores an accuracy matrix can hold (:meth:`torchrl_grpo.continual.trainer.ContinualTrainer.evaluate_task`
#: keys).
CL_METRICS = ("pass^1", "pass^k", "reward_mean")

#: ``cl.algorithm``: the names of :data:`torchrl_grpo.continual.algorithms.ALGORITHMS` (its keys, in this order).
CL_ALGORITHMS = ("sequential", "replay", "joint", "ewc", "lora_per_domain")

#: Config key -> its allowed values: what :func:`torchrl_grpo.config.validate_config` checks (``econfig.reward`` is
#: :data:`TAU2_REWARD_KINDS`, equal to the tau2 env's own set: see the module docstring). A new choice set is declared
#: above and listed here once; validation needs no edit.
BY_KEY: dict[str, tuple] = {
    "mode": MODES,
    "actor.dtype": DTYPES,
    "rollout.backend": BACKENDS,
    "rollout.decode": DECODE_MODES,
    "loss.aggregation": AGGREGATIONS,
    "loss.adv_scale": SCALES,
    "loss.adv_baseline": BASELINES,
    "loss.behaviour_weight_mode": BEHAVIOUR_WEIGHT_MODES,
    "loss.anchor": ANCHORS,
    "loss.importance_level": IMPORTANCE_LEVELS,
    "optimizer.scheduler": SCHEDULERS,
    "stats_logger.wandb.mode": WANDB_MODES,
    "econfig.reward": TAU2_REWARD_KINDS,
    "train.device": DEVICES,
    "train.strategy": STRATEGIES,
    "rollout.launcher": LAUNCHERS,
    "sft.source": SFT_SOURCES,
}
