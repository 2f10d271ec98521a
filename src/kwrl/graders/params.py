"""The params contract of every criterion kind, validated before anything is graded.

Task generators write these params; a typo or a wrong type is a task-format problem, not an agent
failure, so validation raises `ParamsError` naming the criterion and the field, and the trial is
recorded as an error (never as a score of 0). Unknown fields are rejected too: a misspelt `rel_tol`
silently falling back to its default would grade with the wrong tolerance.

Models are strict pydantic models (an int is a valid float, a bool is not a number, a string is
not a list).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kwrl.graders.errors import ParamsError
from kwrl.types import Criterion, CriterionKind

Phrase = Annotated[str, Field(min_length=1, pattern=r"\w")]
"""A phrase to look for; it must contain at least one letter or digit."""
RelativePath = Annotated[str, Field(min_length=1)]
FileType = Literal["docx", "xlsx", "pptx", "md", "txt", "csv", "pdf", "json"]


class _FieldProblem(ValueError):
    """A cross-field problem, attributed to one field (pydantic would name none)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NumberSpec(_Params):
    """A number that must be stated: `|found - value| <= max(abs_tol, rel_tol * |value|)`."""

    value: float
    rel_tol: float = Field(0.005, ge=0)
    abs_tol: float = Field(0.0, ge=0)
    unit: Literal["", "%", "x"] = ""
    """`%`: value is in percent (12.5 means 12.5%); `x`: a multiple."""
    scale: float = Field(1.0, gt=0)
    """Units of `value` (1e6: millions); the bare figure or the full one both state it."""


class AnswerNumberParams(NumberSpec):
    reject: list[float] = []
    """Wrong values, in the same unit and scale, that fail the answer if stated: an answer that
    hedges by listing the right figure beside the distractor does not earn the reward."""


class AnswerTextParams(_Params):
    any_of: list[Phrase] = Field(min_length=1)
    """Accepted spellings; one must appear (case-, punctuation- and accent-insensitive)."""
    none_of: list[Phrase] = []
    """Phrases that make the answer wrong if they appear (e.g. the distractor's name)."""


class ContentSpec(_Params):
    """Required content: every text group matched by one alternative, every number stated."""

    text: list[Annotated[list[Phrase], Field(min_length=1)]] = []
    numbers: list[NumberSpec] = []
    none_of: list[Phrase] = []
    """Phrases the content must not contain (e.g. the distractor's name), as in `answer_text`."""

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.numbers and not self.none_of


class _RequiredContent(ContentSpec):
    @model_validator(mode="after")
    def _needs_content(self) -> _RequiredContent:
        if self.is_empty:
            raise _FieldProblem("text", "needs 'text', 'numbers' or 'none_of' (the spec is empty)")
        return self


def _suffix_in(path: str, suffixes: tuple[str, ...]) -> str:
    if PurePosixPath(path).suffix.lower() not in suffixes:
        raise _FieldProblem("path", f"must name a {' or '.join(suffixes)} file, got {path!r}")
    return path


class FileCellParams(_Params):
    path: RelativePath
    sheet: str = Field(min_length=1)
    cell: str = Field(pattern=r"^\$?[A-Za-z]{1,3}\$?[1-9]\d*$")
    value: float | str
    rel_tol: float = Field(0.005, ge=0)

    @model_validator(mode="after")
    def _xlsx(self) -> FileCellParams:
        _suffix_in(self.path, (".xlsx", ".xlsm"))
        return self


_PARAGRAPH_SUFFIXES = (".docx", ".md", ".markdown", ".txt")


class FileParagraphParams(_RequiredContent):
    path: RelativePath
    paragraph: int | None = Field(None, ge=0)
    """0-based; omitted: anywhere in the file."""

    @model_validator(mode="after")
    def _paragraph_needs_document(self) -> FileParagraphParams:
        if self.paragraph is not None and not self.path.lower().endswith(_PARAGRAPH_SUFFIXES):
            problem = f"paragraphs are counted in docx, md and txt files only, not {self.path!r}"
            raise _FieldProblem("paragraph", problem)
        return self


class FileTableCellParams(_RequiredContent):
    path: RelativePath
    table: int = Field(ge=0)
    row: int = Field(ge=0)
    col: int = Field(ge=0)

    @model_validator(mode="after")
    def _docx(self) -> FileTableCellParams:
        _suffix_in(self.path, (".docx",))
        return self


class FileSlideShapeParams(_RequiredContent):
    path: RelativePath
    slide: int = Field(ge=1)
    """1-based."""
    shape: str = Field(min_length=1)
    row: int | None = Field(None, ge=0)
    col: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _pptx_and_cell(self) -> FileSlideShapeParams:
        _suffix_in(self.path, (".pptx",))
        if (self.row is None) != (self.col is None):
            raise _FieldProblem("row", "'row' and 'col' go together (a table cell) or not at all")
        return self


class FileCreatedParams(ContentSpec):
    path: RelativePath
    """Exact workspace-relative path or a glob (`*` also crosses `/`)."""
    file_type: FileType


class FilesUnchangedParams(_Params):
    allowed: list[RelativePath] = []
    """Paths, directories or globs that may be created, modified or deleted."""


class LlmJudgeParams(_Params):
    statement: str = Field(min_length=1)


PARAMS_MODELS: dict[CriterionKind, type[_Params]] = {
    CriterionKind.ANSWER_NUMBER: AnswerNumberParams,
    CriterionKind.ANSWER_TEXT: AnswerTextParams,
    CriterionKind.FILE_CELL: FileCellParams,
    CriterionKind.FILE_PARAGRAPH: FileParagraphParams,
    CriterionKind.FILE_TABLE_CELL: FileTableCellParams,
    CriterionKind.FILE_SLIDE_SHAPE: FileSlideShapeParams,
    CriterionKind.FILE_CREATED: FileCreatedParams,
    CriterionKind.FILES_UNCHANGED: FilesUnchangedParams,
    CriterionKind.LLM_JUDGE: LlmJudgeParams,
}


def validate_params(criterion: Criterion) -> Any:
    """The criterion's params as its kind's model; raises ParamsError naming the field."""
    try:
        kind = CriterionKind(criterion.kind)
    except ValueError:
        raise ParamsError(criterion.id, str(criterion.kind), "kind", "unknown kind") from None
    model = PARAMS_MODELS[kind]
    if not isinstance(criterion.params, Mapping):
        raise ParamsError(criterion.id, kind.value, "params", "must be an object")
    try:
        return model.model_validate(dict(criterion.params))
    except ValidationError as exc:
        raise _params_error(criterion.id, kind.value, model, exc) from None


def _params_error(
    criterion_id: str, kind: str, model: type[_Params], exc: ValidationError
) -> ParamsError:
    problems = []
    for error in exc.errors():
        cause = error.get("ctx", {}).get("error")
        field = ".".join(str(part) for part in error["loc"]) or getattr(cause, "field", "params")
        if error["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            message = f"unknown param (known: {known})"
        elif error["type"] == "missing":
            message = "is required but missing"
        elif isinstance(cause, _FieldProblem):
            message = str(cause)
        else:
            message = f"{error['msg']} (got {_short(error.get('input'))})"
        problems.append((field, message))
    field, message = problems[0]
    if len(problems) > 1:
        message += "; also " + "; ".join(f"'{f}': {m}" for f, m in problems[1:])
    return ParamsError(criterion_id, kind, field, message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
