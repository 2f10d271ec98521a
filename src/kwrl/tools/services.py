"""A trial's MCP tool servers as `kwrl.sandbox.trial.TrialServices`.

The trial owns the servers' lifetime (started in setup, always stopped at teardown, even when
the agent hangs); the agent owns the MCP session, which must live on the agent's own event loop.
`TrialTools` joins the two: the trial starts the first server process at setup (so a failing
start is a `tool` error before the agent runs, and its cost is counted as setup), the agent opens
`tools.client()` on its loop, which adopts that process, and every restart the client makes goes
through `TrialTools` too, so teardown knows every process to stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kwrl.tools.client import ToolClient
from kwrl.tools.host import ToolHost, ToolServerHandle
from kwrl.tools.truncate import DEFAULT_LIMIT
from kwrl.types import Task

AppSpec = Sequence[str] | Mapping[str, type] | None


class TrialTools:
    """One trial's tool servers; the handle an agent receives as `tools`."""

    def __init__(self, host: ToolHost, root: Path, apps: AppSpec, tool_timeout_s: float,
                 output_limit: int) -> None:
        self.host, self.root, self.apps = host, Path(root), apps
        self.tool_timeout_s, self.output_limit = tool_timeout_s, output_limit
        self.handles: list[ToolServerHandle] = []
        self._adoptable: ToolServerHandle | None = None

    def prestart(self) -> None:
        self._adoptable = self.start(self.root, self.apps, tool_timeout_s=self.tool_timeout_s,
                                     output_limit=self.output_limit)

    def start(self, root: Path, apps: AppSpec = None, *, tool_timeout_s: float,
              output_limit: int) -> ToolServerHandle:
        """The `ToolHost.start` a ToolClient calls: first the pre-started server, then new ones."""
        if self._adoptable is not None:
            handle, self._adoptable = self._adoptable, None
            return handle
        handle = self.host.start(root, apps, tool_timeout_s=tool_timeout_s,
                                 output_limit=output_limit)
        self.handles.append(handle)
        return handle

    def client(self, **kwargs: Any) -> ToolClient:
        """An MCP client for this trial (`async with tools.client() as client: ...`)."""
        host: Any = self  # quacks like ToolHost: ToolClient only calls `start`
        return ToolClient(host, self.root, self.apps, tool_timeout_s=self.tool_timeout_s,
                          output_limit=self.output_limit, **kwargs)

    def stop(self) -> None:
        for handle in self.handles:
            handle.stop()


class McpServices:
    """Start each trial's tool servers from one warm ToolHost (see `kwrl.tools.host`)."""

    def __init__(self, host: ToolHost, apps: AppSpec = None, tool_timeout_s: float = 60.0,
                 output_limit: int = DEFAULT_LIMIT) -> None:
        self.host, self.apps = host, apps
        self.tool_timeout_s, self.output_limit = tool_timeout_s, output_limit

    def start(self, task: Task, workspace: Path) -> TrialTools:
        timeout = min(self.tool_timeout_s, task.timeouts.tool_sec)
        tools = TrialTools(self.host, workspace, self.apps, timeout, self.output_limit)
        tools.prestart()
        return tools

    def stop(self, handle: TrialTools) -> None:
        handle.stop()
