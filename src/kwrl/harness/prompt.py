"""What the model is told: the system prompt, the final-answer convention, the tool schemas.

The final-answer convention. The agent works through tool calls; its first assistant turn that
contains no tool call ends the episode, and that turn's text (minus any `<think>` reasoning) is
the final answer that the grader reads. There is no `answer` tool: a turn without a call is the
only way to finish, which is what chat models already do when they are done, and it keeps the
answer on the tape as sampled text. A turn whose tool call is malformed is not an answer: the
harness sends the parse error back and lets the model retry (see `kwrl.harness.loop`).

The system prompt is short on purpose: the tiny model's context is ~4k tokens, and every token
of it is paid for on every turn. It opens with the sentences the tiny tokenizer was trained on
(`kwrl.models.corpus.SYSTEM_PROMPT`), so it encodes compactly, and adds the convention.

Tool schemas come from the MCP tool list (name, description, inputSchema) and are converted to
the OpenAI-style function dicts that HF chat templates render. All 43 tools of a world with their
full docstrings are ~22k characters. The `detail` of a schema: `full` as the server describes it;
`compact` keeps each description's first line and drops the `title` annotations pydantic adds to
every schema node; `brief` keeps only the name and the parameters' names, types and which are
required (no descriptions, no defaults): the tiny model learns what its tools do from
demonstrations, and at ~45 tokens a tool its whole prompt stays short (the lookup set: ~900 tokens
of system turn compact, ~500 brief). `subset` keeps only named tools.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from kwrl.types import Message

SYSTEM_PROMPT = (
    "You are an analyst. The workspace holds the client's files. Use the tools to find the "
    "facts you need, then give a short final answer that states the figure or name asked for. "
    "A reply without a tool call ends the task: it is your final answer. If the task asks for a "
    "file, create or edit it with the tools before you answer."
)
"""The default system prompt (both harnesses: the code harness is a generalization test, so the
model sees the same instructions with other tools)."""

SMALL_MCP_TOOLS: tuple[str, ...] = (
    "filesystem_find", "filesystem_read", "pdf_search", "pdf_tables", "sheets_search",
    "sheets_edit_cells", "docs_search", "docs_read", "docs_create", "docs_fill_table_cell",
    "slides_read_slide", "slides_edit_shape", "mail_search", "chat_search", "calendar_search",
)  # fmt: skip
"""A tool subset for small context windows: every tool the oracle plans of the current
templates call (measured on a 60-task split), plus `filesystem_read` and `mail_search`. With
`compact` it renders in ~2.7k tokens of the 512-token test vocabulary (all 43 tools: ~7k compact,
~15k in full), so the tiny model's 4k window keeps room to work."""

LOOKUP_MCP_TOOLS: tuple[str, ...] = (
    "filesystem_find", "pdf_search", "sheets_search", "docs_search", "chat_search",
    "calendar_search",
)  # fmt: skip
"""The search tools that answer every tier-1 and tier-2 task: the curriculum's first stage for
a tiny model, whose whole prompt must stay short."""

ToolDetail = Literal["full", "compact", "brief"]
TOOL_DETAILS: tuple[str, ...] = ("full", "compact", "brief")

_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def initial_messages(instruction: str, system_prompt: str = SYSTEM_PROMPT) -> list[Message]:
    """The conversation an episode starts from: the system prompt and the task's instruction."""
    return [Message("system", system_prompt), Message("user", instruction)]


def final_answer(message: Message) -> str:
    """The answer a turn without a tool call gives: its text, reasoning removed.

    A `<think>` block (closed or cut off) may mention candidate figures that are not the answer;
    the grader must only see what the model concluded.
    """
    return _THINK_RE.sub("", message.content).strip()


def tool_schema(tool: Any, detail: ToolDetail = "full") -> dict[str, Any]:
    """One MCP tool (an `mcp.types.Tool` or a dict with name, description, inputSchema) as an
    OpenAI-style function schema: {"type": "function", "function": {name, description,
    parameters}} (`brief`: no description)."""
    if detail not in TOOL_DETAILS:
        raise ValueError(f"tool detail must be one of {TOOL_DETAILS}, got {detail!r}")
    name, description, parameters = _tool_fields(tool)
    if detail == "brief":
        return {"type": "function", "function": {"name": name, "parameters": _brief(parameters)}}
    if detail == "compact":
        description = _first_line(description)
        parameters = _drop_titles(parameters)
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def tool_schemas(
    tools: Iterable[Any], subset: Sequence[str] | None = None, detail: ToolDetail = "full"
) -> list[dict[str, Any]]:
    """The schemas the model is shown, in the server's order (or `subset`'s, when given).

    A name in `subset` that is not a tool raises ValueError: a typo would otherwise silently
    hide a tool from the model for a whole run.
    """
    by_name = {_tool_fields(t)[0]: t for t in tools}
    if subset is None:
        return [tool_schema(t, detail) for t in by_name.values()]
    unknown = [n for n in subset if n not in by_name]
    if unknown:
        raise ValueError(f"unknown tools {unknown}; available: {', '.join(sorted(by_name))}")
    return [tool_schema(by_name[n], detail) for n in dict.fromkeys(subset)]


def schema_names(schemas: Iterable[Mapping[str, Any]]) -> list[str]:
    """The tool names of OpenAI-style function schemas."""
    return [str(s["function"]["name"]) for s in schemas]


def _tool_fields(tool: Any) -> tuple[str, str, dict[str, Any]]:
    if isinstance(tool, Mapping):
        schema = tool.get("inputSchema", tool.get("input_schema"))
        name, description = tool["name"], tool.get("description")
    else:
        schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
        name, description = tool.name, tool.description
    parameters = dict(schema) if schema else {"type": "object", "properties": {}}
    return str(name), str(description or ""), parameters


def _first_line(description: str) -> str:
    lines = [line.strip() for line in description.strip().splitlines()]
    return lines[0] if lines else ""


def _brief(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter names with one JSON type each (the first non-null of an anyOf), and `required`."""
    properties = {}
    for key, spec in dict(parameters.get("properties", {})).items():
        types = [spec.get("type")] + [s.get("type") for s in spec.get("anyOf", ())]
        properties[key] = {"type": next((t for t in types if t and t != "null"), "string")}
    return {"type": "object", "properties": properties,
            "required": list(parameters.get("required", []))}


def _drop_titles(schema: Any) -> Any:
    """A JSON schema without `title` annotations (pydantic's 'Path', 'readArguments'...).

    Walks schema nodes only, so a *property* named `title` (e.g. `docs_create`'s) is kept.
    """
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {k: _drop_titles(v) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_drop_titles(v) for v in value]
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _drop_titles(value)
        else:
            out[key] = value
    return out
