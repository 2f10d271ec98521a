"""One task attempted once: load, set up a workspace, run the agent, grade, tear down.

A trial fails as data. Whatever goes wrong is caught at the stage where it happened and recorded
on the TrialResult as status `error` with the boundary to blame, so that one broken task, agent
or grader never stops an evaluation or a training run:

    stage     failure                              boundary
    load      TaskFormatError (or unreadable dir)  task
    setup     the workspace cannot be created      sandbox
    setup     the world's before-snapshot fails    grader
    agent     exception, or past agent_sec         harness (stop reason `timeout` for the latter)
    agent     the agent reports a system stop      engine / tool / harness (see _SYSTEM_STOPS)
    grade     GraderError, any exception, timeout  grader
    teardown  the workspace cannot be removed      sandbox

Errored trials carry no grade: they are masked from scores and from training, never scored 0.

Timeouts. In-process agents run in a daemon worker thread; after `task.timeouts.agent_sec` the
trial stops waiting and records a timeout. Python cannot kill a thread, so a hung agent keeps
running in the background until it returns on its own (its workspace is already gone). A later
issue replaces this with one process (group) per agent loop that is killed on timeout; the
grader gets the same treatment with `verifier_sec`.

The before-snapshot of a world is identical for every trial of that world, so callers pass a
`before_cache` (world dir -> Snapshot) and it is taken once per world.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from kwrl.graders import Snapshot, grade_task, take_snapshot
from kwrl.graders.verify import grade_to_json, write_json
from kwrl.sandbox.workspace import Workspace
from kwrl.types import (
    AgentOutcome,
    ErrorBoundary,
    Grade,
    StopReason,
    Task,
    TrialResult,
    TrialStatus,
)
from kwrl.worlds.taskdir import load_task

T = TypeVar("T")

SnapshotCache = MutableMapping[Path, Snapshot]

_SYSTEM_STOPS: dict[StopReason, ErrorBoundary] = {
    StopReason.ENGINE_ERROR: ErrorBoundary.ENGINE,
    StopReason.TOOL_ERROR: ErrorBoundary.TOOL,
    StopReason.ERROR: ErrorBoundary.HARNESS,
    StopReason.TIMEOUT: ErrorBoundary.HARNESS,
}
"""Stop reasons an agent may report that mean the system failed, not the model: masked.
Model failures (max turns, context overflow, parse errors) are graded like any answer."""


@runtime_checkable
class Agent(Protocol):
    """Anything that acts on a workspace and returns a final answer."""

    name: str

    def run(self, task: Task, workspace: Path, tools: Any = None) -> AgentOutcome:
        """Work in `workspace` (a private copy of the world's files) and answer `task`.

        `tools` is whatever the trial's services started (e.g. a client of this trial's MCP
        servers), or None when the trial runs without services.
        """
        ...


class TrialServices(Protocol):
    """Processes a trial runs beside its agent, such as its tool servers.

    The sandbox does not know what they are (tools sit above it in the layers): it starts them
    after the workspace exists, hands their handle to the agent, and stops them before the
    workspace is removed, whatever happened in between.
    """

    def start(self, task: Task, workspace: Path) -> Any:
        """Start this trial's services on `workspace`; return the handle the agent receives."""
        ...

    def stop(self, handle: Any) -> None:
        """Stop them and reap every process they started."""
        ...


