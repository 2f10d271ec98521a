"""A trial with MCP tool servers: a crash is a tool error and one restart; a second crash ends
the trial as `error` at the `tool` boundary (masked, never a 0); nothing is left running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_tools_host import APPS, PRELOAD

from kwrl.sandbox.trial import run_trial
from kwrl.tools.client import CRASH_MESSAGE, ToolServerCrashed
from kwrl.tools.host import ToolHost
from kwrl.tools.services import McpServices
from kwrl.types import (
    AgentOutcome,
    Criterion,
    CriterionKind,
    Domain,
    ErrorBoundary,
    StopReason,
    Task,
    TrialStatus,
)
from kwrl.worlds.taskdir import TaskSpec, write_task


@pytest.fixture(scope="module")
def host():
    with ToolHost(preload=PRELOAD) as tool_host:
        yield tool_host


def make_task(root: Path) -> Path:
    world = root / "worlds" / "w1"
    (world / "files").mkdir(parents=True)
    (world / "files" / "notes.txt").write_text("revenue 4,512\n")
    rubric = (Criterion("c1", CriterionKind.ANSWER_NUMBER, "States 4,512", 1.0,
                        {"value": 4512}),)
    spec = TaskSpec("t1", "What was revenue?", rubric, Domain.BANKING, 1, "test.read", "w1",
                    "4,512")
    return write_task(spec, root / "tasks", world)


class CrashingAgent:
    """Crashes the tool server `crashes` times, then reads the answer through the tools."""

    name = "crashing"

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.results: list = []
        self.pids: list[int] = []

    def run(self, task: Task, workspace: Path, tools=None) -> AgentOutcome:
        return asyncio.run(self._run(tools))

    async def _run(self, tools) -> AgentOutcome:
        try:
            async with tools.client() as client:
                for _ in range(self.crashes):
                    self.pids.append(client.handle.pid)
                    self.results.append(await client.call_tool("crash"))
                notes = await client.call_tool("read", {"path": "notes.txt"})
        except ToolServerCrashed:
            return AgentOutcome("", StopReason.TOOL_ERROR)
        return AgentOutcome(notes.content, StopReason.ANSWERED)


def test_one_crash_is_a_tool_error_and_the_restarted_server_answers(host, tmp_path) -> None:
    agent = CrashingAgent(crashes=1)
    trial = run_trial(make_task(tmp_path), agent, services=McpServices(host, apps=APPS))
    assert agent.results[0].is_error and agent.results[0].content == CRASH_MESSAGE
    assert trial.status is TrialStatus.OK and trial.grade.score == 1.0


def test_a_second_crash_ends_the_trial_as_a_masked_tool_error(host, tmp_path) -> None:
    agent = CrashingAgent(crashes=2)
    trial = run_trial(make_task(tmp_path), agent, services=McpServices(host, apps=APPS))
    assert trial.status is TrialStatus.ERROR and trial.grade is None
    assert trial.stop_reason is StopReason.TOOL_ERROR
    assert trial.error_boundary is ErrorBoundary.TOOL


def test_tool_servers_are_gone_after_the_trial(host, tmp_path) -> None:
    class Watching(CrashingAgent):
        def run(self, task, workspace, tools=None):
            outcome = super().run(task, workspace, tools)
            self.tools = tools
            return outcome

    agent = Watching(crashes=0)
    trial = run_trial(make_task(tmp_path), agent, services=McpServices(host, apps=APPS))
    assert trial.status is TrialStatus.OK
    assert agent.tools.handles and not any(h.alive for h in agent.tools.handles)


def test_an_agent_that_hangs_past_its_timeout_still_gets_its_servers_stopped(
    host, tmp_path
) -> None:
    import threading

    release = threading.Event()

    class Hanging:
        name = "hanging"

        def run(self, task, workspace, tools=None):
            self.tools = tools
            release.wait(timeout=30)
            return AgentOutcome("late", StopReason.ANSWERED)

    task_dir = make_task(tmp_path)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 600.0", "timeout_sec = 1.0", 1))
    agent = Hanging()
    try:
        trial = run_trial(task_dir, agent, services=McpServices(host, apps=APPS))
    finally:
        release.set()
    assert trial.status is TrialStatus.ERROR and trial.stop_reason is StopReason.TIMEOUT
    assert agent.tools.handles and not any(h.alive for h in agent.tools.handles)
