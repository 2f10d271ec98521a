"""Parse a sampled assistant turn into a Message and its tool calls, Qwen3-style.

A call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; the text before the
first call is the message content (minus the one newline the template puts between content and
call). Parsing only *routes* calls: the tokens the model sampled stay on the tape, whatever the
parse finds.

A malformed call is a value, not an exception: the turn comes back as plain text with no tool
calls (so nothing half-parsed runs, and re-rendering it reproduces the text) plus ParseErrors
whose messages say what was wrong in words the harness can send back to the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kwrl.types import Message, ToolCall

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_FORMAT = '<tool_call>\n{"name": "tool_name", "arguments": {"param": "value"}}\n</tool_call>'
_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParseError:
    """One tool call that could not be routed."""

    call_index: int
    """0-based position of the call in the turn."""
    message: str
    """What was wrong and how to write it, addressed to the model."""
    raw: str
    """The offending text between the tags (or after an unclosed `<tool_call>`)."""


@dataclass(frozen=True)
class ParsedAssistant:
    """A sampled turn as the harness sees it."""

    message: Message
    """Role `assistant`; verbatim text and no calls when any call failed to parse."""
    errors: tuple[ParseError, ...] = ()
    stopped: bool = True
    """The turn ended with a stop token (False: cut off, e.g. at the token limit)."""

    @property
    def ok(self) -> bool:
        return not self.errors

    def error_message(self) -> str:
        """All errors as one message for the model ('' when there are none)."""
        if not self.errors:
            return ""
        lines = [e.message for e in self.errors]
        return "\n".join([*lines, f"No tool was run. Write each call as:\n{CALL_FORMAT}"])


def parse_assistant_text(text: str, call_id_prefix: str = "call") -> ParsedAssistant:
    """Split `text` (one turn, stop token removed) into content and tool calls."""
    first = text.find(CALL_OPEN)
    if first < 0:
        if CALL_CLOSE in text:
            error = ParseError(0, f"Found {CALL_CLOSE} without an opening {CALL_OPEN}.", text)
            return ParsedAssistant(Message("assistant", text), (error,))
        return ParsedAssistant(Message("assistant", text))
    calls: list[ToolCall] = []
    errors: list[ParseError] = []
    end = first
    for k, match in enumerate(_CALL_RE.finditer(text, first)):
        call = _parse_call(match.group(1), k, f"{call_id_prefix}_{k}")
        if isinstance(call, ToolCall):
            calls.append(call)
        else:
            errors.append(call)
        end = match.end()
    if CALL_OPEN in text[end:]:
        k = len(calls) + len(errors)
        tail = text[text.index(CALL_OPEN, end) + len(CALL_OPEN):]
        message = f"Tool call {k + 1} has no closing {CALL_CLOSE} (was the turn cut off?)."
        errors.append(ParseError(k, message, tail))
    if errors:
        return ParsedAssistant(Message("assistant", text), tuple(errors))
    content = text[:first]
    content = content[:-1] if content.endswith("\n") else content
    return ParsedAssistant(Message("assistant", content, tool_calls=tuple(calls)))


def _parse_call(body: str, k: int, call_id: str) -> ToolCall | ParseError:
    """One `{"name": ..., "arguments": {...}}` object; `arguments` may be omitted (no params)."""
    where = f"Tool call {k + 1}"
    try:
        obj: Any = json.loads(body)
    except json.JSONDecodeError as exc:
        return ParseError(k, f"{where} is not valid JSON: {exc.msg} at character {exc.pos}.", body)
    if not isinstance(obj, dict):
        return ParseError(k, f"{where} must be a JSON object, not {type(obj).__name__}.", body)
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ParseError(k, f'{where} needs a "name" string.', body)
    if not isinstance(arguments, dict):
        return ParseError(k, f'{where}: "arguments" must be a JSON object.', body)
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return ParseError(k, f'{where} has keys other than "name" and "arguments": {extra}.', body)
    return ToolCall(id=call_id, name=name, arguments=arguments)
