"""Structured (typed) Hydra config schema for the GRPO trainer.

Registered in Hydra's ConfigStore as ``grpo_schema``; the YAML files in ``configs/`` list it first in their
``defaults`` so that an unknown or mistyped key (``optimizer.lrr=1e-5``) fails at start-up with an error naming
it, and a wrong type (``train.steps=abc``) fails before any model is loaded. Allowed values and ranges:
:mod:`torchrl_grpo.config.choices` and :func:`torchrl_grpo.config.validation.validate_config`. Names follow AReaL
where users know them (``actor.path``, ``gconfig.n_samples``, ``econfig.*``, ``train_dataset.split``, ``rollout.backend``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

__all__ = ["GRPOConfig", "register_configs"]


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
    #                             tau2: a tasks file (as econfig.tasks_path, for this dataset; the split is then unused)
    split: str = "test"  # valid_dataset: evaluation reads its first eval.n_problems usable tasks


@dataclass
class TrainDatasetConfig(DatasetConfig):
    split: str = "train"
    limit: Optional[int] = None  # use only the first N problems / tasks (of those from `start` on)
    start: int = 0  # train on the tasks whose index in the split is >= start (past an SFT phase's first sft.limit)
    max_intents: Optional[int] = None  # tau2 generated splits: only tasks of <= K sub-intents (Tau2Env(max_intents=))


@dataclass
class EnvConfig:
    env_id: str = "GSM8K-v1"
    format_reward: float = 0.0  # GSM8K: credit for a well-formed wrong answer; 0 = correctness-only (see envs/gsm8k/grading.py)
    domain: str = "telecom"  # tau2
    max_steps: int = 30  # tau2: env steps before truncation
    max_turns: int = 1  # assistant turns per episode (GSM8K: 1)
    # tau2 users, one spelling per concept (AReaL's econfig.solo_mode is the switch; see torchrl_grpo.config.tau2_users):
    solo_mode: bool = True  # the agent works the ticket alone (env user="solo"); econfig.user / user_llm must be unset
    user: Optional[str] = None  # solo_mode=false: scripted | llm | local (null: local if user_llm=local, llm if
    #                             user_llm is set, else scripted); user=solo is an error naming solo_mode=true
    user_llm: Optional[str] = None
    user_llm_base_url: Optional[str] = None
    user_llm_args: dict = field(default_factory=dict)
    reward: str = "binary"  # tau2: binary | partial | partial_on_stop
    # tau2: a file of tasks in tau2's Task schema (JSON list or JSON lines; envs/tau2/task_file.py) served instead of
    # the split, for both datasets; train_dataset.path / valid_dataset.path, when set, name each dataset's own file
    tasks_path: Optional[str] = None
    # tau2 solo mode: the ticket in tau2's system prompt (system) or as a first user message (user: the system prompt
    # and tool schemas are then one prefix shared by every task; envs/tau2/env.py divergence 9)
    solo_ticket: str = "system"
    # tau2: read-only tools without arguments every gold demonstration calls first (SFT data; mock: [get_users]);
    # envs/tau2/env.py Tau2Env(gold_reads_first=)
    gold_reads_first: list = field(default_factory=list)
    system_prompt: Optional[str] = None
    # ReasoningGym-v1 (envs/reasoning_gym): one generator `task` or a weighted mix `tasks` {name: weight}; task_config
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
    # the settings of an env family whose keys are not above ({key: value}; envs/<family>/family.py declares them and
    # their defaults, and an unknown key fails at start-up naming the family's keys: envs.families.EnvFamily.section)
    params: Any = None


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
    # transformers backend decode loop: auto = graph on CUDA (fixed shapes, each step a replayed CUDA graph, no host
    # read per step: 48 tokens at batch 64 went from ~32 ms to a few ms per step on an H100), eager on CPU (drops
    # finished rows: there arithmetic dominates) | eager | static (fixed shapes, no graphs) | graph
    decode: str = "auto"
    # transformers backend, multi-turn: keep each episode's keys/values (prompt + sampled tokens) from one turn to
    # the next, so a turn prefills only the env's reply, up to this many MiB per generate call (0 = off;
    # torchrl_grpo/backends/turn_kv_cache.py; exact where the prompt-prefix cache is: docs/training-fast-paths.md)
    turn_cache_mb: float = 0.0
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class LossConfig:
    # clip range and aggregation: null (default) = by importance_level (objectives/loss.py LEVEL_DEFAULTS):
    # token -> 0.2 / 0.28 and token_mean (DAPO); sequence -> 3e-4 / 4e-4 and seq_mean_token_mean (the GSPO paper's,
    # arXiv:2507.18071). A value set here (or on the command line) is kept.
    clip_eps_low: Optional[float] = None
    clip_eps_high: Optional[float] = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm (divides by gconfig.max_new_tokens x
    # econfig.max_turns) | null (by importance_level, above)
    aggregation: Optional[str] = None
    adv_scale: str = "group"  # group (GRPO) | none (Dr. GRPO) | batch
    adv_baseline: str = "mean"  # mean | loo
    filter_zero_variance_groups: bool = False
    # decoupled correction w = pi_prox / pi_behav (AReaL Eq. 5), applied whenever the anchor is recomputed:
    behaviour_weight_cap: Optional[float] = 2.0  # cap c on w (None: no cap)
    behaviour_weight_mode: str = "truncate"  # truncate: min(w, c) | mask: tokens with w > c get no gradient (AReaL)
    # PPO anchor pi_old: auto = the trainer's no-grad recompute unless the sampler is the trainer's own module at
    # its own precision (colocated fp32 transformers backend, no autocast) and the batch gets one on-policy update.
    # Kept only where the ratio needs it: exact sampler on CPU -> none (ratio 1 by construction); bf16 autocast or
    # another engine (CUDA, vLLM) with one optimizer step -> the loss forward's own detached log-probs (no extra
    # pass); a separate no-grad pass only for several updates per batch, stale (async) batches or dropout. Measured
    # (issue 35, H100, SmolLM2-135M shape, 64 episodes, one pass): the separate pass adds 0.093 s to a 0.32 s update
    anchor: str = "auto"  # auto | recompute | behaviour
    # importance ratio: token (GRPO/DAPO, per token) | sequence (GSPO, Zheng et al. 2025, arXiv:2507.18071: the
    # length-normalised sequence ratio, clipped per episode; objectives/loss.py). With the clip range and aggregation
    # left null, sequence takes the paper's clip_eps_low=3e-4, clip_eps_high=4e-4 and seq_mean_token_mean; a clip range
    # above 0.01 set with sequence is kept, with a warning
    importance_level: str = "token"


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
    micro_batch_size: int = 0  # at most this many episodes per forward/backward (0: no count limit, the budget decides)
    # padded-token budget per forward/backward (rows x longest row; AReaL mb_spec): an int (0: none) or auto = an
    # activation allowance over the model's estimated bytes per token (training/micro_batch.py): on CUDA half the
    # free device memory, so a step's episodes run in one pass when they fit (fewer, larger passes keep the GPU
    # busy); on CPU a fixed 4 GiB (RAM is shared with rollout, reference and optimizer state, and bigger CPU passes
    # are not faster). Episodes are sorted by length within it when that computes less padding; gradients exact
    max_tokens_per_mb: Any = "auto"
    # auto | off: run the token prefix common to a minibatch's episodes (prompt; policy + tools across tasks) once for
    # all its micro-batches, remainders against its keys/values (exact; gc and LoRA too; torchrl_grpo/objectives/shared_prefix.py)
    # and count only remainder tokens against max_tokens_per_mb; off: whole episodes per micro-batch
    shared_prefix: str = "auto"
    disable_dropout: bool = True  # zero every dropout rate in the policy (TRL's default for GRPO too)
    ppo_epochs: int = 1
    resume_from: Optional[str] = None
    device: str = "auto"  # auto | cpu | cuda
    # mode=async only (validate_config refuses them in sync mode): the most policy versions a batch may lag behind
    # (null: 1, AReaL's one-step-off pipeline; torchrl_grpo.assembly.max_staleness), and partial rollouts:
    max_staleness: Optional[int] = None
    partial_rollout_chunk: int = 0  # check for new weights every N generated tokens and continue
    # unfinished generations with them (partial rollouts, AReaL; per-token versions); 0: whole generations
    # single | ddp | fsdp: data-parallel over torchrun ranks (torchrl_grpo/distributed/data_parallel.py: gloo on CPU, NCCL on
    # CUDA; each rank collects its share of the step's prompt groups; gradients all-reduced (ddp) or reduce-scattered
    # to FSDP2 shards (fsdp); rank 0 writes the run's files). single + allocation_mode=...+fsdp:dN: fsdp
    strategy: str = "single"


@dataclass
class EvalConfig:
    every: int = 0  # eval every k steps and after the last one (the curve ends there; 0: only at start/end per the flags)
    at_start: bool = True
    at_end: bool = True
    n_problems: int = 16
    greedy: bool = True
    pass_k: int = 0  # if > 0: also sample k completions per problem and report pass@k (tasks: valid_dataset)


@dataclass
class CheckpointConfig:
    """Resumable checkpoints (``checkpoints/step_<n>/``: weights, optimizer, schedule, RNG; SmolLM2-135M fp32: 1.6 GB
    each) and the trained weights alone (``final_model/``: 538 MB for it), README "What a run writes"."""

    every: int = 2  # 0 disables periodic checkpoints
    keep_last: int = 2
    save_final: bool = True  # a resumable checkpoint of the last step (unless `every` just wrote it)
    on_interrupt: bool = True  # SIGINT/SIGTERM: checkpoint the last completed step (torchrl_grpo/training/interrupt.py)
    final_model: bool = True  # <run_dir>/final_model: trained weights + tokenizer for actor.path= (GRPO; not resumable)


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
    per-domain defaults in torchrl_grpo.config.continual_domains). An empty ``task_order`` means an ordinary single-env run.

    A continual run scores every domain before training, every ``cl.eval_interval`` steps and at each task boundary,
    and checkpoints per task (``cl.save_checkpoints``, ``cl.resume_from``): :func:`~torchrl_grpo.config.validation.validate_config` refuses
    ``eval_only``, ``eval.every``, ``checkpoint.every``, ``train.resume_from``, ``checkpoint.save_final`` without
    ``cl.save_checkpoints``, ``eval.at_start=false`` / ``eval.at_end=false`` (the scores before training and after
    the last task are the accuracy matrix's b and last row: always computed) and a non-default
    ``checkpoint.keep_last`` (each task's checkpoint is kept), which it would not honour. It reads
    ``eval.n_problems`` / ``greedy`` / ``pass_k`` and ``checkpoint.on_interrupt``."""

    task_order: list = field(default_factory=list)  # domains in training order: airline | retail | telecom | mock | gsm8k | ifeval
    num_steps_per_task: int = 10  # trainer steps on each domain
    max_tasks_per_domain: Optional[int] = None  # train on the first N usable tasks of each domain's train split
    eval_interval: int = 0  # also evaluate every domain every k steps inside a task (0: only at task boundaries)
    train_split: dict = field(default_factory=dict)  # domain -> train split (default: config.continual.DOMAIN_DEFAULTS)
    eval_split: dict = field(default_factory=dict)  # domain -> eval split (default: config.continual.DOMAIN_DEFAULTS)
    econfig: dict = field(default_factory=dict)  # domain -> econfig overrides (solo_mode, user, reward, max_turns, ...)
    data_path: dict = field(default_factory=dict)  # domain -> train/valid_dataset.path (gsm8k, ifeval: file or dir)
    metric: str = "pass^1"  # the score in the accuracy matrix R: pass^1 | pass^k | reward_mean
    algorithm: str = "sequential"  # sequential | replay | ewc | lora_per_domain | joint (config.choices.CL_ALGORITHMS)
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
    ``max_tokens_per_mb`` / ``shared_prefix`` and ``eval.*``. grpo.py ignores this section unless ``before_grpo``:
    then it runs this SFT phase first (in ``<run_dir>/sft``) and GRPO from its ``sft_model``, in one command
    (:func:`torchrl_grpo.cli.run`; ``configs/grpo_tau2_mock.yaml``)."""

    before_grpo: bool = False  # grpo.py: SFT first (<run_dir>/sft), then GRPO from <run_dir>/sft/sft_model
    limit: Optional[int] = None  # demonstrations from the first N train tasks only (null: train_dataset.limit's)
    lr: Optional[float] = None  # before_grpo: the SFT phase's optimizer.lr (null: optimizer.lr)
    base_eval_problems: int = 0  # before_grpo: the SFT phase scores the base model on the first N valid tasks (0: not)
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


def register_configs() -> None:
    """Register the schema as ``grpo_schema`` in Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="grpo_schema", node=GRPOConfig)
