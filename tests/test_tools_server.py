"""App objects served over MCP: `kwrl mcp serve` as a real subprocess, driven by the SDK's own
stdio client, plus the definition checks `build_server` makes before anything is served."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult
from pydantic import Field
from typer.testing import CliRunner

from kwrl.cli import app
from kwrl.tools import ToolError
from kwrl.tools.server import ToolDefinitionError, build_server, load_apps, prepare_server

OUTPUT_LIMIT = 600
TOOL_TIMEOUT_S = 0.5
Served = tuple[BlockingPortal, ClientSession]
"""The portal whose event loop runs the session, and the session to `kwrl mcp serve`."""


class ProbeApp:
    """A test app with one tool per behaviour the server must get right."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read_note(
        self,
        path: Annotated[str, Field(description="Workspace-relative path of a text file.")],
        max_lines: int = 100,
    ) -> str:
        """Read the first lines of a text file in the workspace."""
        target = self.root / path
        if not target.is_file():
            raise ToolError(f"'{path}' does not exist; list the folder to see what is there")
        return "\n".join(target.read_text().splitlines()[:max_lines])

    def dump(self, size: int) -> str:
        """Return `size` characters: a huge output."""
        return "".join(chr(ord("a") + i % 26) for i in range(size))

    def sleep(self, seconds: float) -> str:
        """Take `seconds` to answer."""
        time.sleep(seconds)
        return "slept"

    def divide(self, a: int, b: int) -> str:
        """Divide a by b."""
        return str(a / b)

    def nothing(self) -> str:
        """Return an empty string (a bug the server must not pass on)."""
        return ""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workspace")
    (root / "notes.txt").write_text("revenue 4,512\nebitda 1,020\n")
    return root


@pytest.fixture(scope="module")
def served(workspace: Path) -> Iterator[Served]:
    """One `kwrl mcp serve` subprocess for the module, with a session driven from a portal."""
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-c", "from kwrl.cli import app; app()", "mcp", "serve",
            "--app", "test_tools_server:ProbeApp", "--root", str(workspace),
            "--tool-timeout", str(TOOL_TIMEOUT_S), "--output-limit", str(OUTPUT_LIMIT),
        ],
        env={"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])},
    )
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(stdio_session(params)) as session:
            yield portal, session


@asynccontextmanager
async def stdio_session(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    """The SDK's stdio client and an initialized session, every wait bounded."""
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, read_timeout_seconds=20) as session,
    ):
        with anyio.fail_after(30):
            await session.initialize()
        yield session


def call(served: Served, name: str, **args: Any) -> CallToolResult:
    portal, session = served
    return portal.call(session.call_tool, name, args)


def text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    return result.content[0].text  # type: ignore[union-attr]


def test_list_tools_shows_schemas_from_type_hints_and_docstrings(served: Served) -> None:
    portal, session = served
    tools = {tool.name: tool for tool in portal.call(session.list_tools).tools}
    assert sorted(tools) == ["divide", "dump", "nothing", "read_note", "sleep"]
    read_note = tools["read_note"]
    assert read_note.description == "Read the first lines of a text file in the workspace."
    assert read_note.input_schema["required"] == ["path"]
    assert read_note.input_schema["properties"]["path"] == {
        "description": "Workspace-relative path of a text file.",
        "title": "Path",
        "type": "string",
    }
    assert read_note.input_schema["properties"]["max_lines"]["default"] == 100
    assert read_note.input_schema["properties"]["max_lines"]["type"] == "integer"


def test_a_call_returns_the_tools_text(served: Served) -> None:
    result = call(served, "read_note", path="notes.txt", max_lines=1)
    assert not result.is_error
    assert text(result) == "revenue 4,512"


def test_a_tool_error_comes_back_as_an_error_result_with_its_message(served: Served) -> None:
    result = call(served, "read_note", path="missing.txt")
    assert result.is_error
    assert text(result) == "'missing.txt' does not exist; list the folder to see what is there"


