"""Structured (typed) Hydra config schema for the GRPO trainer.

Registered in Hydra's ConfigStore as ``grpo_schema``; the YAML files in ``configs/`` list it first in their
``defaults`` so that an unknown or mistyped key (``optimizer.lrr=1e-5``) fails at start-up with an error naming
it, and a wrong type (``train.steps=abc``) fails before any model is loaded. Names follow AReaL where users know
them (``actor.path``, ``gconfig.n_samples``, ``econfig.*``, ``train_dataset.split``, ``rollout.backend``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

__all__ = ["GRPOConfig", "register_configs", "validate_config"]


@dataclass
class PeftConfig:
    enable: bool = False
    r: int = 16
    lora_alpha: int = 32
    # 0 for RL: dropout makes the differentiated forward a random sub-network, so on-policy ratios stop being 1
    # (LoRA dropout 0.05 gave ratio_max 1.14); train.disable_dropout also zeroes it at start-up
    lora_dropout: float = 0.0
    target_modules: Any = "all-linear"


@dataclass
class ActorConfig:
    path: str = "smollm2-135m-instruct"  # packaged alias, local dir, .gguf file, or HF hub id
    dtype: str = "float32"  # float32 | bfloat16 | auto
    gradient_checkpointing: bool = False
    peft: PeftConfig = field(default_factory=PeftConfig)


@dataclass
class DatasetConfig:
    path: Optional[str] = None  # GSM8K: local dir or HF datasets id (openai/gsm8k); null: $GSM8K_DATA_DIR, else packaged
    split: str = "test"  # valid_dataset: evaluation reads its first eval.n_problems usable tasks


@dataclass
class TrainDatasetConfig(DatasetConfig):
    split: str = "train"
    limit: Optional[int] = None  # use only the first N problems / tasks


@dataclass
class EnvConfig:
    env_id: str = "GSM8K-v0"
    format_reward: float = 0.0  # GSM8K: credit for a well-formed wrong answer; 0 = correctness-only (see envs/gsm8k/grading.py)
    domain: str = "telecom"  # tau2
    max_steps: int = 30  # tau2: env steps before truncation
    max_turns: int = 1  # assistant turns per episode (GSM8K: 1)
    # tau2 users, one spelling per concept (AReaL's econfig.solo_mode is the switch; see env_factory.tau2_user):
    solo_mode: bool = True  # the agent works the ticket alone (env user="solo"); econfig.user / user_llm must be unset
    user: Optional[str] = None  # solo_mode=false: scripted | llm | local (null: local if user_llm=local, llm if
    #                             user_llm is set, else scripted); user=solo is an error naming solo_mode=true
    user_llm: Optional[str] = None
    user_llm_base_url: Optional[str] = None
    user_llm_args: dict = field(default_factory=dict)
    reward: str = "binary"  # tau2: binary | partial
    system_prompt: Optional[str] = None
    # ReasoningGym-v0 (envs/reasoning_gym): one generator `task` or a weighted mix `tasks` {name: weight}; task_config
    # its config (with `tasks`: {name: config}); level the library curriculum's global level; the splits' generator
    # seeds and sizes (a hash of the question puts it in train or test). Bad names / keys fail at start-up listing them.
    task: Optional[str] = None
    tasks: Any = None  # Any, not dict: a whole mapping given on the command line replaces it (a dict field is struct)
    task_config: Any = None
    level: Optional[int] = None
    train_seed: int = 11
    test_seed: int = 22
    train_size: int = 1000
    test_size: int = 200


@dataclass
class GenerationConfig:
    n_samples: int = 4  # group size G
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the top_k most likely tokens (0: off); scored the same way by the loss


@dataclass
class VLLMConfig:
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.5
    check_sync_every: int = 0  # compare vLLM vs trainer log-probs every k syncs (0: never)


@dataclass
class RolloutConfig:
    backend: str = "transformers"  # transformers | vllm
    # rollout actors (torchrl_grpo/rollout/ray_workers.py): 0 = the rollout runs in the trainer process; N >= 1 with
    # launcher=ray = N Ray actors, each with its own backend and envs (a local Ray, or a cluster via RAY_ADDRESS)
    num_workers: int = 0
    launcher: str = "local"  # local | ray
    max_worker_restarts: int = 3  # ray: restarts of a dead worker per run before the run fails (rollout/worker_restarts)
    worker_timeout_s: float = 3600.0  # ray: a step fails, naming the worker, when no worker batch came back this long
    max_batch_size: int = 64
    max_context_tokens: int = 2048
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class LossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm
    adv_scale: str = "group"  # group (GRPO) | none (Dr. GRPO) | batch
    adv_baseline: str = "mean"  # mean | loo
    filter_zero_variance_groups: bool = False
    # decoupled correction w = pi_prox / pi_behav (AReaL Eq. 5), applied whenever the anchor is recomputed:
    behaviour_weight_cap: Optional[float] = 2.0  # cap c on w (None: no cap)
    behaviour_weight_mode: str = "truncate"  # truncate: min(w, c) | mask: tokens with w > c get no gradient (AReaL)
    # PPO anchor pi_old: auto = the trainer's no-grad recompute unless the sampler is the trainer's own module at
    # its own precision (colocated fp32 transformers backend, no autocast) and the batch gets one on-policy update
    anchor: str = "auto"  # auto | recompute | behaviour


@dataclass
class OptimizerConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0  # in trainer steps, like the schedule
    scheduler: str = "constant"  # constant | cosine | linear, over train.steps (stepped once per trainer step)
    max_grad_norm: float = 1.0


@dataclass
class TrainConfig:
    steps: int = 4
    batch_size: int = 2  # prompts (tasks) per step; episodes per step = batch_size * n_samples
    minibatch_size: int = 0  # episodes per optimizer step (0: the whole batch, one optimizer step per batch)
    micro_batch_size: int = 4  # episodes per forward/backward (gradient accumulation inside a minibatch)
    max_tokens_per_mb: int = 0  # padded-token budget per micro-batch (rows x longest row; 0: no budget), AReaL mb_spec
    # auto | off: run the token prefix common to a minibatch's episodes (prompt; policy + tools across tasks) once for
    # all its micro-batches, remainders against its keys/values (exact; gc and LoRA too; torchrl_grpo/objectives/shared_prefix.py)
    # and count only remainder tokens against max_tokens_per_mb; off: whole episodes per micro-batch
    shared_prefix: str = "auto"
    disable_dropout: bool = True  # zero every dropout rate in the policy (TRL's default for GRPO too)
    ppo_epochs: int = 1
    resume_from: Optional[str] = None
    device: str = "auto"  # auto | cpu | cuda
    # mode=async only (validate_config refuses them in sync mode): the most policy versions a batch may lag behind
    # (null: 1, AReaL's one-step-off pipeline; torchrl_grpo.build.max_staleness), and partial rollouts:
    max_staleness: Optional[int] = None
    partial_rollout_chunk: int = 0  # check for new weights every N generated tokens and continue
    # unfinished generations with them (partial rollouts, AReaL; per-token versions); 0: whole generations
    # single | ddp | fsdp: data-parallel over torchrun ranks (torchrl_grpo/distributed/data_parallel.py: gloo on CPU, NCCL on
    # CUDA; each rank collects its share of the step's prompt groups; gradients all-reduced (ddp) or reduce-scattered
    # to FSDP2 shards (fsdp); rank 0 writes the run's files). single + allocation_mode=...+fsdp:dN: fsdp
    strategy: str = "single"


@dataclass
class EvalConfig:
    every: int = 0  # eval every k steps (0: only at start/end per the flags below)
    at_start: bool = True
    at_end: bool = True
    n_problems: int = 16
    greedy: bool = True
    pass_k: int = 0  # if > 0: also sample k completions per problem and report pass@k (tasks: valid_dataset)


@dataclass
class CheckpointConfig:
    every: int = 2  # 0 disables periodic checkpoints (a final one is still written)
    keep_last: int = 2
    save_final: bool = True
    on_interrupt: bool = True  # SIGINT/SIGTERM: checkpoint the last completed step (torchrl_grpo/training/interrupt.py)


@dataclass
class WandbConfig:
    mode: str = "offline"  # online | offline | disabled
    project: str = "torchrl-grpo"
    entity: Optional[str] = None
    name: Optional[str] = None


@dataclass
class StatsLoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)
    console: bool = True
    progress_bar: bool = True
    samples_per_step: int = 2  # episodes (first of each group) decoded into samples.jsonl per step; 0 disables


@dataclass
class ContinualConfig:
    """``cl.*``: continual learning over a sequence of domains (torchrl_grpo.continual.trainer; checks and
    per-domain defaults in torchrl_grpo.continual.domains). An empty ``task_order`` means an ordinary single-env run.

    A continual run scores every domain before training, every ``cl.eval_interval`` steps and at each task boundary,
    and checkpoints per task (``cl.save_checkpoints``, ``cl.resume_from``): :func:`validate_config` refuses
    ``eval_only``, ``eval.every``, ``checkpoint.every``, ``train.resume_from``, ``checkpoint.save_final`` without
    ``cl.save_checkpoints``, ``eval.at_start=false`` / ``eval.at_end=false`` (the scores before training and after
    the last task are the accuracy matrix's b and last row: always computed) and a non-default
    ``checkpoint.keep_last`` (each task's checkpoint is kept), which it would not honour. It reads
    ``eval.n_problems`` / ``greedy`` / ``pass_k`` and ``checkpoint.on_interrupt``."""

    task_order: list = field(default_factory=list)  # domains in training order: airline | retail | telecom | mock | gsm8k | ifeval
    num_steps_per_task: int = 10  # trainer steps on each domain
    max_tasks_per_domain: Optional[int] = None  # train on the first N usable tasks of each domain's train split
    eval_interval: int = 0  # also evaluate every domain every k steps inside a task (0: only at task boundaries)
    train_split: dict = field(default_factory=dict)  # domain -> train split (default: cl_domains.DOMAIN_DEFAULTS)
    eval_split: dict = field(default_factory=dict)  # domain -> eval split (default: cl_domains.DOMAIN_DEFAULTS)
    econfig: dict = field(default_factory=dict)  # domain -> econfig overrides (solo_mode, user, reward, max_turns, ...)
    data_path: dict = field(default_factory=dict)  # domain -> train/valid_dataset.path (gsm8k, ifeval: file or dir)
    metric: str = "pass^1"  # the score in the accuracy matrix R: pass^1 | pass^k | reward_mean
    algorithm: str = "sequential"  # sequential | replay | ewc | lora_per_domain | joint (cl_algorithms.ALGORITHMS)
    replay_ratio: float = 0.5  # replay: ceil(ratio * train.batch_size) past-domain tasks added to each step
    kl_coef: float = 0.0  # > 0: k3 KL to the previous task's policy (the untrained model during the first task)
    ewc_lambda: float = 10.0  # ewc: λ of (λ/2) Σ F (θ − θ*)²
    buffer_size: int = 512  # trajectories kept per domain (oldest dropped first)
    kl_to_base: bool = False  # also report KL(policy || untrained) on each domain's eval prompts (a forgetting predictor)
    save_checkpoints: bool = True  # checkpoint_task_{k}/ after each task (model, optimizer, trajectories, state)
    resume_from: Optional[str] = None  # .../checkpoint_task_{k}: continue with the domain after k


@dataclass
class SFTConfig:
    """``sft.*``: supervised fine-tuning before RL (``python sft.py``; torchrl_grpo.training.sft_trainer, torchrl_grpo.rollout.demonstrations).
    Uses ``optimizer.*`` (lr, scheduler over the phase's optimizer steps), ``train.micro_batch_size`` /
    ``max_tokens_per_mb`` / ``shared_prefix`` and ``eval.*``; grpo.py ignores this section."""

    source: str = "gold"  # gold (the env's demonstrations of the train split) | rft (the policy's own successes only)
    epochs: int = 2  # passes over each phase's data (gold demonstrations, each RFT round's kept episodes)
    minibatch_size: int = 8  # episodes per optimizer step
    min_reward: float = 1.0  # a replayed demonstration / RFT episode is kept when its env reward reaches this
    rft_rounds: int = 0  # rounds of rejection-sampling fine-tuning after the gold phase
    rft_samples: int = 4  # episodes sampled per train task in each RFT round (at gconfig.temperature)
    save_model: bool = True  # <run_dir>/sft_model: merged weights + tokenizer, for grpo.py actor.path=


@dataclass
class DevicePlanConfig:
    """``train_model`` / ``inference_model`` / ``ref_model``: TorchRL GRPO recipe keys (torchrl_grpo/distributed/device_plan.py)."""

    num_devices: int = 0  # devices of this role (0: not set; inference/ref then colocate on the train devices)
    devices: list = field(default_factory=list)  # explicit device indices, e.g. [2, 3] (instead of num_devices)


@dataclass
class GRPOConfig:
    seed: int = 1
    mode: str = "sync"  # sync | async (rollouts overlapped with updates, staleness <= train.max_staleness); in the
    #                     YAML configs the `mode` group sets it (configs/mode/{sync,async}.yaml, grpo-async.py)
    eval_only: bool = False
    output_dir: Optional[str] = None  # default: hydra's run dir
    # device plan (torchrl_grpo/distributed/device_plan.py; printed at start, written to run_dir/plan.json): AReaL's string,
    # e.g. vllm:d1+fsdp:d2, or the TorchRL recipe keys below; neither: one colocated device
    allocation_mode: Optional[str] = None
    train_model: DevicePlanConfig = field(default_factory=DevicePlanConfig)
    inference_model: DevicePlanConfig = field(default_factory=DevicePlanConfig)
    ref_model: DevicePlanConfig = field(default_factory=DevicePlanConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    train_dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)
    valid_dataset: DatasetConfig = field(default_factory=DatasetConfig)
    econfig: EnvConfig = field(default_factory=EnvConfig)
    gconfig: GenerationConfig = field(default_factory=GenerationConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stats_logger: StatsLoggerConfig = field(default_factory=StatsLoggerConfig)
    cl: ContinualConfig = field(default_factory=ContinualConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


MODES = ("sync", "async")  # grpo.py: trainer.GRPOTrainer | async_trainer.AsyncGRPOTrainer


def _choices() -> dict[str, tuple]:
    """Config key -> allowed values, each set declared once, in the module that implements it.

    Imported here, not at module level: this module stays importable without torch (``grpo.py --help`` and Hydra's
    schema registration take 0.6 s instead of ~8 s).
    """
    from envs.tau2.env import REWARD_KINDS

    from torchrl_grpo.objectives.advantage import BASELINES, SCALES
    from torchrl_grpo.build import BACKENDS, DEVICES, SCHEDULERS
    from torchrl_grpo.distributed.data_parallel import STRATEGIES
    from torchrl_grpo.rollout.ray_workers import LAUNCHERS
    from torchrl_grpo.objectives.loss import AGGREGATIONS, BEHAVIOUR_WEIGHT_MODES
    from torchrl_grpo.models.loading import DTYPES
    from torchrl_grpo.reporting.stats_logger import WANDB_MODES
    from torchrl_grpo.training.sft_trainer import SFT_SOURCES
    from torchrl_grpo.training.update import ANCHORS

    return {
        "mode": MODES,
        "actor.dtype": DTYPES,
        "rollout.backend": BACKENDS,
        "loss.aggregation": AGGREGATIONS,
        "loss.adv_scale": SCALES,
        "loss.adv_baseline": BASELINES,
        "loss.behaviour_weight_mode": BEHAVIOUR_WEIGHT_MODES,
        "loss.anchor": ANCHORS,
        "optimizer.scheduler": SCHEDULERS,
        "stats_logger.wandb.mode": WANDB_MODES,
        "econfig.reward": REWARD_KINDS,
        "train.device": DEVICES,
        "train.strategy": STRATEGIES,
        "rollout.launcher": LAUNCHERS,
        "sft.source": SFT_SOURCES,
    }


def validate_config(cfg) -> None:
    """Check value ranges and choices that a type schema cannot express.

    Raises:
        ValueError: naming the offending key and the allowed values.
    """
    from omegaconf import OmegaConf

    from torchrl_grpo.rollout.env_side import tau2_user

    for key, allowed in _choices().items():
        val = OmegaConf.select(cfg, key)
        if val not in allowed:
            raise ValueError(f"config {key}={val!r} is not one of {allowed}")
    tau2_user(cfg.econfig)  # econfig.solo_mode / user / user_llm agree (tau2 envs only)
    positive = ["train.steps", "train.batch_size", "train.micro_batch_size", "train.ppo_epochs", "gconfig.n_samples",
                "gconfig.max_new_tokens", "rollout.max_batch_size", "rollout.max_context_tokens", "econfig.max_turns"]
    for key in positive:
        if OmegaConf.select(cfg, key) < 1:
            raise ValueError(f"config {key} must be >= 1, got {OmegaConf.select(cfg, key)}")
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm.max_model_len < cfg.rollout.max_context_tokens:
        raise ValueError(
            f"config rollout.vllm.max_model_len={cfg.rollout.vllm.max_model_len} is below "
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens}; raise it or lower the context limit"
        )
    if cfg.train.shared_prefix not in ("auto", "off"):
        raise ValueError(f"config train.shared_prefix must be auto | off, got {cfg.train.shared_prefix!r}")
    if cfg.train.max_tokens_per_mb < 0:
        raise ValueError(f"config train.max_tokens_per_mb must be >= 0 (0: no budget), got {cfg.train.max_tokens_per_mb}")
    if cfg.loss.behaviour_weight_cap is not None and cfg.loss.behaviour_weight_cap <= 0:
        raise ValueError(f"config loss.behaviour_weight_cap must be > 0 or null, got {cfg.loss.behaviour_weight_cap}")
    if cfg.train.max_staleness is not None and cfg.train.max_staleness < 0:
        raise ValueError(f"config train.max_staleness must be >= 0, got {cfg.train.max_staleness}")
    _validate_scale_out(cfg)
    if cfg.train.partial_rollout_chunk < 0:
        raise ValueError(f"config train.partial_rollout_chunk must be >= 0, got {cfg.train.partial_rollout_chunk}")
    _validate_mode_keys(cfg)
    if OmegaConf.select(cfg, "cl.task_order"):
        from torchrl_grpo.continual.domains import validate_cl_config

        validate_cl_config(cfg, check_tasks=False)  # names and ranges; ContinualTrainer also checks the splits
        _validate_continual_keys(cfg)
    for key in ("sft.epochs", "sft.minibatch_size", "sft.rft_samples"):
        if OmegaConf.select(cfg, key) < 1:
            raise ValueError(f"config {key} must be >= 1, got {OmegaConf.select(cfg, key)}")
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
    key and the ``cl.*`` key that does it (:class:`ContinualConfig`)."""
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
    from omegaconf import OmegaConf

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
    from torchrl_grpo.distributed.device_plan import train_strategy
    from torchrl_grpo.distributed.data_parallel import is_data_parallel

    strategy = train_strategy(cfg)  # train.strategy, or the engine allocation_mode names
    if r.launcher == "ray" and is_data_parallel(strategy):
        raise ValueError(f"rollout.launcher=ray and train.strategy={strategy} are not combined yet: one of them per "
                         f"run")
    scaled = r.launcher == "ray" or is_data_parallel(strategy)
    if scaled and (cfg.mode != "sync" or OmegaConf.select(cfg, "cl.task_order")):
        raise ValueError("rollout.launcher=ray and train.strategy=ddp/fsdp run with the sync trainer (mode=sync, no "
                         "cl.task_order) for now")
    if strategy == "fsdp" and cfg.actor.peft.enable:
        from torchrl_grpo.distributed.data_parallel import LORA_FSDP_REFUSAL

        raise ValueError(LORA_FSDP_REFUSAL)


def register_configs() -> None:
    """Register the schema as ``grpo_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="grpo_schema", node=GRPOConfig)
