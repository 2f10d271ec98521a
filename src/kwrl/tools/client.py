"""The harness side of a trial's tool server: an MCP session over a socket, and a client that
survives one crash.

`socket_transport` is the SDK's stdio client transport with the subprocess taken out: the same
newline-delimited JSON-RPC framing, the same pair of in-memory streams handed to
`mcp.ClientSession`, but over a connected Unix socket whose other end a forked tool-server
process serves with the SDK's own stdio server (see `kwrl.tools.host`). Reading and writing are
plain async socket I/O, so a hundred trials on one event loop cost no threads.

`ToolClient` is what an agent loop holds. It starts a server from a `ToolHost`, keeps one
session open in a background task (so a caller may wrap any call in its own timeout without
tangling cancel scopes), and turns every failure into data:
- the tool's own errors and timeouts come back as error results from the server;
- the server process dying mid-call (or not answering within the call's timeout) becomes an
  error result, "tool server crashed; it was restarted, retry the call", and the server is
  restarted once; a second crash raises `ToolServerCrashed`, which the trial layer records as
  stop reason `tool_error`, boundary `tool`, masked from training.
Every wait is bounded, and leaving the client (normally, on error or cancelled) stops the
server's whole process group.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession, MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    TextContent,
    Tool,
    jsonrpc_message_adapter,
)

from kwrl.tools.truncate import DEFAULT_LIMIT
from kwrl.types import ToolResult

if TYPE_CHECKING:
    from kwrl.tools.host import ToolHost, ToolServerHandle

logger = logging.getLogger(__name__)

TransportStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]
"""What `mcp.ClientSession` reads from and writes to, as every SDK client transport yields."""

CRASH_MESSAGE = "tool server crashed; it was restarted, retry the call"
HUNG_MESSAGE = "tool server stopped answering; it was restarted, retry the call"
DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""Starting a server and answering `initialize`: milliseconds when healthy."""
CALL_MARGIN_S = 10.0
"""Extra time a call gets beyond the server's own tool timeout before the server counts as hung."""
STOP_TIMEOUT_S = 5.0


class ToolHostError(RuntimeError):
    """A tool server could not be started or connected to (a system failure, not the model's)."""


class ToolServerCrashed(ToolHostError):
    """The tool server crashed again after its one restart, or could not be restarted."""


@asynccontextmanager
async def socket_transport(sock: socket.socket) -> AsyncIterator[TransportStreams]:
    """Read and write streams for `mcp.ClientSession` over a connected stream socket.

    Takes ownership of `sock` and closes it on exit, which the server reads as end of input.
    """
    stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def receive_lines() -> None:
        buffer = b""
        async with read_writer:
            try:
                async for chunk in stream:
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if line.strip():
                            await read_writer.send(_parse_line(line))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return  # the session sees the end of the read stream as a closed connection

    async def send_lines() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stream.send(line.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # a request must not wait for an answer that cannot come

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive_lines)
        tg.start_soon(send_lines)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                write_stream.close()
                read_stream.close()
                await stream.aclose()
            tg.cancel_scope.cancel()


