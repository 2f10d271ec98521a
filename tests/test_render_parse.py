"""Parsing sampled turns: content and tool calls out; malformed calls reported, never raised."""

from __future__ import annotations

import pytest

from kwrl.render import parse_assistant_text
from kwrl.types import Message, ToolCall


def test_plain_text_is_the_content() -> None:
    parsed = parse_assistant_text("Revenue was $4.5m.")
    assert parsed.message == Message("assistant", "Revenue was $4.5m.")
    assert parsed.ok and parsed.error_message() == ""


def test_calls_are_parsed_with_ids_and_the_separating_newline_leaves_the_content() -> None:
    text = ('<think>\nRead it.\n</think>\n\n<tool_call>\n{"name": "read_file", "arguments": '
            '{"path": "a.xlsx", "opts": {"rows": [1, 2], "raw": true}}}\n</tool_call>\n'
            '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>')
    parsed = parse_assistant_text(text, call_id_prefix="t3")
    assert parsed.ok
    assert parsed.message.content == "<think>\nRead it.\n</think>\n"
    assert parsed.message.tool_calls == (
        ToolCall("t3_0", "read_file", {"path": "a.xlsx", "opts": {"rows": [1, 2], "raw": True}}),
        ToolCall("t3_1", "list_files", {}),
    )


def test_a_call_without_arguments_gets_empty_arguments() -> None:
    parsed = parse_assistant_text('<tool_call>\n{"name": "list_files"}\n</tool_call>')
    assert parsed.message.tool_calls == (ToolCall("call_0", "list_files", {}),)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"name": "f", "arguments": {"x": True}}', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"arguments": {}}', 'needs a "name" string'),
        ('{"name": "f", "arguments": "{}"}', '"arguments" must be a JSON object'),
        ('{"name": "f", "arguments": {}, "id": 1}', "keys other than"),
    ],
)
def test_a_malformed_call_is_an_error_value_and_the_turn_stays_verbatim(body: str, says: str
                                                                        ) -> None:
    text = f'Trying.\n<tool_call>\n{{"name": "ok", "arguments": {{}}}}\n</tool_call>\n' \
           f"<tool_call>\n{body}\n</tool_call>"
    parsed = parse_assistant_text(text)
    assert not parsed.ok
    assert parsed.message == Message("assistant", text)  # nothing of the turn runs
    (error,) = parsed.errors
    assert error.call_index == 1 and says in error.message and error.raw.strip() == body
    assert error.message in parsed.error_message()
    assert "No tool was run" in parsed.error_message()


def test_an_unclosed_call_is_reported_as_cut_off() -> None:
    parsed = parse_assistant_text('<tool_call>\n{"name": "read_file", "argu')
    (error,) = parsed.errors
    assert "no closing </tool_call>" in error.message and "cut off" in error.message
    assert error.raw == '\n{"name": "read_file", "argu'


def test_a_stray_closing_tag_is_reported() -> None:
    parsed = parse_assistant_text('{"name": "f"}\n</tool_call>')
    assert not parsed.ok and "without an opening" in parsed.errors[0].message
