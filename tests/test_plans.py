"""Every template's oracle plan, executed by a real MCP client against the trial's own tool
servers, scores 1.0: the tools can solve every task, and the plans are valid demonstrations."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TEMPLATE_CASES, TEMPLATE_IDS, template_task_dir

from kwrl.graders import find_numbers
from kwrl.harness.baselines import PlanAgent
from kwrl.sandbox.trial import run_trial
from kwrl.tools.host import ToolHost
from kwrl.tools.services import McpServices
from kwrl.types import AgentOutcome, CriterionKind, Task, TrialStatus


@pytest.fixture(scope="module")
def host():
    with ToolHost() as tool_host:
        yield tool_host


class RecordingPlanAgent(PlanAgent):
    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        self.outcome = super().run(task, workspace, tools)
        return self.outcome


@pytest.mark.parametrize(("domain", "tmpl"), TEMPLATE_CASES, ids=TEMPLATE_IDS)
def test_the_oracle_plan_through_mcp_scores_one(template_worlds, domain, tmpl, host, tmp_path):
    task_dir = template_task_dir(template_worlds, domain, tmpl, tmp_path)
    agent = RecordingPlanAgent()
    trial = run_trial(task_dir, agent, services=McpServices(host))
    assert trial.status is TrialStatus.OK, trial.error
    failed = [c.reason for c in trial.grade.criteria if not c.met]
    assert trial.grade.score == 1.0, failed

    results = [m for m in agent.outcome.messages if m.role == "tool"]
    assert results and all(r.content for r in results)
    assert not any(r.content.startswith(("Error", "error")) for r in results), results
    if tmpl.tier <= 2:  # the looked-up value is copied from a tool result, not computed
        seen = {round(n.value, 6) for r in results for n in find_numbers(r.content)}
        for criterion in trial.grade.criteria:
            if criterion.kind is CriterionKind.ANSWER_NUMBER:
                params = next(c.params for c in _rubric(task_dir) if c.id == criterion.criterion_id)
                value = params["value"]
                assert round(value, 6) in seen or round(value * params.get("scale", 1), 6) in seen


def _rubric(task_dir: Path):
    from kwrl.worlds.taskdir import load_rubric

    return load_rubric(task_dir)