def _parse_line(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc  # handed to the session as a value, as the SDK's stdio client does


@asynccontextmanager
async def open_session(
    sock: socket.socket,
    *,
    initialize_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    read_timeout_s: float | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized `mcp.ClientSession` over `sock` (owned and closed on exit).

    Raises ToolHostError if the server does not answer `initialize` in time or hangs up first.
    """
    async with (
        socket_transport(sock) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, read_timeout_seconds=read_timeout_s) as session,
    ):
        try:
            with anyio.fail_after(initialize_timeout_s):
                await session.initialize()
        except TimeoutError:
            raise ToolHostError(
                f"tool server did not answer initialize within {initialize_timeout_s:g} s"
            ) from None
        except MCPError as exc:
            raise ToolHostError(f"tool server failed during initialize: {exc}") from exc
        yield session


def result_text(result: CallToolResult) -> str:
    """The text of a tool result; never empty."""
    parts = [
        block.text if isinstance(block, TextContent) else f"[{block.type} content]"
        for block in result.content
    ]
    return "\n".join(parts) or "(no output)"


class ToolClient:
    """One trial's tools: `async with ToolClient(host, root) as tools: await tools.call_tool(...)`.

    Enter and leave it in one task (an agent loop); calls may run concurrently. `restarts`
    counts crash restarts (at most `max_restarts`, default 1); `tools` lists the server's tools.
    """

    def __init__(
        self,
        host: ToolHost,
        root: Path,
        apps: Sequence[str] | Mapping[str, type] | None = None,
        *,
        tool_timeout_s: float = 60.0,
        output_limit: int = DEFAULT_LIMIT,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_restarts: int = 1,
        call_margin_s: float = CALL_MARGIN_S,
    ) -> None:
        self._start = partial(
            host.start, Path(root), apps, tool_timeout_s=tool_timeout_s, output_limit=output_limit
        )
        self._call_timeout_s = tool_timeout_s + call_margin_s
        self._connect_timeout_s = connect_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self.tools: list[Tool] = []
        self.handle: ToolServerHandle | None = None
        self._session: ClientSession | None = None
        self._release: anyio.Event | None = None
        self._released: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._restart_lock = anyio.Lock()

    async def __aenter__(self) -> ToolClient:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._connect()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, call_id: str = ""
    ) -> ToolResult:
        """Call a tool; every outcome but a second crash is a ToolResult (errors flagged)."""
        session = self._session
        if session is None:
            raise ToolHostError("the tool client is not open")
        try:
            result = await session.call_tool(
                name, dict(arguments or {}), read_timeout_seconds=self._call_timeout_s
            )
        except MCPError as exc:
            if exc.error.code == REQUEST_TIMEOUT:
                reason = f"no answer within {self._call_timeout_s:g} s"
                return await self._restart(session, reason, HUNG_MESSAGE, call_id)
            if exc.error.code == CONNECTION_CLOSED:
                return await self._restart(session, "connection closed", CRASH_MESSAGE, call_id)
            return ToolResult(call_id, f"{name} failed: {exc.error.message}", is_error=True)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return await self._restart(session, reason, CRASH_MESSAGE, call_id)
        return ToolResult(call_id, result_text(result), bool(result.is_error))

    async def _restart(
        self, failed: ClientSession, reason: str, message: str, call_id: str
    ) -> ToolResult:
        """Replace the failed server once; concurrent calls that saw the same failure share it."""
        async with self._restart_lock:
            if self._session is not failed and self._session is not None:
                return ToolResult(call_id, message, is_error=True)  # already replaced
            return await self._replace(reason, message, call_id)

    async def _replace(self, reason: str, message: str, call_id: str) -> ToolResult:
        """Stop the failed server; start a new one unless the restarts are used up."""
        await self._disconnect()
        if self.restarts >= self.max_restarts:
            raise ToolServerCrashed(f"tool server failed after {self.restarts} restarts: {reason}")
        self.restarts += 1
        try:
            await self._connect()
        except Exception as exc:
            failure = f"tool server failed ({reason}) and did not restart: {exc}"
            raise ToolServerCrashed(failure) from exc
        return ToolResult(call_id, message, is_error=True)

    async def _connect(self) -> None:
        """Start a server and open its session in a background task; bounded."""
        assert self._tg is not None
        with anyio.CancelScope(shield=True):  # a handle returned by start must never be lost
            handle = await anyio.to_thread.run_sync(self._start)  # bounded by the host
        self.handle = handle
        release, released = anyio.Event(), anyio.Event()

        async def hold(*, task_status: anyio.abc.TaskStatus[ClientSession]) -> None:
            started = False
            try:
                async with handle.session(
                    initialize_timeout_s=self._connect_timeout_s,
                    read_timeout_s=max(self._call_timeout_s, self._connect_timeout_s),
                ) as session:
                    task_status.started(session)
                    started = True
                    await release.wait()
            except Exception as exc:
                if not started:
                    raise
                # After start, raising here would cancel the caller's task (it runs inside
                # this task group's scope); the crash shows up on the next call instead.
                logger.debug("tool session ended with %s: %s", type(exc).__name__, exc)
            finally:
                released.set()

        self._release, self._released = release, released
        self._session = await self._tg.start(hold)
        self.tools = (await self._session.list_tools()).tools

    async def _disconnect(self) -> None:
        """End the session and stop the server's process group, even when cancelled."""
        with anyio.CancelScope(shield=True):
            self._session = None
            if self._release is not None and self._released is not None:
                self._release.set()
                with anyio.move_on_after(STOP_TIMEOUT_S):
                    await self._released.wait()
            self._release = self._released = None
            if self.handle is not None:
                await self.handle.aclose()

    async def _close(self) -> None:
        """Stop the server, then unwind the task group without handing it the caller's error.

        anyio would wrap that error in an ExceptionGroup; the caller should see its own
        ToolServerCrashed (or cancellation) unchanged. The only task in the group is the
        session holder, which never raises once started, so nothing is lost.
        """
        try:
            await self._disconnect()
        finally:
            tg, self._tg = self._tg, None
            if tg is not None:
                tg.cancel_scope.cancel()
                tg.cancel_scope.shield = True  # its own scope: a new one would break LIFO exit
                await tg.__aexit__(None, None, None)
