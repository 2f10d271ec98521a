"""Two reference agents that bracket every score: the oracle (1.0) and the null agent (0.0).

Every grader must give the oracle full marks and an empty answer nothing (DESIGN.md). Running
both over a split checks the tasks, the graders and the trial machinery end to end before any
model is involved. Model agents plug in through the same `kwrl.sandbox.trial.Agent` protocol.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kwrl.types import AgentOutcome, StopReason, Task


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
