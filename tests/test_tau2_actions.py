"""Parsing of agent turns into tool calls (envs.tau2.actions)."""
import json

import pytest

from envs.tau2.actions import parse_action

TOOLS = {"get_user_details", "cancel_reservation", "done"}


def test_hermes_blocks_in_order_with_content():
    text = (
        "Let me look that up.\n"
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "u1"}}\n</tool_call>\n'
        '<tool_call>{"name": "cancel_reservation", "arguments": "{\\"reservation_id\\": \\"R1\\"}"}</tool_call>'
    )
    p = parse_action(text, id_prefix="c", tool_names=TOOLS)
    assert p.content == "Let me look that up."
    assert [(c.id, c.name, c.arguments) for c in p.tool_calls] == [
        ("c_0", "get_user_details", {"user_id": "u1"}),
        ("c_1", "cancel_reservation", {"reservation_id": "R1"}),
    ]
    assert all(c.ok for c in p.tool_calls)


def test_unclosed_block_and_think_are_handled():
    p = parse_action('<think>plan <tool_call>{"name": "x"}</tool_call></think><tool_call>{"name": "done", "arguments": {}}')
    assert [c.name for c in p.tool_calls] == ["done"]
    assert p.content is None


def test_bare_json_object_list_and_fence():
    p = parse_action('{"name": "get_user_details", "arguments": {"user_id": "a"}}')
    assert p.content is None and p.tool_calls[0].arguments == {"user_id": "a"}
    p = parse_action('```json\n[{"name": "a", "parameters": {"x": 1}}, {"name": "b"}]\n```')
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("a", {"x": 1}), ("b", {})]


def test_functional_syntax_only_for_known_tools():
    p = parse_action("cancel_reservation(reservation_id='R1')", tool_names=TOOLS)
    assert p.tool_calls[0].name == "cancel_reservation" and p.tool_calls[0].arguments == {"reservation_id": "R1"}
    prose = parse_action("Sure (one moment)", tool_names=TOOLS)
    assert prose.tool_calls == [] and prose.content == "Sure (one moment)"
    multi = parse_action("get_user_details(user_id='a')\ndone()", tool_names=TOOLS)
    assert [c.name for c in multi.tool_calls] == ["get_user_details", "done"]
    bad = parse_action("cancel_reservation(reservation_id='R1'", tool_names=TOOLS)
    assert bad.tool_calls == [] and bad.content  # not a call: unbalanced, stays prose


def test_plain_text_is_a_message():
    p = parse_action("  Hello, how can I help?  ")
    assert p.content == "Hello, how can I help?" and p.tool_calls == []


@pytest.mark.parametrize(
    "text,needle",
    [
        ('<tool_call>{"name": "a", "arguments": {"x": </tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "a", "arguments": "{broken"}</tool_call>', "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ],
)
def test_malformed_calls_carry_errors(text, needle):
    p = parse_action(text)
    assert len(p.tool_calls) == 1
    c = p.tool_calls[0]
    assert not c.ok and needle in c.error and c.arguments is None


def test_message_dicts():
    msg = {
        "role": "assistant",
        "content": "checking",
        "tool_calls": [
            {"id": "abc", "type": "function", "function": {"name": "get_user_details", "arguments": json.dumps({"user_id": "u"})}},
            {"name": "done", "arguments": {}},
        ],
    }
    p = parse_action(msg, id_prefix="z")
    assert p.content == "checking"
    assert [(c.id, c.name, c.arguments) for c in p.tool_calls] == [("abc", "get_user_details", {"user_id": "u"}), ("z_1", "done", {})]
    # no tool_calls: the content is parsed as text
    p = parse_action({"content": '<tool_call>{"name": "done"}</tool_call>'})
    assert [c.name for c in p.tool_calls] == ["done"]


@pytest.mark.parametrize(
    "action",
    [None, 3, 1.5, ["a"], {"role": "user", "content": "x"}, {"content": 5}, {"tool_calls": "x"}, b"bytes"],
)
def test_unusable_actions_never_raise(action):
    p = parse_action(action)
    assert p.error is not None and p.tool_calls == [] and p.content is None


def test_empty_text():
    assert parse_action("   ").is_empty
    assert parse_action("").is_empty
