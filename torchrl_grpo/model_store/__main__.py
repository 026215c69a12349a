"""``python -m torchrl_grpo.model_store {list,fetch}`` (see :mod:`torchrl_grpo.model_store.cache_cli`)."""
import sys

from torchrl_grpo.model_store.cache_cli import main

sys.exit(main())
