"""One check per criterion kind: a verdict and a reason a person can read.

A check receives the criterion, its validated params and the grading context (answer, before- and
after-snapshots, the lazily computed diff). It returns a `CriterionResult`; "not met" is always a
verdict with a reason (a missing or corrupt file included), never an exception. Only a check that
cannot decide (the judge is unreachable) raises, and then the whole grade is an error.

Only `files_unchanged` needs the snapshot diff, and only file kinds need the after-snapshot, so an
answer-only rubric never hashes the workspace (see `kwrl.graders.score`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

from kwrl.graders.content import (
    check_content,
    contains_phrase,
    excerpt,
    first_phrase,
    normalize_text,
    path_allowed,
)
from kwrl.graders.extract import (
    DocxContent,
    Extracted,
    ExtractionError,
    PptxContent,
    SlideShape,
    TextContent,
    XlsxCell,
    XlsxContent,
    scalar_text,
)
from kwrl.graders.judge import judge
from kwrl.graders.numbers import answer_contains_number, find_numbers, format_number, within
from kwrl.graders.params import (
    AnswerNumberParams,
    AnswerTextParams,
    FileCellParams,
    FileCreatedParams,
    FileParagraphParams,
    FileSlideShapeParams,
    FilesUnchangedParams,
    FileTableCellParams,
    LlmJudgeParams,
)
from kwrl.graders.snapshot import Snapshot, SnapshotDiff, diff_snapshots, normalize_path
from kwrl.types import Criterion, CriterionKind, CriterionResult

C = TypeVar("C")

MAX_LISTED = 5


class GradingContext:
    """What every check may look at; the after-snapshot and the diff are computed on first use."""

    def __init__(self, answer: str, before: Snapshot, after: Callable[[], Snapshot]) -> None:
        self.answer = answer
        self.before = before
        self._take_after = after

    @cached_property
    def after(self) -> Snapshot:
        return self._take_after()

    @cached_property
    def diff(self) -> SnapshotDiff:
        return diff_snapshots(self.before, self.after)


Check = Callable[[Criterion, Any, GradingContext], CriterionResult]


def _result(criterion: Criterion, met: bool, reason: str) -> CriterionResult:
    return CriterionResult(criterion.id, criterion.kind, criterion.weight, met, reason)


def check_answer_number(
    criterion: Criterion, p: AnswerNumberParams, ctx: GradingContext
) -> CriterionResult:
    met, reason = answer_contains_number(ctx.answer, p.value, p.rel_tol, p.abs_tol, p.unit, p.scale)
    for wrong in p.reject:
        stated, _ = answer_contains_number(ctx.answer, wrong, p.rel_tol, p.abs_tol, p.unit, p.scale)
        if stated:
            hedge = f"answer also states {wrong:g}, a wrong value; {reason}"
            return _result(criterion, False, hedge)
    return _result(criterion, met, reason)


def check_answer_text(
    criterion: Criterion, p: AnswerTextParams, ctx: GradingContext
) -> CriterionResult:
    if not ctx.answer.strip():
        return _result(criterion, False, "the answer is empty")
    normalized = normalize_text(ctx.answer)
    rejected = [phrase for phrase in p.none_of if contains_phrase(normalized, phrase)]
    if rejected:
        return _result(criterion, False, f"answer names {rejected[0]!r}, which is a wrong answer")
    phrase = first_phrase(normalized, p.any_of)
    if phrase is None:
        accepted = " or ".join(repr(a) for a in p.any_of[:MAX_LISTED])
        return _result(
            criterion, False, f"answer names none of {accepted}; answer: {excerpt(ctx.answer)}"
        )
    return _result(criterion, True, f"answer names {phrase!r}")


def _after_file(ctx: GradingContext, path: str, kind: str | None = None) -> Extracted:
    """The after-workspace extraction of `path`; a missing file is an ExtractionError too."""
    path = normalize_path(path)
    if path not in ctx.after.files:
        return ExtractionError(path, "does not exist in the workspace")
    return ctx.after.extract(path, kind)


def _unreadable(content: ExtractionError) -> str:
    if content.reason == "does not exist in the workspace":
        return f"{content.path} {content.reason}"
    return f"{content.path} could not be read: {content.reason}"


def _wrong_type(path: str, content: Extracted, wanted: str) -> str:
    return f"{path} holds {content.kind} content, not {wanted}"


def _after_as(ctx: GradingContext, path: str, kind: type[C], wanted: str) -> C | str:
    """The workspace's `path` after the agent, extracted as `kind`; else why it is not."""
    content = _after_file(ctx, path)
    if isinstance(content, ExtractionError):
        return _unreadable(content)
    if not isinstance(content, kind):
        return _wrong_type(path, content, wanted)
    return content


