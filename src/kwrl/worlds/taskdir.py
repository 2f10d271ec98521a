"""Harbor-layout task directories: the contract between task generation, trials and graders.

A split directory holds each world's files once and every task refers to them:

    SPLIT/split.json                      split name, seed, world ids, task ids
    SPLIT/worlds/<world_id>/files/...     the workspace every trial of the world starts from
    SPLIT/worlds/<world_id>/world.json    the hidden fact table (never shown to an agent)
    SPLIT/tasks/<task_id>/instruction.md  what the agent is asked
    SPLIT/tasks/<task_id>/task.toml       metadata and timeouts (Harbor keys where Harbor has them)
    SPLIT/tasks/<task_id>/environment/world.toml   which world, by relative path
    SPLIT/tasks/<task_id>/tests/rubric.json        criteria (hidden from the agent)
    SPLIT/tasks/<task_id>/tests/test.sh            runs the kwrl grader, writes reward.json
    SPLIT/tasks/<task_id>/tests/distractor/        a plausible wrong answer (and files), hidden
    SPLIT/tasks/<task_id>/solution/answer.md       the oracle's final answer
    SPLIT/tasks/<task_id>/solution/files/...       full contents of every file the oracle writes
    SPLIT/tasks/<task_id>/solution/solve.sh        applies the oracle to a workspace
    SPLIT/tasks/<task_id>/solution/plan.json       the oracle as MCP tool calls, and its answer

Loading validates everything and raises TaskFormatError naming the file and the field, so that a
runner can record the task as `error` and go on.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from kwrl.types import Criterion, CriterionKind, Domain, Task, Timeouts

SCHEMA_VERSION = "1.4"
MAX_CRITERIA = 10


class TaskFormatError(ValueError):
    """A task directory is malformed; the message names the file and the field."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


@dataclass(frozen=True)
class PlannedCall:
    """One tool call of an oracle's plan, by its name on the combined MCP endpoint."""

    tool: str
    """e.g. `sheets_search`: app, underscore, tool."""
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class TaskSpec:
    """A generated task before it is written to disk."""

    task_id: str
    instruction: str
    rubric: tuple[Criterion, ...]
    domain: Domain
    tier: int
    template: str
    world_id: str
    oracle_answer: str
    """The final answer the oracle gives."""
    oracle_files: Mapping[str, bytes] = field(default_factory=dict)
    """Workspace-relative path -> full new content, for every file the oracle creates or edits."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    distractor_answer: str = ""
    """A plausible wrong answer (the distractor quarter, the superseded draft), for validation."""
    distractor_files: Mapping[str, bytes] = field(default_factory=dict)
    """Plausible wrong deliverables, like `oracle_files`."""
    oracle_plan: tuple[PlannedCall, ...] = ()
    """The tool calls an agent would make to find the answer and make the edits."""


def criterion_to_dict(criterion: Criterion) -> dict[str, Any]:
    return {
        "id": criterion.id,
        "kind": criterion.kind.value,
        "description": criterion.description,
        "weight": criterion.weight,
        "params": dict(criterion.params),
    }


def criterion_from_dict(raw: Any, where: Path) -> Criterion:
    if not isinstance(raw, dict):
        raise TaskFormatError(where, f"a criterion must be an object, got {type(raw).__name__}")
    for key in ("id", "kind", "description"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise TaskFormatError(where, f"criterion field '{key}' is missing or not a string")
    try:
        kind = CriterionKind(raw["kind"])
    except ValueError:
        known = ", ".join(k.value for k in CriterionKind)
        raise TaskFormatError(
            where, f"criterion '{raw['id']}': unknown kind '{raw['kind']}' (known: {known})"
        ) from None
    weight = raw.get("weight", 1.0)
    if not isinstance(weight, int | float) or isinstance(weight, bool) or weight <= 0:
        raise TaskFormatError(where, f"criterion '{raw['id']}': weight must be a positive number")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise TaskFormatError(where, f"criterion '{raw['id']}': params must be an object")
    return Criterion(raw["id"], kind, raw["description"], float(weight), params)


def _solve_script() -> str:
    return """#!/usr/bin/env bash
