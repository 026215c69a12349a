"""Start-up checks of a run config: choices, ranges and combinations a type schema cannot express.

Every check is a rule about config values; none builds anything (the checks that build envs, e.g. a continual
domain's usable tasks, are :func:`torchrl_grpo.assembly.continual_run.validate_cl_config`). Imports nothing of
``torchrl_grpo`` outside ``config/`` and no torch: ``grpo.py --help`` and Hydra's schema registration stay fast.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from torchrl_grpo.config.allocation_mode import train_strategy
from torchrl_grpo.config.choices import BY_KEY, SHARED_PREFIX_MODES
from torchrl_grpo.config.continual_domains import validate_cl_settings
from torchrl_grpo.config.schema import CheckpointConfig
from torchrl_grpo.config.tau2_users import tau2_user

__all__ = ["validate_config", "check_sft_run", "is_data_parallel", "LORA_FSDP_REFUSAL"]

#: why FSDP and LoRA are not combined: raised at start-up by :func:`validate_config` and by
#: :func:`torchrl_grpo.distributed.data_parallel.shard_model`.
LORA_FSDP_REFUSAL = ("train.strategy=fsdp with actor.peft.enable (LoRA) is not supported: LoRA's trainable state is "
                     "small, use train.strategy=ddp")


def is_data_parallel(strategy: str) -> bool:
    """Whether ``strategy`` (one of :data:`~torchrl_grpo.config.choices.STRATEGIES`, e.g.
    :func:`~torchrl_grpo.config.allocation_mode.train_strategy`'s value) runs over torchrun ranks: ``ddp`` or
    ``fsdp``, i.e. anything but ``single``."""
    return strategy != "single"


#: choice keys whose null means "by ``loss.importance_level``" (:data:`torchrl_grpo.objectives.loss.LEVEL_DEFAULTS`)
_NULL_BY_LEVEL = ("loss.aggregation",)


def _choices() -> dict[str, tuple]:
    """Config key -> allowed values: :data:`torchrl_grpo.config.choices.BY_KEY` (a new choice set is declared
    there once and validated here with no edit)."""
    return dict(BY_KEY)


def validate_config(cfg) -> None:
    """Check value ranges and choices that a type schema cannot express.

    Raises:
        ValueError: naming the offending key and the allowed values.
    """
    for key, allowed in _choices().items():
        val = OmegaConf.select(cfg, key)
        if val is None and key in _NULL_BY_LEVEL:
            continue
        if val not in allowed:
            raise ValueError(f"config {key}={val!r} is not one of {allowed}")
    tau2_user(cfg.econfig)  # econfig.solo_mode / user / user_llm agree (tau2 envs only)
    positive = ["train.steps", "train.batch_size", "train.ppo_epochs", "gconfig.n_samples",
                "gconfig.max_new_tokens", "rollout.max_batch_size", "rollout.max_context_tokens", "econfig.max_turns"]
    for key in positive:
        if OmegaConf.select(cfg, key) < 1:
            raise ValueError(f"config {key} must be >= 1, got {OmegaConf.select(cfg, key)}")
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm.max_model_len < cfg.rollout.max_context_tokens:
        raise ValueError(
            f"config rollout.vllm.max_model_len={cfg.rollout.vllm.max_model_len} is below "
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens}; raise it or lower the context limit"
        )
    if cfg.train.shared_prefix not in SHARED_PREFIX_MODES:
        raise ValueError(f"config train.shared_prefix must be {' | '.join(SHARED_PREFIX_MODES)}, got "
                         f"{cfg.train.shared_prefix!r}")
    if cfg.train.micro_batch_size < 0:
        raise ValueError(f"config train.micro_batch_size must be >= 0 (0: no count limit), got {cfg.train.micro_batch_size}")
    budget = cfg.train.max_tokens_per_mb
    if budget != "auto" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise ValueError(f"config train.max_tokens_per_mb must be auto or an int >= 0 (0: no budget), got {budget!r}")
    low, high = cfg.loss.clip_eps_low, cfg.loss.clip_eps_high  # null: by loss.importance_level
    if (low is not None and not 0 <= low < 1) or (high is not None and high < 0):
        raise ValueError(f"config loss.clip_eps_low must be in [0, 1) and loss.clip_eps_high >= 0 (or null: by "
                         f"loss.importance_level), got {low!r}, {high!r}")
    if cfg.loss.behaviour_weight_cap is not None and cfg.loss.behaviour_weight_cap <= 0:
        raise ValueError(f"config loss.behaviour_weight_cap must be > 0 or null, got {cfg.loss.behaviour_weight_cap}")
    if cfg.train.max_staleness is not None and cfg.train.max_staleness < 0:
        raise ValueError(f"config train.max_staleness must be >= 0, got {cfg.train.max_staleness}")
    _validate_scale_out(cfg)
    if cfg.train.partial_rollout_chunk < 0:
        raise ValueError(f"config train.partial_rollout_chunk must be >= 0, got {cfg.train.partial_rollout_chunk}")
    _validate_mode_keys(cfg)
    if OmegaConf.select(cfg, "cl.task_order"):
        validate_cl_settings(cfg)  # names and ranges; the continual trainer also checks the splits (envs)
        _validate_continual_keys(cfg)
    for key in ("sft.epochs", "sft.minibatch_size", "sft.rft_samples"):
        if OmegaConf.select(cfg, key) < 1:
            raise ValueError(f"config {key} must be >= 1, got {OmegaConf.select(cfg, key)}")
    if cfg.train_dataset.start < 0:
        raise ValueError(f"config train_dataset.start must be >= 0, got {cfg.train_dataset.start}")
    if cfg.train_dataset.max_intents is not None:
        if cfg.train_dataset.max_intents < 1:
            raise ValueError(f"config train_dataset.max_intents must be >= 1 or null, got {cfg.train_dataset.max_intents}")
        if not str(cfg.econfig.env_id).startswith("tau2"):
            raise ValueError("config train_dataset.max_intents selects generated tau2 mock tasks by their sub-intents; "
                             f"econfig.env_id={cfg.econfig.env_id!r} has none (leave it null)")
    if cfg.sft.limit is not None and cfg.sft.limit < 1:
        raise ValueError(f"config sft.limit must be >= 1 or null, got {cfg.sft.limit}")
    if cfg.sft.base_eval_problems < 0:
        raise ValueError(f"config sft.base_eval_problems must be >= 0, got {cfg.sft.base_eval_problems}")
    if cfg.sft.before_grpo and (cfg.eval_only or OmegaConf.select(cfg, "cl.task_order") or cfg.train.resume_from):
        raise ValueError("config sft.before_grpo runs SFT then GRPO from the start: not with eval_only, cl.task_order "
                         "or train.resume_from (resume the GRPO phase with actor.path=<run_dir>/sft/sft_model)")
    if cfg.sft.rft_rounds < 0:
        raise ValueError(f"config sft.rft_rounds must be >= 0, got {cfg.sft.rft_rounds}")
    if cfg.sft.source == "rft" and cfg.sft.rft_rounds < 1:
        raise ValueError("config sft.source=rft needs sft.rft_rounds >= 1 (the rounds are its only data)")
    if cfg.optimizer.lr <= 0:
        raise ValueError(f"config optimizer.lr must be > 0, got {cfg.optimizer.lr}")
    if cfg.gconfig.temperature < 0 or not 0 < cfg.gconfig.top_p <= 1:
        raise ValueError("config gconfig.temperature must be >= 0 and gconfig.top_p in (0, 1]")
    if cfg.gconfig.top_k < 0:
        raise ValueError(f"config gconfig.top_k must be >= 0 (0: off), got {cfg.gconfig.top_k}")
    episodes = cfg.train.batch_size * cfg.gconfig.n_samples
    if cfg.train.minibatch_size and episodes % cfg.train.minibatch_size:
        raise ValueError(
            f"config train.minibatch_size={cfg.train.minibatch_size} must divide the episodes per step "
            f"(train.batch_size * gconfig.n_samples = {episodes})"
        )


def check_sft_run(cfg) -> None:
    """What ``sft.py`` (:class:`torchrl_grpo.training.sft_trainer.SFTTrainer`) refuses beyond :func:`validate_config`,
    checked before anything is built (Ray workers would start).

    Raises:
        ValueError: ``rollout.launcher`` other than ``local``.
    """
    if cfg.rollout.launcher != "local":
        raise ValueError("sft.py rolls out in its own process: rollout.launcher=local (Ray rollout workers are a "
                         "grpo.py feature)")


def _validate_mode_keys(cfg) -> None:
    """Keys only the async trainer reads, set in another mode: a ValueError naming the key (they were ignored).
    ``train.max_staleness=0`` is accepted in sync mode: the sync schedule is staleness 0 (AReaL's η = 0)."""
    t = cfg.train
    if cfg.mode == "async":
        return
    for key, val, allowed in (("train.max_staleness", t.max_staleness, (None, 0)),
                              ("train.partial_rollout_chunk", t.partial_rollout_chunk, (0,))):
        if val not in allowed:
            raise ValueError(f"config {key}={val} is read by mode=async only (this run is mode={cfg.mode}, where it "
                             f"would be ignored): drop it, or run mode=async (grpo-async.py)")


def _validate_continual_keys(cfg) -> None:
    """Keys a continual run (``cl.task_order``) does not honour, set to ask for something: a ValueError naming the
    key and the ``cl.*`` key that does it (:class:`~torchrl_grpo.config.schema.ContinualConfig`)."""
    where = "a continual run (cl.task_order)"
    if cfg.eval_only:
        raise ValueError(f"config eval_only=true is not supported by {where}: it would train the whole sequence; "
                         f"evaluate a checkpoint with grpo.py eval_only=true train.resume_from=<run>/"
                         f"checkpoint_task_<k>/step_<n> and the domain's env settings, without cl.task_order")
    if cfg.eval.every:
        raise ValueError(f"config eval.every={cfg.eval.every} is not read by {where}: it scores every domain every "
                         f"cl.eval_interval steps; set cl.eval_interval={cfg.eval.every} and eval.every=0")
    if cfg.checkpoint.every:
        raise ValueError(f"config checkpoint.every={cfg.checkpoint.every} is not read by {where}: it checkpoints "
                         f"per task (cl.save_checkpoints); set checkpoint.every=0")
    if cfg.train.resume_from:
        raise ValueError(f"config train.resume_from is not read by {where}: continue one with "
                         f"cl.resume_from=<run>/checkpoint_task_<k>")
    for key in ("at_start", "at_end"):
        if not cfg.eval[key]:
            raise ValueError(f"config eval.{key}=false is not honoured by {where}: it always scores every domain "
                             f"before training and after the last task (the accuracy matrix's b and last row); "
                             f"remove the key (cl.eval_interval adds evaluations inside a task)")
    if cfg.checkpoint.keep_last != CheckpointConfig.keep_last:  # the schema default: the key was not set
        raise ValueError(f"config checkpoint.keep_last={cfg.checkpoint.keep_last} is not read by {where}: it keeps "
                         f"every task's checkpoint_task_<k>/ (cl.resume_from continues from any); remove the key, or "
                         f"cl.save_checkpoints=false for none")
    if cfg.checkpoint.save_final and not cfg.cl.save_checkpoints:
        raise ValueError(f"config checkpoint.save_final=true: {where} writes its checkpoints per task, and "
                         f"cl.save_checkpoints=false turns them off (the last task's is the final one); set "
                         f"cl.save_checkpoints=true or checkpoint.save_final=false")


def _validate_scale_out(cfg) -> None:
    """``rollout.num_workers`` / ``launcher`` and ``train.strategy`` against each other and the mode (issue 11)."""
    r = cfg.rollout
    if not r.worker_timeout_s > 0:
        raise ValueError(f"config rollout.worker_timeout_s must be > 0 (seconds), got {r.worker_timeout_s}")
    if r.num_workers < 0 or r.max_worker_restarts < 0:
        raise ValueError(f"config rollout.num_workers ({r.num_workers}) and rollout.max_worker_restarts "
                         f"({r.max_worker_restarts}) must be >= 0")
    if r.launcher == "ray" and r.num_workers < 1:
        raise ValueError("config rollout.launcher=ray needs rollout.num_workers >= 1")
    if r.launcher == "local" and r.num_workers > 0:
        raise ValueError(f"config rollout.num_workers={r.num_workers} needs rollout.launcher=ray (local: the rollout "
                         f"runs in the trainer process)")
    strategy = train_strategy(cfg)  # train.strategy, or the engine allocation_mode names
    if r.launcher == "ray" and is_data_parallel(strategy):
        raise ValueError(f"rollout.launcher=ray and train.strategy={strategy} are not combined yet: one of them per "
                         f"run")
    scaled = r.launcher == "ray" or is_data_parallel(strategy)
    if scaled and (cfg.mode != "sync" or OmegaConf.select(cfg, "cl.task_order")):
        raise ValueError("rollout.launcher=ray and train.strategy=ddp/fsdp run with the sync trainer (mode=sync, no "
                         "cl.task_order) for now")
    if strategy == "fsdp" and cfg.actor.peft.enable:
        raise ValueError(LORA_FSDP_REFUSAL)
