"""The run's configuration: the schema (:mod:`.schema`, dataclasses registered with Hydra), every choice set
(:mod:`.choices`) and the rules about config values (:mod:`.validation`, :mod:`.tau2_users`, :mod:`.allocation_mode`,
:mod:`.continual`). A leaf of the package: it imports nothing else of ``torchrl_grpo`` and no torch
(tests/test_import_graph.py); the modules that implement a choice import its set from here."""
from torchrl_grpo.config.allocation_mode import AllocationError, parse_allocation_mode, train_strategy  # noqa: F401
from torchrl_grpo.config.choices import MODES  # noqa: F401
from torchrl_grpo.config.continual_domains import CL_DOMAINS, DOMAIN_DEFAULTS, domain_config, validate_cl_settings  # noqa: F401
from torchrl_grpo.config.schema import (  # noqa: F401  (the config's public names live here)
    ActorConfig,
    CheckpointConfig,
    ContinualConfig,
    DatasetConfig,
    DevicePlanConfig,
    EnvConfig,
    EvalConfig,
    GenerationConfig,
    GRPOConfig,
    LossConfig,
    OptimizerConfig,
    PeftConfig,
    RolloutConfig,
    SFTConfig,
    StatsLoggerConfig,
    TrainConfig,
    TrainDatasetConfig,
    VLLMConfig,
    WandbConfig,
    register_configs,
)
from torchrl_grpo.config.tau2_users import tau2_user  # noqa: F401
from torchrl_grpo.config.validation import (  # noqa: F401
    LORA_FSDP_REFUSAL,
    _choices,
    check_sft_run,
    is_data_parallel,
    validate_config,
)