# The oracle: copy the solution's files into the workspace and write the final answer.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
workspace="${KWRL_WORKSPACE:-/workspace}"
logs="${KWRL_LOGS:-/logs}"
if [ -d "$here/files" ]; then cp -R "$here/files/." "$workspace/"; fi
mkdir -p "$logs/agent"
cp "$here/answer.md" "$logs/agent/answer.md"
"""


def _test_script() -> str:
    return """#!/usr/bin/env bash
# The verifier: grade the workspace and the agent's answer; write /logs/verifier/reward.json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
workspace="${KWRL_WORKSPACE:-/workspace}"
logs="${KWRL_LOGS:-/logs}"
mkdir -p "$logs/verifier"
exec "${KWRL_PYTHON:-python3}" -m kwrl.graders.verify \\
    --task-dir "$here/.." --workspace "$workspace" \\
    --answer "$logs/agent/answer.md" --out "$logs/verifier/reward.json"
"""


def write_task(spec: TaskSpec, tasks_root: Path, world_dir: Path) -> Path:
    """Write `spec` under `tasks_root/<task_id>` in Harbor's layout; return the directory."""
    task_dir = tasks_root / spec.task_id
    for sub in ("environment", "tests", "solution"):
        (task_dir / sub).mkdir(parents=True, exist_ok=True)
    (task_dir / "instruction.md").write_text(spec.instruction.rstrip() + "\n")
    meta = {
        "schema_version": SCHEMA_VERSION,
        "task": {"name": spec.task_id, "version": "1", "description": spec.template},
        "metadata": {
            "domain": spec.domain.value,
            "tier": spec.tier,
            "template": spec.template,
            "world_id": spec.world_id,
        },
        "agent": {
            "timeout_sec": spec.timeouts.agent_sec,
            "tool_timeout_sec": spec.timeouts.tool_sec,
        },
        "verifier": {"timeout_sec": spec.timeouts.verifier_sec},
        "environment": {
            "setup_timeout_sec": spec.timeouts.setup_sec,
            "teardown_timeout_sec": spec.timeouts.teardown_sec,
            "network_mode": "none",
        },
    }
    (task_dir / "task.toml").write_text(tomli_w.dumps(meta))
    world_ref = {"world_id": spec.world_id, "path": os.path.relpath(world_dir, task_dir)}
    (task_dir / "environment" / "world.toml").write_text(tomli_w.dumps(world_ref))
    rubric = {"criteria": [criterion_to_dict(c) for c in spec.rubric]}
    (task_dir / "tests" / "rubric.json").write_text(json.dumps(rubric, indent=2, sort_keys=True))
    _write_script(task_dir / "tests" / "test.sh", _test_script())
    (task_dir / "solution" / "answer.md").write_text(spec.oracle_answer)
    for rel, content in sorted(spec.oracle_files.items()):
        target = task_dir / "solution" / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    _write_script(task_dir / "solution" / "solve.sh", _solve_script())
    if spec.oracle_plan:
        plan = {"calls": [{"tool": c.tool, "arguments": dict(c.arguments)}
                          for c in spec.oracle_plan], "answer": spec.oracle_answer}
        (task_dir / "solution" / "plan.json").write_text(json.dumps(plan, indent=1))
    _write_distractor(spec, task_dir / "tests" / "distractor")
    return task_dir


def _write_distractor(spec: TaskSpec, root: Path) -> None:
    """Hidden with the tests: what a plausible wrong agent would hand in, to validate graders."""
    if not spec.distractor_answer and not spec.distractor_files:
        return
    root.mkdir(parents=True, exist_ok=True)
    (root / "answer.md").write_text(spec.distractor_answer)
    for rel, content in sorted(spec.distractor_files.items()):
        target = root / "files" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise TaskFormatError(path, "file is missing")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskFormatError(path, f"not valid TOML: {exc}") from None


