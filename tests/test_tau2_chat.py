"""Rendering a tau2 conversation with a tokenizer's chat template (envs.tau2.chat)."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from envs.tau2.actions import parse_action
from envs.tau2.chat import render_chat

# A Qwen2.5-style template: tools in the system turn, tool calls as <tool_call> JSON (arguments | tojson).
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}"
    "\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}{%- set f = tc.function %}\n<tool_call>\n"
    '{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n'
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
# SmolLM2-style ChatML: ignores tools.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(["hello world tool call json arguments user assistant system"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_user_details",
            "description": "Get a user.",
            "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "policy"},
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_user_details", "arguments": json.dumps({"user_id": "u1"})}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "get_user_details", "content": '{"name": "U"}'},
]


def test_template_with_tools_gets_dict_arguments(tokenizer):
    tokenizer.chat_template = TOOL_TEMPLATE
    text = render_chat(tokenizer, MESSAGES, TOOLS)
    assert '"get_user_details"' in text.split("</tools>")[0]
    assert '{"name": "get_user_details", "arguments": {"user_id": "u1"}}' in text  # not double-encoded
    assert text.rstrip().endswith("<|im_start|>assistant")
    assert MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == '{"user_id": "u1"}'  # input untouched
    ids = render_chat(tokenizer, MESSAGES, TOOLS, tokenize=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tool_less_template_falls_back_to_hermes(tokenizer):
    tokenizer.chat_template = CHATML
    text = render_chat(tokenizer, MESSAGES, TOOLS)
    assert "<tools>" in text and "get_user_details" in text.split("<|im_end|>")[0]  # in the system turn
    assert "<tool_call>" in text and "<tool_response>" in text
    # what the model is shown to write is what the env parses back
    block = text[text.rindex("<tool_call>") : text.rindex("</tool_call>") + len("</tool_call>")]
    call = parse_action(block).tool_calls[0]
    assert (call.name, call.arguments) == ("get_user_details", {"user_id": "u1"})
    plain = render_chat(tokenizer, MESSAGES, TOOLS, tool_prompt="template")
    assert "<tools>" not in plain


def test_errors(tokenizer):
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        render_chat(tokenizer, MESSAGES, TOOLS)
    tokenizer.chat_template = CHATML
    with pytest.raises(ValueError, match="tool_prompt"):
        render_chat(tokenizer, MESSAGES, TOOLS, tool_prompt="xml")
