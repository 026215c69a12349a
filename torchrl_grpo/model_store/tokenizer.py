"""Tokenizer preparation for batched RL generation: left padding, a pad token, a chat template with tools.

When the model's own template cannot render tools (SmolLM2's cannot), a ChatML template with
Qwen/Hermes-style tool support replaces it: tool schemas go into the system message inside
``<tools></tools>``, assistant ``tool_calls`` are rendered as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and ``tool`` messages as
``<tool_response>`` blocks inside a user turn (exactly the format Qwen2.5 uses).
"""
from __future__ import annotations

import json
import re

from torchrl_grpo.model_store.errors import ModelResolutionError

__all__ = ["CHATML_TOOLS_TEMPLATE", "prepare_tokenizer"]

_TOOLS_PREAMBLE = (
    "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)


def _chatml_tools_template(default_system: str | None) -> str:
    """ChatML Jinja template with Qwen2.5-style tool support.

    ``default_system`` is emitted as the system message when the conversation has none (always
    when tools are given, since tool schemas live in the system message).
    """
    default = json.dumps(default_system or "You are a helpful assistant.")
    use_default_without_tools = "true" if default_system else "false"
    return (
        "{%- set default_system = " + default + " %}"
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
        "{%- else %}{{- default_system }}{%- endif %}"
        '{{- "' + _TOOLS_PREAMBLE + '" }}'
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        '{{- "' + _TOOLS_POSTAMBLE + '<|im_end|>\\n" }}'
        "{%- else %}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- elif " + use_default_without_tools + " %}"
        "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' and loop.first %}"
        "{%- elif message['role'] == 'user' or message['role'] == 'system' or "
        "(message['role'] == 'assistant' and not message.get('tool_calls')) %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
        "{%- elif message['role'] == 'assistant' %}"
        "{{- '<|im_start|>assistant' }}"
        "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
        "{%- for tool_call in message['tool_calls'] %}"
        "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
        "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
        "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif message['role'] == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
        "{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
        "{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


#: ChatML template with tools and no default system message (used by ``tiny-random`` and for
#: models that ship no template at all).
CHATML_TOOLS_TEMPLATE: str = _chatml_tools_template(None)

_SMOLLM_DEFAULT_SYSTEM = re.compile(r"You are a helpful AI assistant named SmolLM[^'\"<]*")


def _template_supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template and "tool_call" in template


def prepare_tokenizer(tokenizer):
    """Make a tokenizer ready for batched RL generation (in place; also returned).

    Sets ``padding_side="left"``; sets the pad token to eos when missing (raises
    :class:`ModelResolutionError` when the tokenizer has neither); installs a ChatML template
    with Qwen/Hermes tool support when the tokenizer has no template or its template cannot
    render ``tools`` (SmolLM2's default system prompt is kept in that case).
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelResolutionError(
                "tokenizer has neither a pad token nor an eos token; cannot pad batches"
            )
        tokenizer.pad_token = tokenizer.eos_token
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: take the default one
        template = template.get("default") or next(iter(template.values()), None)
    if not _template_supports_tools(template):
        default_system = None
        if template:
            match = _SMOLLM_DEFAULT_SYSTEM.search(template)
            if match:
                default_system = match.group(0)
        tokenizer.chat_template = _chatml_tools_template(default_system)
    return tokenizer


def _set_pad_ids(model, tokenizer) -> None:
    """Give ``model.config`` and ``model.generation_config`` the tokenizer's pad id where they have none."""
    pad_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = pad_id