def run_trial(
    task_or_dir: Task | Path,
    agent: Agent,
    before_cache: SnapshotCache | None = None,
    *,
    logs_dir: Path | None = None,
    services: TrialServices | None = None,
) -> TrialResult:
    """Attempt one task once with `agent`; never raises for a failure of the trial itself.

    `before_cache` maps a world dir to its before-snapshot (filled on first use). `logs_dir`, if
    given, keeps `agent/answer.md` and `verifier/reward.json` after the workspace is removed.
    `services` (tool servers) are started on the workspace and always stopped at teardown.
    """
    try:
        task = task_or_dir if isinstance(task_or_dir, Task) else load_task(Path(task_or_dir))
    except Exception as exc:
        return TrialResult(
            task_id=Path(task_or_dir).name,
            status=TrialStatus.ERROR,
            grade=None,
            stop_reason=StopReason.ERROR,
            error_boundary=ErrorBoundary.TASK,
            error=_describe(exc),
        )
    timings: dict[str, float] = {}
    workspace = Workspace(task.world_dir, logs_dir=logs_dir)
    running = _Running(services)
    try:
        result = _run_stages(task, agent, workspace, before_cache, timings, running)
    except Exception as exc:  # a bug in this module must still not stop the run
        result = _error(task, ErrorBoundary.HARNESS, f"trial runner: {_describe(exc)}")
    finally:
        with _stage(timings, "teardown"):
            teardown_error = running.stop(task.timeouts.teardown_sec) or _close(workspace)
    if teardown_error is not None and result.status is TrialStatus.OK:
        # A workspace left behind breaks isolation for the run: mask rather than trust it.
        result = _error(
            task, ErrorBoundary.SANDBOX, teardown_error, result.stop_reason, result.answer
        )
    return _with_timings(result, timings)


def _run_stages(
    task: Task,
    agent: Agent,
    workspace: Workspace,
    before_cache: SnapshotCache | None,
    timings: dict[str, float],
    running: _Running,
) -> TrialResult:
    """Setup, agent and grade; returns at the first failing stage."""
    with _stage(timings, "setup"):
        try:
            workspace.open()
        except Exception as exc:
            return _error(task, ErrorBoundary.SANDBOX, _describe(exc))
        try:
            before = _before_snapshot(task, before_cache)
        except Exception as exc:
            return _error(task, ErrorBoundary.GRADER, f"before-snapshot: {_describe(exc)}")
        failure = running.start(task, workspace.path)
        if failure is not None:
            return _error(task, ErrorBoundary.TOOL, f"starting services: {failure}")
    with _stage(timings, "agent"):
        outcome_or_error = _run_agent(task, agent, workspace, running.handle)
    # The agent is done (or given up on): stop its services before grading, so a hung agent's
    # tool processes cannot touch the workspace while it is graded.
    stop_failure = running.stop(task.timeouts.teardown_sec)
    if isinstance(outcome_or_error, TrialResult):
        return outcome_or_error
    outcome = outcome_or_error
    try:
        (workspace.logs / "agent" / "answer.md").write_text(outcome.answer)
    except OSError as exc:
        return _error(
            task,
            ErrorBoundary.SANDBOX,
            f"writing the answer: {_describe(exc)}",
            outcome.stop_reason,
            outcome.answer,
        )
    if stop_failure is not None:
        return _error(task, ErrorBoundary.TOOL, f"stopping services: {stop_failure}",
                      outcome.stop_reason, outcome.answer)
    boundary = _SYSTEM_STOPS.get(outcome.stop_reason)
    if boundary is not None:
        message = f"agent {agent.name} stopped with {outcome.stop_reason.value}"
        return _error(task, boundary, message, outcome.stop_reason, outcome.answer)
    with _stage(timings, "grade"):
        return _grade(task, outcome, before, workspace)


def _run_agent(
    task: Task, agent: Agent, workspace: Workspace, tools: Any
) -> AgentOutcome | TrialResult:
    """Run the agent in a worker thread, bounded by the task's agent timeout."""
    limit = task.timeouts.agent_sec
    call = _call_with_timeout(
        lambda: agent.run(task, workspace.path, tools), limit, f"agent-{task.task_id}"
    )
    if call.timed_out:
        message = f"agent {agent.name} did not finish within {limit:g} s"
        return _error(task, ErrorBoundary.HARNESS, message, StopReason.TIMEOUT)
    if call.error is not None:
        return _error(task, ErrorBoundary.HARNESS, f"agent {agent.name}: {_describe(call.error)}")
    if not isinstance(call.value, AgentOutcome):
        got = type(call.value).__name__
        return _error(
            task, ErrorBoundary.HARNESS, f"agent {agent.name} returned {got}, not an AgentOutcome"
        )
    return call.value


