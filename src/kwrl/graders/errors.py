"""Grader failures that are not the agent's fault.

A criterion that is not met is a verdict (`CriterionResult.met = False`), never an exception. An
exception out of the grader means the *grade itself* is not trustworthy: the task's parameters are
malformed, the judge endpoint is missing or broke, or a check crashed. The trial layer records such
a trial as `error` with boundary `grader`, and it is masked from training instead of scored 0.
"""

from __future__ import annotations


class GraderError(Exception):
    """The grade could not be computed; the trial is an error, not a score of 0."""


class ParamsError(GraderError):
    """Params that break the contract (a task-format problem); names the criterion and field."""

    def __init__(self, criterion_id: str, kind: str, field: str, problem: str) -> None:
        super().__init__(f"criterion '{criterion_id}' ({kind}): param '{field}': {problem}")
        self.criterion_id = criterion_id
        self.field = field


class JudgeError(GraderError):
    """The LLM judge is not configured, did not answer in time, or answered unparseably."""
