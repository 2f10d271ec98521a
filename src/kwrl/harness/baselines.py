"""Two reference agents that bracket every score: the oracle (1.0) and the null agent (0.0).

Every grader must give the oracle full marks and an empty answer nothing (DESIGN.md). Running
both over a split checks the tasks, the graders and the trial machinery end to end before any
model is involved. Model agents plug in through the same `kwrl.sandbox.trial.Agent` protocol.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from kwrl.tools.client import ToolServerCrashed
from kwrl.types import AgentOutcome, Message, StopReason, Task, ToolCall
from kwrl.worlds.taskdir import load_plan


class MissingSolutionError(FileNotFoundError):
    """The task ships no oracle solution, so the oracle agent cannot answer it."""


class OracleAgent:
    """Applies the task's `solution/`: copies `solution/files/` in, answers `solution/answer.md`.

    It does what `solution/solve.sh` does, in process, so that a run needs no shell.
    """

    name = "oracle"

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        solution = task.task_dir / "solution"
        answer_path = solution / "answer.md"
        if not answer_path.is_file():
            raise MissingSolutionError(f"task {task.task_id} has no oracle answer: {answer_path}")
        files = solution / "files"
        if files.is_dir():
            shutil.copytree(files, workspace, dirs_exist_ok=True)
        return AgentOutcome(answer=answer_path.read_text(), stop_reason=StopReason.ANSWERED)


class NullAgent:
    """Answers nothing and edits nothing: the floor every grader must score zero."""

    name = "null"

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        return AgentOutcome(answer="", stop_reason=StopReason.ANSWERED)


class PlanFailed(RuntimeError):
    """A planned call returned a tool error: the plan (or a tool) is broken."""


class PlanAgent:
    """Follows the oracle's tool-call plan (`solution/plan.json`) through the trial's MCP servers.

    It is the oracle acting the way a model must: every value reaches the answer and every edit
    reaches the workspace through real tool calls, so a plan that scores 1.0 proves the tools can
    solve the task, and its conversation is a demonstration to fine-tune on. Needs the trial to
    run with `kwrl.tools.services.McpServices`.
    """

    name = "plan"

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        if tools is None or not hasattr(tools, "client"):
            raise RuntimeError("the plan agent needs the trial's MCP tools (McpServices)")
        calls, answer = load_plan(task.task_dir)
        return asyncio.run(self._follow(task, calls, answer, tools))

    async def _follow(self, task: Task, calls, answer: str, tools) -> AgentOutcome:
        messages = [Message("user", task.instruction)]
        try:
            async with tools.client() as client:
                for i, planned in enumerate(calls):
                    call = ToolCall(f"call{i}", planned.tool, dict(planned.arguments))
                    result = await client.call_tool(call.name, call.arguments, call.id)
                    if result.is_error:
                        raise PlanFailed(f"call {i} {call.name}: {result.content}")
                    messages.append(Message("assistant", "", (call,)))
                    messages.append(Message("tool", result.content, tool_call_id=call.id))
        except ToolServerCrashed as exc:
            messages.append(Message("tool", f"tool server crashed twice: {exc}"))
            return AgentOutcome("", StopReason.TOOL_ERROR, tuple(messages))
        messages.append(Message("assistant", answer))
        return AgentOutcome(answer, StopReason.ANSWERED, tuple(messages))