def check_file_cell(
    criterion: Criterion, p: FileCellParams, ctx: GradingContext
) -> CriterionResult:
    content = _after_as(ctx, p.path, XlsxContent, "a spreadsheet")
    if isinstance(content, str):
        return _result(criterion, False, content)
    if p.sheet not in content.sheets:
        sheets = ", ".join(repr(s) for s in content.sheets)
        return _result(criterion, False, f"{p.path} has no sheet {p.sheet!r} (sheets: {sheets})")
    where = f"{p.path} {p.sheet}!{p.cell.upper().replace('$', '')}"
    cell = content.cell(p.sheet, p.cell)
    met, reason = _cell_matches(cell, p.value, p.rel_tol)
    return _result(criterion, met, f"{where} {reason}")


def _cell_matches(cell: XlsxCell | None, expected: float | str, rel_tol: float) -> tuple[bool, str]:
    if cell is None or (cell.value is None and cell.formula is None):
        return False, f"is empty, expected {_expected(expected, rel_tol)}"
    if cell.value is None:
        return False, f"holds formula {cell.formula} with no cached value; write the value"
    shown = scalar_text(cell.value) + (f" (formula {cell.formula})" if cell.formula else "")
    if isinstance(expected, str):
        met = normalize_text(scalar_text(cell.value)) == normalize_text(expected)
    elif isinstance(cell.value, int | float) and not isinstance(cell.value, bool):
        met = within(float(cell.value), expected, rel_tol, 0.0)
    else:
        # A number typed as text (`4,500,000`, `$4.5M`) counts if it is the only number there.
        mentions = find_numbers(str(cell.value))
        met = len(mentions) == 1 and within(mentions[0].value, expected, rel_tol, 0.0)
    return met, f"holds {shown}, expected {_expected(expected, rel_tol)}"


def _expected(expected: float | str, rel_tol: float) -> str:
    if isinstance(expected, str):
        return repr(expected)
    return f"{format_number(expected)} ±{format_number(rel_tol * 100)}%"


def check_file_paragraph(
    criterion: Criterion, p: FileParagraphParams, ctx: GradingContext
) -> CriterionResult:
    content = _after_file(ctx, p.path)
    if isinstance(content, ExtractionError):
        return _result(criterion, False, _unreadable(content))
    if p.paragraph is None:
        met, reason = check_content(p, content.text(), p.path)
        return _result(criterion, met, reason)
    if isinstance(content, DocxContent):
        paragraphs = [para.text for para in content.paragraphs]
    elif isinstance(content, TextContent):
        paragraphs = content.paragraphs()
    else:
        return _result(criterion, False, _wrong_type(p.path, content, "a document"))
    if p.paragraph >= len(paragraphs):
        return _result(
            criterion,
            False,
            f"{p.path} has {len(paragraphs)} paragraphs; no paragraph {p.paragraph}",
        )
    met, reason = check_content(p, paragraphs[p.paragraph], f"{p.path} paragraph {p.paragraph}")
    if not met:
        elsewhere = [i for i, text in enumerate(paragraphs) if check_content(p, text, "")[0]]
        if elsewhere:
            reason += f" (the required content is in paragraph {elsewhere[0]})"
    return _result(criterion, met, reason)


def check_file_table_cell(
    criterion: Criterion, p: FileTableCellParams, ctx: GradingContext
) -> CriterionResult:
    content = _after_as(ctx, p.path, DocxContent, "a Word document")
    if isinstance(content, str):
        return _result(criterion, False, content)
    where = f"{p.path} table {p.table} row {p.row} col {p.col}"
    text = _grid_cell(content.tables[p.table] if p.table < len(content.tables) else None, p)
    if text is None:
        shape = f"{len(content.tables)} tables"
        if p.table < len(content.tables):
            shape = f"table {p.table} is {_grid_size(content.tables[p.table])}"
        return _result(criterion, False, f"{where} does not exist ({p.path} has {shape})")
    met, reason = check_content(p, text, where)
    return _result(criterion, met, reason if met else f"{reason}; the cell reads {excerpt(text)}")


def _grid_cell(rows: tuple[tuple[str, ...], ...] | None, p: Any) -> str | None:
    if rows is None or p.row >= len(rows) or p.col >= len(rows[p.row]):
        return None
    return rows[p.row][p.col]


def _grid_size(rows: tuple[tuple[str, ...], ...]) -> str:
    return f"{len(rows)} rows x {max((len(r) for r in rows), default=0)} columns"


