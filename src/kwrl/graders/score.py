"""Scoring: run every criterion's check once and weigh the verdicts.

score = sum of the weights of met criteria / sum of all weights; passed = every criterion met.
A grade is either complete or an error: malformed params, an unreachable judge or a check that
crashed raise `GraderError`, which the trial layer records as status `error` (masked from training),
never as a 0 that would teach the policy that a correct answer was wrong.

Cost is paid only where needed: params are validated first (cheap, and a malformed task fails
before any file is read), the after-snapshot is taken only if some criterion reads the workspace,
and the snapshot diff is computed once, on first use, by `files_unchanged`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kwrl.graders.criteria import CHECKS, NEEDS_WORKSPACE, GradingContext
from kwrl.graders.errors import GraderError
from kwrl.graders.params import validate_params
from kwrl.graders.snapshot import Snapshot, take_snapshot
from kwrl.types import Criterion, CriterionKind, CriterionResult, Grade, Task


def grade(rubric: Sequence[Criterion], answer: str, before: Snapshot, after: Snapshot) -> Grade:
    """Grade a final answer and an after-snapshot against `rubric`; raises GraderError."""
    return _grade(rubric, answer, before, lambda: after)


def grade_task(task: Task, answer: str, before: Snapshot, workspace: Path) -> Grade:
    """Grade a trial of `task`: snapshot `workspace` (only if the rubric reads files) and grade."""

    def snapshot_workspace() -> Snapshot:
        try:
            return take_snapshot(Path(workspace))
        except OSError as exc:
            raise GraderError(f"cannot snapshot workspace {workspace}: {exc}") from exc

    return _grade(task.rubric, answer, before, snapshot_workspace)


def needs_workspace(rubric: Sequence[Criterion]) -> bool:
    """Whether grading `rubric` reads the after-workspace at all."""
    return any(c.kind in NEEDS_WORKSPACE for c in rubric)


def _grade(
    rubric: Sequence[Criterion], answer: str, before: Snapshot, after: Callable[[], Snapshot]
) -> Grade:
    if not rubric:
        raise GraderError("the rubric has no criteria")
    for criterion in rubric:
        if not criterion.weight > 0:
            raise GraderError(f"criterion '{criterion.id}': weight must be positive")
    params = [validate_params(c) for c in rubric]
    context = GradingContext(answer or "", before, after)
    results = tuple(_run(c, p, context) for c, p in zip(rubric, params, strict=True))
    total = sum(c.weight for c in rubric)
    met = sum(r.weight for r in results if r.met)
    return Grade(score=met / total, passed=all(r.met for r in results), criteria=results)


def _run(criterion: Criterion, params: object, context: GradingContext) -> CriterionResult:
    check = CHECKS[CriterionKind(criterion.kind)]
    try:
        return check(criterion, params, context)
    except GraderError:
        raise
    except Exception as exc:  # a crashed check makes the grade unknown, not 0
        raise GraderError(
            f"criterion '{criterion.id}' ({criterion.kind}) crashed: {type(exc).__name__}: {exc}"
        ) from exc