def _table(doc: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise TaskFormatError(path, f"'{key}' must be a table")
    return value


def _seconds(table: dict[str, Any], key: str, default: float, path: Path, where: str) -> float:
    value = table.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise TaskFormatError(path, f"'{where}.{key}' must be a positive number of seconds")
    return float(value)


def _timeouts(meta: dict[str, Any], path: Path) -> Timeouts:
    agent = _table(meta, "agent", path)
    verifier = _table(meta, "verifier", path)
    env = _table(meta, "environment", path)
    d = Timeouts()
    return Timeouts(
        agent_sec=_seconds(agent, "timeout_sec", d.agent_sec, path, "agent"),
        verifier_sec=_seconds(verifier, "timeout_sec", d.verifier_sec, path, "verifier"),
        setup_sec=_seconds(env, "setup_timeout_sec", d.setup_sec, path, "environment"),
        tool_sec=_seconds(agent, "tool_timeout_sec", d.tool_sec, path, "agent"),
        teardown_sec=_seconds(env, "teardown_timeout_sec", d.teardown_sec, path, "environment"),
    )


def load_rubric(task_dir: Path) -> tuple[Criterion, ...]:
    path = task_dir / "tests" / "rubric.json"
    if not path.is_file():
        raise TaskFormatError(path, "file is missing")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TaskFormatError(path, f"not valid JSON: {exc}") from None
    criteria = raw.get("criteria") if isinstance(raw, dict) else None
    if not isinstance(criteria, list) or not 1 <= len(criteria) <= MAX_CRITERIA:
        raise TaskFormatError(path, f"'criteria' must be a list of 1-{MAX_CRITERIA} criteria")
    rubric = tuple(criterion_from_dict(c, path) for c in criteria)
    ids = [c.id for c in rubric]
    if len(set(ids)) != len(ids):
        raise TaskFormatError(path, f"criterion ids repeat: {ids}")
    return rubric


def load_task(task_dir: Path) -> Task:
    """Read and validate one task directory."""
    task_dir = Path(task_dir)
    if not task_dir.is_dir():
        raise TaskFormatError(task_dir, "task directory is missing")
    instruction_path = task_dir / "instruction.md"
    if not instruction_path.is_file():
        raise TaskFormatError(instruction_path, "file is missing")
    instruction = instruction_path.read_text().strip()
    if not instruction:
        raise TaskFormatError(instruction_path, "instruction is empty")
    toml_path = task_dir / "task.toml"
    meta = _read_toml(toml_path)
    md = _table(meta, "metadata", toml_path)
    try:
        domain = Domain(md.get("domain"))
    except ValueError:
        raise TaskFormatError(toml_path, f"'metadata.domain' is {md.get('domain')!r}") from None
    tier = md.get("tier")
    if tier not in (1, 2, 3, 4):
        raise TaskFormatError(toml_path, f"'metadata.tier' must be 1-4, got {tier!r}")
    for key in ("template", "world_id"):
        if not isinstance(md.get(key), str) or not md[key]:
            raise TaskFormatError(toml_path, f"'metadata.{key}' is missing")
    world_path = task_dir / "environment" / "world.toml"
    world_ref = _read_toml(world_path)
    if not isinstance(world_ref.get("path"), str):
        raise TaskFormatError(world_path, "'path' is missing")
    world_dir = (task_dir / world_ref["path"]).resolve()
    if not (world_dir / "files").is_dir():
        raise TaskFormatError(world_path, f"world files not found at {world_dir / 'files'}")
    return Task(
        task_id=task_dir.name,
        instruction=instruction,
        rubric=load_rubric(task_dir),
        domain=domain,
        tier=tier,
        template=md["template"],
        world_id=md["world_id"],
        world_dir=world_dir,
        task_dir=task_dir.resolve(),
        timeouts=_timeouts(meta, toml_path),
    )


def load_plan(task_dir: Path) -> tuple[tuple[PlannedCall, ...], str]:
    """The oracle's tool-call plan and final answer (`solution/plan.json`)."""
    path = Path(task_dir) / "solution" / "plan.json"
    if not path.is_file():
        raise TaskFormatError(path, "file is missing (this task has no tool-call plan)")
    try:
        raw = json.loads(path.read_text())
        calls = tuple(PlannedCall(c["tool"], c["arguments"]) for c in raw["calls"])
        answer = raw["answer"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise TaskFormatError(path, f"not a plan ({{calls: [{{tool, arguments}}], answer}}): "
                                    f"{exc}") from None
    if not isinstance(answer, str):
        raise TaskFormatError(path, "'answer' must be a string")
    return calls, answer


def task_dirs(root: Path) -> list[Path]:
    """Task directories under a split (`root/tasks/*`) or a plain folder of tasks, sorted."""
    root = Path(root)
    base = root / "tasks" if (root / "tasks").is_dir() else root
    return sorted(p for p in base.iterdir() if p.is_dir())