def check_file_slide_shape(
    criterion: Criterion, p: FileSlideShapeParams, ctx: GradingContext
) -> CriterionResult:
    content = _after_as(ctx, p.path, PptxContent, "a slide deck")
    if isinstance(content, str):
        return _result(criterion, False, content)
    if p.slide > len(content.slides):
        return _result(
            criterion, False, f"{p.path} has {len(content.slides)} slides; no slide {p.slide}"
        )
    shapes = content.slides[p.slide - 1].shapes
    shape = _find_shape(shapes, p.shape)
    where = f"{p.path} slide {p.slide} / {p.shape}"
    if shape is None:
        names = ", ".join(repr(n) for n in shapes) or "none"
        return _result(criterion, False, f"{where}: no such shape (shapes: {names})")
    if p.row is None:
        text = shape.all_text()
    else:
        if shape.table is None:
            return _result(criterion, False, f"{where} is not a table")
        text = _grid_cell(shape.table, p)
        where = f"{where} row {p.row} col {p.col}"
        if text is None:
            return _result(criterion, False, f"{where} does not exist ({_grid_size(shape.table)})")
    met, reason = check_content(p, text, where)
    return _result(criterion, met, reason if met else f"{reason}; it reads {excerpt(text)}")


def _find_shape(shapes: dict[str, SlideShape], name: str) -> SlideShape | None:
    if name in shapes:
        return shapes[name]
    wanted = normalize_text(name)
    return next((s for n, s in shapes.items() if normalize_text(n) == wanted), None)


def check_file_created(
    criterion: Criterion, p: FileCreatedParams, ctx: GradingContext
) -> CriterionResult:
    matches = ctx.after.matching(p.path)
    if not matches:
        created = [f for f in ctx.after.files if f not in ctx.before.files][:MAX_LISTED]
        listed = ", ".join(created) or "none"
        return _result(criterion, False, f"no file matching {p.path!r} (files created: {listed})")
    new = [m for m in matches if m not in ctx.before.files]
    if not new:
        return _result(criterion, False, f"{matches[0]} existed before the agent ran: not created")
    problems = []
    for path in new:
        content = ctx.after.extract(path, kind=p.file_type)
        if isinstance(content, ExtractionError):
            problems.append(f"{path} is not a readable {p.file_type} file: {content.reason}")
            continue
        if p.is_empty:
            return _result(criterion, True, f"{path} was created as {p.file_type}")
        met, reason = check_content(p, content.text(), path)
        if met:
            return _result(criterion, True, f"{path} was created as {p.file_type}; {reason}")
        problems.append(reason)
    return _result(criterion, False, "; ".join(problems[:MAX_LISTED]))


def check_files_unchanged(
    criterion: Criterion, p: FilesUnchangedParams, ctx: GradingContext
) -> CriterionResult:
    diff = ctx.diff
    changed = [*diff.created, *diff.deleted, *diff.modified]
    offending = [path for path in changed if not path_allowed(path, p.allowed)]
    if offending:
        lines = diff.describe(offending[:MAX_LISTED])
        more = len(offending) - MAX_LISTED
        suffix = f"; and {more} more" if more > 0 else ""
        reason = "changed outside the allowed paths: " + "; ".join(lines) + suffix
        return _result(criterion, False, reason)
    if changed:
        return _result(criterion, True, f"only allowed paths changed ({', '.join(changed[:5])})")
    return _result(criterion, True, "no file was created, modified or deleted")


def check_llm_judge(
    criterion: Criterion, p: LlmJudgeParams, ctx: GradingContext
) -> CriterionResult:
    verdict = judge(p.statement, ctx.answer)
    return _result(criterion, verdict.is_true, f"judge: {verdict.rationale or '(no rationale)'}")


CHECKS: dict[CriterionKind, Check] = {
    CriterionKind.ANSWER_NUMBER: check_answer_number,
    CriterionKind.ANSWER_TEXT: check_answer_text,
    CriterionKind.FILE_CELL: check_file_cell,
    CriterionKind.FILE_PARAGRAPH: check_file_paragraph,
    CriterionKind.FILE_TABLE_CELL: check_file_table_cell,
    CriterionKind.FILE_SLIDE_SHAPE: check_file_slide_shape,
    CriterionKind.FILE_CREATED: check_file_created,
    CriterionKind.FILES_UNCHANGED: check_files_unchanged,
    CriterionKind.LLM_JUDGE: check_llm_judge,
}

NEEDS_WORKSPACE = frozenset(
    {
        CriterionKind.FILE_CELL,
        CriterionKind.FILE_PARAGRAPH,
        CriterionKind.FILE_TABLE_CELL,
        CriterionKind.FILE_SLIDE_SHAPE,
        CriterionKind.FILE_CREATED,
        CriterionKind.FILES_UNCHANGED,
    }
)
"""Kinds that read the after-snapshot (the others grade the answer alone)."""