def test_a_huge_output_is_cut_head_and_tail(served: Served, workspace: Path) -> None:
    full = ProbeApp(workspace).dump(100_000)
    result = call(served, "dump", size=100_000)
    assert not result.is_error
    body = text(result)
    assert body.startswith(full[:100]) and body.endswith(full[-100:])
    assert "characters cut of 100,000" in body
    assert len(body) < OUTPUT_LIMIT + 200


def test_a_slow_tool_times_out_with_a_tool_error(served: Served) -> None:
    result = call(served, "sleep", seconds=10)
    assert result.is_error
    assert text(result) == "sleep timed out after 0.5 s; try a smaller range"


def test_an_exception_is_an_error_result_and_the_server_stays_up(served: Served) -> None:
    result = call(served, "divide", a=1, b=0)
    assert result.is_error
    assert text(result) == "divide failed: ZeroDivisionError: division by zero"
    assert text(call(served, "divide", a=6, b=3)) == "2.0"


def test_an_empty_result_is_never_passed_on(served: Served) -> None:
    result = call(served, "nothing")
    assert not result.is_error
    assert text(result) == "nothing returned no output"


def test_one_app_keeps_method_names_several_apps_get_prefixed_names(tmp_path: Path) -> None:
    class NotesApp(ProbeApp):
        pass

    def names(apps: dict[str, type]) -> list[str]:
        server = build_server(tmp_path, apps)
        return sorted(tool.name for tool in anyio.run(server.list_tools))

    assert names({"probe": ProbeApp})[:2] == ["divide", "dump"]
    assert names({"probe": ProbeApp, "notes": NotesApp})[:3] == [
        "notes_divide", "notes_dump", "notes_nothing"
    ]


def test_apps_that_break_the_tool_contract_fail_when_the_server_is_built() -> None:
    class Undocumented:
        def __init__(self, root: Path) -> None: ...

        def look(self) -> str:
            return "x"

    class ReturnsDict:
        def __init__(self, root: Path) -> None: ...

        def look(self) -> dict[str, int]:
            """Look."""
            return {}

    class Untyped:
        def __init__(self, root: Path) -> None: ...

        def look(self, where) -> str:  # type: ignore[no-untyped-def]
            """Look."""
            return where

    with pytest.raises(ToolDefinitionError, match="undocumented.look has no docstring"):
        prepare_server({"undocumented": Undocumented})
    with pytest.raises(ToolDefinitionError, match="returns_dict.look must be annotated '-> str'"):
        prepare_server({"returns_dict": ReturnsDict})
    with pytest.raises(ToolDefinitionError, match="parameter 'where' has no type"):
        prepare_server({"untyped": Untyped})


def test_load_apps_resolves_custom_classes_and_refuses_unknown_names() -> None:
    assert load_apps(["test_tools_server:ProbeApp"]) == {"probe": ProbeApp}
    assert load_apps(["notes=test_tools_server:ProbeApp"]) == {"notes": ProbeApp}
    with pytest.raises(LookupError, match="cannot import app"):
        load_apps(["test_tools_server:Missing"])


def test_the_registered_apps_follow_the_tool_contract(tmp_path: Path) -> None:
    from kwrl.tools.apps import APPS

    assert load_apps(["all"]) == APPS
    server = build_server(tmp_path)  # every app of a world on one endpoint
    names = [tool.name for tool in anyio.run(server.list_tools)]
    assert {name.split("_", 1)[0] for name in names} == set(APPS)
    assert all(tool.description for tool in anyio.run(server.list_tools))


def test_serve_refuses_an_unknown_app_or_a_missing_root(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["mcp", "serve", "--app", "nope", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown app 'nope'; known: all, calendar, chat, docs" in result.output
    result = runner.invoke(app, ["mcp", "serve", "--app", "nope:Nope", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "cannot import app 'nope:Nope'" in result.output
    result = runner.invoke(
        app, ["mcp", "serve", "--app", "test_tools_server:ProbeApp", "--root", "/no/such/dir"]
    )
    assert result.exit_code == 2
    assert "workspace root not found: /no/such/dir" in result.output
