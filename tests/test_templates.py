"""Every template, in every domain it serves, yields tasks whose rubric is right.

For each (domain, template): the oracle scores 1.0; the null agent (empty answer, no edits) scores
0 on every criterion that needs an answer or a deliverable; a plausible wrong answer (the
distractor quarter, the superseded draft, the rejected option) fails at least one criterion.
Grading goes through the task directory on disk, exactly as a trial does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import TEMPLATE_CASES, TEMPLATE_IDS, template_task_dir

from kwrl.graders import grade, take_snapshot
from kwrl.types import CriterionKind, Domain
from kwrl.worlds.taskdir import load_task
from kwrl.worlds.templates import TEMPLATES


def _grade_run(task_dir: Path, tmp_path: Path, answer_from: Path | None):
    """Copy the world, apply `answer_from` (a solution or distractor dir), grade."""
    task = load_task(task_dir)
    workspace = tmp_path / "workspace"
    if workspace.exists():
        shutil.rmtree(workspace)
    shutil.copytree(task.world_dir / "files", workspace)
    before = take_snapshot(task.world_dir / "files")
    answer = ""
    if answer_from is not None:
        if (answer_from / "files").is_dir():
            shutil.copytree(answer_from / "files", workspace, dirs_exist_ok=True)
        answer = (answer_from / "answer.md").read_text()
    return task, grade(task.rubric, answer, before, take_snapshot(workspace))


@pytest.mark.parametrize(("domain", "tmpl"), TEMPLATE_CASES, ids=TEMPLATE_IDS)
def test_oracle_scores_one_null_scores_zero_distractor_fails(
    template_worlds, domain, tmpl, tmp_path
):
    task_dir = template_task_dir(template_worlds, domain, tmpl, tmp_path)

    task, oracle = _grade_run(task_dir, tmp_path, task_dir / "solution")
    assert oracle.score == 1.0 and oracle.passed, [c.reason for c in oracle.criteria if not c.met]

    _, null = _grade_run(task_dir, tmp_path, None)
    for result in null.criteria:
        if result.kind != CriterionKind.FILES_UNCHANGED:
            assert not result.met, f"null agent met {result.criterion_id}: {result.reason}"
    assert not null.passed

    _, wrong = _grade_run(task_dir, tmp_path, task_dir / "tests" / "distractor")
    assert not wrong.passed, f"distractor passed {task.template}: {task.instruction}"

    if any(c.params.get("reject") for c in task.rubric):
        hedge = tmp_path / "hedge"
        hedge.mkdir()
        oracle_answer = (task_dir / "solution" / "answer.md").read_text()
        distractor = (task_dir / "tests" / "distractor" / "answer.md").read_text()
        (hedge / "answer.md").write_text(f"{oracle_answer} Or possibly: {distractor}")
        _, hedged = _grade_run(task_dir, tmp_path, hedge)
        assert not hedged.passed, f"a hedged answer passed {task.template}"


def test_every_domain_has_every_tier():
    for domain in Domain:
        tiers = {t.tier for t in TEMPLATES if domain in t.domains}
        assert tiers == {1, 2, 3, 4}, domain
