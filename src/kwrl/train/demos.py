"""Demonstrations for SFT: each task's oracle plan, replayed through the real harness loop.

For every task, the plan's calls become assistant turns (`<tool_call>` JSON the way the chat
template writes it, one call per turn) and its answer the last turn; a `ReplayEngine` feeds them
to a `ModelAgent` running in a real trial with real MCP servers. Only trials that score 1.0
become examples (a demonstration must be right), so a broken plan or tool can never teach the
model a wrong answer; what was skipped, and why, is counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kwrl.engines.replay import ReplayEngine
from kwrl.harness.loop import Limits
from kwrl.harness.model_agent import ModelAgent
from kwrl.harness.prompt import ToolDetail
from kwrl.render import ChatTemplateRenderer
from kwrl.sandbox.trial import run_trial
from kwrl.tools.host import ToolHost
from kwrl.tools.services import McpServices
from kwrl.train.sft import SftExample
from kwrl.types import TrialStatus
from kwrl.worlds.taskdir import TaskFormatError, load_plan, load_task, task_dirs


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the chat template renders one (json.dumps spacing, key order kept)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def plan_turns(task_dir: Path) -> list[str]:
    calls, answer = load_plan(task_dir)
    return [*(tool_call_text(c.tool, dict(c.arguments)) for c in calls), answer]


@dataclass
class DemoSet:
    examples: list[SftExample] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Reason -> count: tasks that gave no example."""


def build_demonstrations(tasks_root: Path, renderer: ChatTemplateRenderer, host: ToolHost,
                         limits: Limits, tools_subset: Sequence[str] | None,
                         tool_detail: ToolDetail = "compact",
                         tiers: Sequence[int] | None = None,
                         progress: Callable[[int, int], None] | None = None) -> DemoSet:
    """One example per task of `tiers` (all by default) whose replayed plan scores 1.0."""
    demos = DemoSet()
    dirs = task_dirs(tasks_root)
    services = McpServices(host)
    for k, task_dir in enumerate(dirs, start=1):
        if progress:
            progress(k, len(dirs))
        try:
            task = load_task(task_dir)
            turns = plan_turns(task_dir)
        except TaskFormatError as exc:
            demos.skipped[f"task: {exc}"] += 1
            continue
        if tiers is not None and task.tier not in tiers:
            demos.skipped[f"tier {task.tier}"] += 1
            continue
        engine = ReplayEngine(renderer.tokenizer, turns)
        agent = ModelAgent(engine, renderer, "mcp", limits, tools_subset=tools_subset,
                           tool_detail=tool_detail, name="demo")
        trial = run_trial(task, agent, services=services)
        if trial.status is not TrialStatus.OK or trial.trajectory is None:
            demos.skipped[f"error: {trial.error_boundary}"] += 1
        elif trial.grade is None or trial.grade.score < 1.0:
            demos.skipped["score below 1"] += 1
        else:
            t = trial.trajectory
            demos.examples.append(SftExample(t.token_ids_T, t.loss_mask_T))
            demos.task_ids.append(trial.task_id)
    return demos
