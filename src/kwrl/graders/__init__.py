"""Graders: document extraction, snapshot diff, criterion checks, optional LLM judge, scoring.

    before = take_snapshot(world_dir / "files")          # once per world, reused by its trials
    grade = grade_task(task, answer, before, workspace)  # snapshots the workspace only if needed

Every check returns a verdict with a reason; `GraderError` means the grade is unknown (the trial is
an error, masked from training), never a score of 0. `python -m kwrl.graders.verify` is the
verifier a task's `tests/test.sh` runs.
"""

from kwrl.graders.diff import Change
from kwrl.graders.errors import GraderError, JudgeError, ParamsError
from kwrl.graders.extract import Extracted, ExtractionError, extract, extract_bytes
from kwrl.graders.numbers import NumberMention, answer_contains_number, find_numbers
from kwrl.graders.score import grade, grade_task, needs_workspace
from kwrl.graders.snapshot import FileEntry, Snapshot, SnapshotDiff, diff_snapshots, take_snapshot

__all__ = [
    "Change",
    "Extracted",
    "ExtractionError",
    "FileEntry",
    "GraderError",
    "JudgeError",
    "NumberMention",
    "ParamsError",
    "Snapshot",
    "SnapshotDiff",
    "answer_contains_number",
    "diff_snapshots",
    "extract",
    "extract_bytes",
    "find_numbers",
    "grade",
    "grade_task",
    "needs_workspace",
    "take_snapshot",
]
