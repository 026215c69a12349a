"""GSM8K (Cobbe et al., 2021): data loading, answer extraction and grading, and ``GSM8KEnv``.

``GSM8KEnv`` is imported lazily by the Gymnasium registry (``envs.gsm8k.env:GSM8KEnv``); the
names below are re-exported for convenience.
"""
from .data import load_gsm8k
from .env import DEFAULT_SYSTEM_PROMPT, GSM8KEnv
from .grading import (
    extract_answer,
    gsm8k_reward,
    has_final_answer_format,
    is_correct,
    normalize_number,
    parse_gold,
)
from envs.spaces import AssistantAction, ChatMessages

__all__ = [
    "GSM8KEnv",
    "DEFAULT_SYSTEM_PROMPT",
    "load_gsm8k",
    "extract_answer",
    "normalize_number",
    "parse_gold",
    "is_correct",
    "has_final_answer_format",
    "gsm8k_reward",
    "ChatMessages",
    "AssistantAction",
]