def _grade(
    task: Task, outcome: AgentOutcome, before: Snapshot, workspace: Workspace
) -> TrialResult:
    """Grade the workspace against the world's before-snapshot; any failure is the grader's."""
    answer, stop = outcome.answer, outcome.stop_reason
    limit = task.timeouts.verifier_sec
    call = _call_with_timeout(
        lambda: grade_task(task, outcome.answer, before, workspace.path),
        limit,
        f"grader-{task.task_id}",
    )
    if call.timed_out:
        return _error(
            task, ErrorBoundary.GRADER, f"grading did not finish within {limit:g} s", stop, answer
        )
    if call.error is not None:
        return _error(task, ErrorBoundary.GRADER, _describe(call.error), stop, answer)
    grade = call.value
    if not isinstance(grade, Grade):
        return _error(
            task, ErrorBoundary.GRADER, f"grader returned {type(grade).__name__}", stop, answer
        )
    write_json(workspace.logs / "verifier" / "reward.json", grade_to_json(grade))
    return TrialResult(
        task_id=task.task_id,
        status=TrialStatus.OK,
        grade=grade,
        stop_reason=stop,
        answer=answer,
        trajectory=outcome.trajectory,
        messages=outcome.messages,
        **_task_fields(task),
    )


def _before_snapshot(task: Task, cache: SnapshotCache | None) -> Snapshot:
    """The world's files before any agent touched them; taken once per world when cached."""
    if cache is not None and task.world_dir in cache:
        return cache[task.world_dir]
    snapshot = take_snapshot(task.world_dir / "files")
    if cache is not None:
        cache[task.world_dir] = snapshot
    return snapshot


class _Running:
    """The services of one trial: started at most once, stopped at most once, within timeouts."""

    def __init__(self, services: TrialServices | None) -> None:
        self.services = services
        self.handle: Any = None
        self.started = False

    def start(self, task: Task, workspace: Path) -> str | None:
        if self.services is None:
            return None
        services = self.services
        call = _call_with_timeout(lambda: services.start(task, workspace),
                                  task.timeouts.setup_sec, f"services-{task.task_id}")
        if call.timed_out:
            return f"did not start within {task.timeouts.setup_sec:g} s"
        if call.error is not None:
            return _describe(call.error)
        self.handle, self.started = call.value, True
        return None

    def stop(self, timeout_sec: float) -> str | None:
        if self.services is None or not self.started:
            return None
        services, handle = self.services, self.handle
        self.started = False
        call = _call_with_timeout(lambda: services.stop(handle), timeout_sec, "services-stop")
        if call.timed_out:
            return f"did not stop within {timeout_sec:g} s"
        return None if call.error is None else _describe(call.error)


def _close(workspace: Workspace) -> str | None:
    """Remove the workspace; return what went wrong instead of raising."""
    try:
        workspace.close()
    except Exception as exc:
        return _describe(exc)
    return None


@dataclass
class _Call(Generic[T]):
    value: T | None = None
    error: BaseException | None = None
    timed_out: bool = False


def _call_with_timeout(fn: Callable[[], T], timeout_sec: float, name: str) -> _Call[T]:
    """Run `fn` in a daemon thread and wait at most `timeout_sec` (the thread is not killed)."""
    call: _Call[T] = _Call()

    def target() -> None:
        try:
            call.value = fn()
        except BaseException as exc:  # recorded on the trial, never swallowed
            call.error = exc

    thread = threading.Thread(target=target, name=f"kwrl-{name}", daemon=True)
    thread.start()
    thread.join(timeout_sec)
    if thread.is_alive():
        return _Call(timed_out=True)
    return call


@contextmanager
def _stage(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - start, 6)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _task_fields(task: Task) -> dict[str, Any]:
    return {
        "domain": task.domain.value,
        "tier": task.tier,
        "template": task.template,
        "world_id": task.world_id,
    }


def _error(
    task: Task,
    boundary: ErrorBoundary,
    message: str,
    stop_reason: StopReason = StopReason.ERROR,
    answer: str = "",
) -> TrialResult:
    return TrialResult(
        task_id=task.task_id,
        status=TrialStatus.ERROR,
        grade=None,
        stop_reason=stop_reason,
        answer=answer,
        error_boundary=boundary,
        error=message,
        **_task_fields(task),
    )


def _with_timings(result: TrialResult, timings: dict[str, float]) -> TrialResult:
    ordered = {k: timings[k] for k in ("setup", "agent", "grade", "teardown") if k in timings}
    return replace(result, timings=ordered)
