"""``python -m torchrl_grpo.models {list,fetch}`` (see :mod:`torchrl_grpo.models.cli`)."""
import sys

from torchrl_grpo.models.cli import main

sys.exit(main())
