"""A trial isolates the agent in a private copy of the world, cleans up, and fails as data."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from kwrl.harness.baselines import MissingSolutionError, NullAgent, OracleAgent
from kwrl.sandbox.trial import Agent, run_trial
from kwrl.sandbox.workspace import Workspace
from kwrl.types import (
    AgentOutcome,
    Criterion,
    CriterionKind,
    Domain,
    ErrorBoundary,
    StopReason,
    Task,
    Timeouts,
    TrialStatus,
)
from kwrl.worlds.taskdir import TaskSpec, load_task, write_task

REPORT = "# Annual report\n\nEMEA revenue was $4.5m in 2024.\n"
MEMO = b"# Memo\n\nEMEA revenue: 4.5m.\n"


def make_world(root: Path) -> Path:
    world = root / "worlds" / "w1"
    (world / "files" / "reports").mkdir(parents=True)
    (world / "files" / "reports" / "annual.md").write_text(REPORT)
    (world / "files" / "notes.txt").write_text("call the client on Monday\n")
    return world


def make_task(root: Path, world: Path, task_id: str = "t1", **changes: object) -> Path:
    rubric = (
        Criterion(
            "c1",
            CriterionKind.ANSWER_NUMBER,
            "States EMEA revenue of 4.5m.",
            params={"value": 4.5e6, "rel_tol": 0.005, "abs_tol": 0.0, "unit": ""},
        ),
        Criterion(
            "c2",
            CriterionKind.FILE_CREATED,
            "Writes the memo with the EMEA figure.",
            params={"path": "memo.md", "file_type": "md", "text": [["EMEA"]], "numbers": []},
        ),
    )
    fields: dict[str, object] = dict(
        task_id=task_id,
        instruction="What was EMEA revenue in 2024? Also write it into memo.md.",
        rubric=rubric,
        domain=Domain.CONSULTING,
        tier=1,
        template="test.lookup",
        world_id="w1",
        oracle_answer="EMEA revenue was $4.5m.",
        oracle_files={"memo.md": MEMO},
    )
    fields.update(changes)
    return write_task(TaskSpec(**fields), root / "tasks", world)  # type: ignore[arg-type]


def world_state(world: Path) -> dict[str, bytes]:
    files = world / "files"
    return {str(p.relative_to(files)): p.read_bytes() for p in files.rglob("*") if p.is_file()}


class SpyAgent:
    """Wraps an agent and records what the workspace held when it finished."""

    def __init__(self, inner: Agent) -> None:
        self.inner = inner
        self.name = f"spy-{inner.name}"
        self.workspace: Path | None = None
        self.files_after: dict[str, bytes] = {}

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        self.workspace = workspace
        outcome = self.inner.run(task, workspace)
        self.files_after = {
            str(p.relative_to(workspace)): p.read_bytes()
            for p in workspace.rglob("*")
            if p.is_file()
        }
        return outcome


class RaisingAgent:
    name = "raising"

    def __init__(self) -> None:
        self.workspace: Path | None = None

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        self.workspace = workspace
        raise RuntimeError("the agent fell over")


class VandalAgent:
    """Edits in place, truncates, deletes and creates: none of it may reach the world."""

    name = "vandal"

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        with (workspace / "reports" / "annual.md").open("r+b") as handle:  # same inode
            handle.write(b"XXXX")
        (workspace / "notes.txt").unlink()
        (workspace / "reports" / "new.md").write_text("invented")
        (workspace / "reports").chmod(0o500)  # read-only dirs must not block teardown
        return AgentOutcome(answer="no idea", stop_reason=StopReason.ANSWERED)


class HangingAgent:
    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        self.release.wait(timeout=30)
        return AgentOutcome(answer="too late", stop_reason=StopReason.ANSWERED)


class EngineFailingAgent:
    name = "engine-failing"

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        return AgentOutcome(answer="", stop_reason=StopReason.ENGINE_ERROR)


def test_oracle_copies_its_files_into_the_workspace_and_answers(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, make_world(tmp_path))
    spy = SpyAgent(OracleAgent())
    logs = tmp_path / "logs"
    trial = run_trial(task_dir, spy, logs_dir=logs)
    assert spy.files_after["memo.md"] == MEMO
    assert spy.files_after["reports/annual.md"] == REPORT.encode()
    assert (logs / "agent" / "answer.md").read_text() == "EMEA revenue was $4.5m."
    assert trial.task_id == "t1" and trial.domain == "consulting" and trial.world_id == "w1"


def test_oracle_gets_full_marks_and_null_agent_none(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, make_world(tmp_path))
    logs = tmp_path / "logs"
    oracle = run_trial(task_dir, OracleAgent(), logs_dir=logs)
    assert oracle.status is TrialStatus.OK, oracle.error
    assert oracle.grade is not None and oracle.grade.score == 1.0 and oracle.grade.passed
    assert oracle.answer == "EMEA revenue was $4.5m."
    reward = json.loads((logs / "verifier" / "reward.json").read_text())
    assert reward["reward"] == 1.0 and len(reward["criteria"]) == 2
    null = run_trial(task_dir, NullAgent())
    assert null.status is TrialStatus.OK, null.error
    assert null.grade is not None and null.grade.score == 0.0 and not null.grade.passed
    assert set(oracle.timings) == {"setup", "agent", "grade", "teardown"}


def test_the_workspace_is_removed_after_the_trial(tmp_path: Path) -> None:
    spy = SpyAgent(NullAgent())
    run_trial(make_task(tmp_path, make_world(tmp_path)), spy)
    assert spy.workspace is not None and not spy.workspace.parent.exists()


def test_the_workspace_is_removed_when_the_agent_raises(tmp_path: Path) -> None:
    agent = RaisingAgent()
    trial = run_trial(make_task(tmp_path, make_world(tmp_path)), agent)
    assert trial.status is TrialStatus.ERROR
    assert trial.error_boundary is ErrorBoundary.HARNESS
    assert "the agent fell over" in (trial.error or "")
    assert trial.grade is None
    assert agent.workspace is not None and not agent.workspace.parent.exists()


def test_an_agent_writing_into_its_workspace_never_changes_the_world(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    before = world_state(world)
    spy = SpyAgent(VandalAgent())
    run_trial(make_task(tmp_path, world), spy)
    assert spy.files_after["reports/annual.md"].startswith(b"XXXX")
    assert world_state(world) == before
    assert spy.workspace is not None and not spy.workspace.parent.exists()


def test_workspace_is_removed_when_the_body_raises(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    with pytest.raises(KeyError), Workspace(world) as ws:
        root = ws.root
        assert (ws.path / "notes.txt").is_file() and (ws.logs / "agent").is_dir()
        assert ws.logs.parent == ws.path.parent
        raise KeyError("boom")
    assert root is not None and not root.exists()


def _bad_toml(task_dir: Path) -> str:
    (task_dir / "task.toml").write_text("[metadata\ndomain = ")
    return "task.toml"


def _no_instruction(task_dir: Path) -> str:
    (task_dir / "instruction.md").unlink()
    return "instruction.md"


def _no_world(task_dir: Path) -> str:
    (task_dir / "environment" / "world.toml").write_text('world_id = "w1"\npath = "../nowhere"\n')
    return "world.toml"


def _unknown_kind(task_dir: Path) -> str:
    path = task_dir / "tests" / "rubric.json"
    rubric = json.loads(path.read_text())
    rubric["criteria"][0]["kind"] = "vibes"
    path.write_text(json.dumps(rubric))
    return "rubric.json"


@pytest.mark.parametrize("corrupt", [_bad_toml, _no_instruction, _no_world, _unknown_kind])
def test_a_malformed_task_becomes_an_error_trial_naming_the_file(tmp_path: Path, corrupt) -> None:
    task_dir = make_task(tmp_path, make_world(tmp_path))
    file_name = corrupt(task_dir)
    trial = run_trial(task_dir, OracleAgent())
    assert trial.status is TrialStatus.ERROR
    assert trial.error_boundary is ErrorBoundary.TASK
    assert trial.task_id == "t1"
    assert file_name in (trial.error or "")


def test_an_agent_hanging_past_the_timeout_is_an_error_with_stop_reason_timeout(
    tmp_path: Path,
) -> None:
    task_dir = make_task(tmp_path, make_world(tmp_path), timeouts=Timeouts(agent_sec=0.2))
    agent = HangingAgent()
    try:
        trial = run_trial(task_dir, agent)
    finally:
        agent.release.set()
    assert trial.status is TrialStatus.ERROR
    assert trial.stop_reason is StopReason.TIMEOUT
    assert trial.error_boundary is ErrorBoundary.HARNESS
    assert 0.2 <= trial.timings["agent"] < 5


def test_an_agent_reporting_an_engine_failure_is_masked_not_scored(tmp_path: Path) -> None:
    trial = run_trial(make_task(tmp_path, make_world(tmp_path)), EngineFailingAgent())
    assert trial.status is TrialStatus.ERROR
    assert trial.error_boundary is ErrorBoundary.ENGINE
    assert trial.grade is None


def test_the_oracle_without_a_solution_fails_clearly(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, make_world(tmp_path))
    (task_dir / "solution" / "answer.md").unlink()
    with pytest.raises(MissingSolutionError, match="answer.md"):
        OracleAgent().run(load_task(task_dir), tmp_path)
    trial = run_trial(task_dir, OracleAgent())
    assert trial.error_boundary is ErrorBoundary.HARNESS and "answer.md" in (trial.error or "")


def test_a_broken_criterion_is_a_grader_error_not_a_zero(tmp_path: Path) -> None:
    """Params without the required 'value' are a grader failure."""
    broken = (Criterion("c1", CriterionKind.ANSWER_NUMBER, "States a number.", params={}),)
    task_dir = make_task(tmp_path, make_world(tmp_path), rubric=broken)
    trial = run_trial(task_dir, OracleAgent())
    assert trial.status is TrialStatus.ERROR
    assert trial.error_boundary is ErrorBoundary.GRADER
    assert trial.grade is None and trial.answer == "EMEA revenue was $4.5m."


def test_the_before_snapshot_is_taken_once_per_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kwrl.sandbox.trial

    world = make_world(tmp_path)
    calls: list[Path] = []
    real = kwrl.sandbox.trial.take_snapshot

    def counting(root: Path):
        calls.append(root)
        return real(root)

    monkeypatch.setattr(kwrl.sandbox.trial, "take_snapshot", counting)
    cache: dict = {}
    for task_id in ("t1", "t2"):
        trial = run_trial(make_task(tmp_path, world, task_id=task_id), OracleAgent(), cache)
        assert trial.status is TrialStatus.OK, trial.error
    assert calls == [world.resolve() / "files"]
    assert list(cache) == [world.resolve()]


class SleeperServices:
    """Real services: one `sleep` process per trial in its own process group."""

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start = fail_start
        self.processes: list = []

    def start(self, task: Task, workspace: Path):
        import subprocess

        if self.fail_start:
            raise OSError("no tool server binary")
        process = subprocess.Popen(["sleep", "60"], cwd=workspace, start_new_session=True)
        self.processes.append(process)
        return process

    def stop(self, handle) -> None:
        handle.kill()
        handle.wait(timeout=5)


class HandleRecordingAgent:
    name = "recording"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.tools: object = None

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        self.tools = tools
        assert tools.poll() is None  # the services run while the agent works
        if self.fail:
            raise RuntimeError("agent crashed mid-trial")
        return AgentOutcome(answer="EMEA revenue was $4.5m.", stop_reason=StopReason.ANSWERED)


@pytest.mark.parametrize("agent_fails", [False, True])
def test_services_start_for_the_agent_and_always_stop(tmp_path: Path, agent_fails: bool) -> None:
    services = SleeperServices()
    agent = HandleRecordingAgent(fail=agent_fails)
    trial = run_trial(make_task(tmp_path, make_world(tmp_path)), agent, services=services)
    assert agent.tools is services.processes[0]
    assert services.processes[0].poll() is not None  # stopped and reaped
    assert trial.status is (TrialStatus.ERROR if agent_fails else TrialStatus.OK)


def test_services_that_fail_to_start_make_a_tool_error_and_the_agent_never_runs(
    tmp_path: Path,
) -> None:
    agent = HandleRecordingAgent()
    trial = run_trial(make_task(tmp_path, make_world(tmp_path)), agent,
                      services=SleeperServices(fail_start=True))
    assert trial.status is TrialStatus.ERROR and trial.error_boundary is ErrorBoundary.TOOL
    assert "no tool server binary" in (trial.error or "")
    assert agent.tools is None
