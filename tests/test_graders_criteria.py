"""Every criterion kind gives a verdict with a reason; malformed tasks and crashes are errors."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pptx
import pytest
from pptx.util import Inches

from kwrl.graders import GraderError, Snapshot, grade, grade_task, take_snapshot
from kwrl.graders.criteria import CHECKS
from kwrl.types import Criterion, CriterionKind, CriterionResult, Domain, Task


def write_model(path: Path, b7: object = 10) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "P&L"
    sheet["A7"], sheet["B7"] = "Revenue", b7
    sheet["B8"] = "=B7*2"
    sheet["B9"] = "4,500,000"
    book.save(path)
    # Give B8 the cached value a spreadsheet program would have stored.
    with zipfile.ZipFile(path) as source:
        parts = {name: source.read(name) for name in source.namelist()}
    sheet_xml = "xl/worksheets/sheet1.xml"
    parts[sheet_xml] = parts[sheet_xml].replace(b"<f>B7*2</f><v></v>", b"<f>B7*2</f><v>20</v>")
    with zipfile.ZipFile(path, "w") as target:
        for name, data in parts.items():
            target.writestr(name, data)


def write_memo(path: Path, paragraphs: list[str], cell: str = "4.5m") -> None:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    table = document.add_table(rows=2, cols=2)
    table.cell(1, 1).text = cell
    document.save(path)


def write_deck(path: Path, body: str = "Revenue grew 12%") -> None:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    box.name = "Body"
    box.text_frame.text = body
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(3), Inches(4), Inches(1))
    table.name = "Figures"
    table.table.cell(1, 0).text = "USD 4,500,000"
    deck.save(path)


@pytest.fixture
def world(tmp_path: Path) -> Path:
    files = tmp_path / "world" / "files"
    files.mkdir(parents=True)
    write_model(files / "model.xlsx")
    write_memo(files / "memo.docx", ["Board memo", "Revenue was 4.2m", "Next steps"])
    write_deck(files / "deck.pptx")
    (files / "notes.md").write_text("# Notes\n\nAcme Corp leads.\n\nRevenue 4.5m.\n")
    return files


@pytest.fixture
def workspace(world: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(world, tmp_path / "ws"))


@pytest.fixture
def before(world: Path) -> Snapshot:
    return take_snapshot(world)


Grader = Callable[..., CriterionResult]


@pytest.fixture
def check(before: Snapshot, workspace: Path) -> Grader:
    """Grade one criterion of `kind` with `params` against the workspace as it is now."""

    def run(kind: CriterionKind, params: Mapping[str, Any], answer: str = "") -> CriterionResult:
        criterion = Criterion("c1", kind, "one criterion", 1.0, dict(params))
        result = grade([criterion], answer, before, take_snapshot(workspace))
        return result.criteria[0]

    return run


def test_answer_number_met_and_unmet(check: Grader) -> None:
    met = check(CriterionKind.ANSWER_NUMBER, {"value": 4_500_000}, "Revenue was $4.5M.")
    assert met.met and met.reason == "answer states $4.5M (=4,500,000), expected 4,500,000 ±0.5%"
    unmet = check(CriterionKind.ANSWER_NUMBER, {"value": 4_500_000}, "Revenue was 4.2m.")
    assert not unmet.met and "numbers found: 4.2m" in unmet.reason


def test_answer_number_that_also_states_a_rejected_value_fails(check: Grader) -> None:
    params = {"value": 27.8, "scale": 1e6, "reject": [30.1]}
    assert check(CriterionKind.ANSWER_NUMBER, params, "Revenue was $27.8m.").met
    hedged = check(CriterionKind.ANSWER_NUMBER, params, "Revenue was $27.8m, or 30.1 in the draft.")
    assert not hedged.met and "also states 30.1, a wrong value" in hedged.reason


def test_answer_text_is_case_accent_and_punctuation_insensitive(check: Grader) -> None:
    params = {"any_of": ["Société Générale", "SocGen"]}
    result = check(CriterionKind.ANSWER_TEXT, params, "The lender is SOCIETE GENERALE.")
    assert result.met and result.reason == "answer names 'Société Générale'"


def test_answer_text_matches_whole_words_only(check: Grader) -> None:
    result = check(CriterionKind.ANSWER_TEXT, {"any_of": ["Acme"]}, "It was Acmeline Ltd.")
    assert not result.met
    assert result.reason == "answer names none of 'Acme'; answer: 'It was Acmeline Ltd.'"


def test_answer_text_rejects_an_answer_that_also_names_the_distractor(check: Grader) -> None:
    params = {"any_of": ["Acme"], "none_of": ["Globex"]}
    result = check(CriterionKind.ANSWER_TEXT, params, "Either Acme or Globex.")
    assert not result.met and result.reason == "answer names 'Globex', which is a wrong answer"
    assert not check(CriterionKind.ANSWER_TEXT, params, "  ").met


def test_file_cell_literal_value(check: Grader, workspace: Path) -> None:
    params = {"path": "model.xlsx", "sheet": "P&L", "cell": "B7", "value": 12}
    unmet = check(CriterionKind.FILE_CELL, params)
    assert not unmet.met and unmet.reason == "model.xlsx P&L!B7 holds 10, expected 12 ±0.5%"
    write_model(workspace / "model.xlsx", b7=12)
    met = check(CriterionKind.FILE_CELL, params)
    assert met.met and met.reason == "model.xlsx P&L!B7 holds 12, expected 12 ±0.5%"


def test_file_cell_accepts_a_formula_by_its_cached_value(check: Grader) -> None:
    result = check(
        CriterionKind.FILE_CELL, {"path": "model.xlsx", "sheet": "P&L", "cell": "B8", "value": 20}
    )
    assert result.met and result.reason == (
        "model.xlsx P&L!B8 holds 20 (formula =B7*2), expected 20 ±0.5%"
    )


def test_file_cell_rejects_a_formula_without_cached_value(check: Grader, workspace: Path) -> None:
    book = openpyxl.load_workbook(workspace / "model.xlsx")
    book["P&L"]["B7"] = "=5+7"
    book.save(workspace / "model.xlsx")
    result = check(
        CriterionKind.FILE_CELL, {"path": "model.xlsx", "sheet": "P&L", "cell": "B7", "value": 12}
    )
    assert not result.met
    assert result.reason == (
        "model.xlsx P&L!B7 holds formula =5+7 with no cached value; write the value"
    )


def test_file_cell_reads_numbers_typed_as_text_and_compares_strings(check: Grader) -> None:
    number = {"path": "model.xlsx", "sheet": "P&L", "cell": "B9", "value": 4_500_000}
    assert check(CriterionKind.FILE_CELL, number).met
    label = {"path": "model.xlsx", "sheet": "P&L", "cell": "A7", "value": "revenue"}
    assert check(CriterionKind.FILE_CELL, label).met


def test_file_cell_names_a_missing_sheet_cell_or_file(check: Grader) -> None:
    params = {"path": "model.xlsx", "sheet": "Cash", "cell": "B7", "value": 1}
    assert check(CriterionKind.FILE_CELL, params).reason == (
        "model.xlsx has no sheet 'Cash' (sheets: 'P&L')"
    )
    params = {"path": "model.xlsx", "sheet": "P&L", "cell": "Z1", "value": 1}
    assert check(CriterionKind.FILE_CELL, params).reason == (
        "model.xlsx P&L!Z1 is empty, expected 1 ±0.5%"
    )
    params = {"path": "out/new.xlsx", "sheet": "P&L", "cell": "B7", "value": 1}
    assert check(CriterionKind.FILE_CELL, params).reason == (
        "out/new.xlsx does not exist in the workspace"
    )


def test_a_corrupt_xlsx_fails_its_criterion_and_grading_goes_on(
    before: Snapshot, workspace: Path
) -> None:
    data = (workspace / "model.xlsx").read_bytes()
    (workspace / "model.xlsx").write_bytes(data[: len(data) // 2])
    cell_params = {"path": "model.xlsx", "sheet": "P&L", "cell": "B7", "value": 10}
    rubric = [
        Criterion("cell", CriterionKind.FILE_CELL, "B7 is 10", 1.0, cell_params),
        Criterion("answer", CriterionKind.ANSWER_NUMBER, "states 10", 1.0, {"value": 10}),
    ]
    result = grade(rubric, "It is 10.", before, take_snapshot(workspace))
    cell, answer = result.criteria
    assert not cell.met
    assert cell.reason.startswith("model.xlsx could not be read: not a zip file")
    assert answer.met and result.score == 0.5 and not result.passed


def test_file_paragraph_by_index_with_a_hint_when_it_moved(check: Grader, workspace: Path) -> None:
    params = {"path": "memo.docx", "paragraph": 1, "numbers": [{"value": 4_500_000}]}
    unmet = check(CriterionKind.FILE_PARAGRAPH, params)
    assert not unmet.met and "numbers found: 4.2m" in unmet.reason
    write_memo(workspace / "memo.docx", ["Board memo", "Revenue was 4.5m", "Next steps"])
    met = check(CriterionKind.FILE_PARAGRAPH, params)
    assert met.met and met.reason == "memo.docx paragraph 1 mentions 4.5m (=4,500,000)"
    write_memo(workspace / "memo.docx", ["Board memo", "Intro", "Revenue was 4.5m"])
    moved = check(CriterionKind.FILE_PARAGRAPH, params)
    assert not moved.met and moved.reason.endswith("(the required content is in paragraph 2)")


def test_file_paragraph_anywhere_and_in_markdown(check: Grader) -> None:
    anywhere = {"path": "memo.docx", "text": [["next steps", "follow-up"]]}
    assert check(CriterionKind.FILE_PARAGRAPH, anywhere).met
    markdown = {"path": "notes.md", "paragraph": 1, "text": [["acme corp"]]}
    result = check(CriterionKind.FILE_PARAGRAPH, markdown)
    assert result.met and result.reason == "notes.md paragraph 1 mentions 'acme corp'"
    beyond = {"path": "notes.md", "paragraph": 9, "text": [["acme"]]}
    assert check(CriterionKind.FILE_PARAGRAPH, beyond).reason == (
        "notes.md has 3 paragraphs; no paragraph 9"
    )


def test_file_table_cell(check: Grader) -> None:
    params = {"path": "memo.docx", "table": 0, "row": 1, "col": 1, "numbers": [{"value": 4.5e6}]}
    result = check(CriterionKind.FILE_TABLE_CELL, params)
    assert (
        result.met and result.reason == "memo.docx table 0 row 1 col 1 mentions 4.5m (=4,500,000)"
    )
    wrong = dict(params, col=0)
    result = check(CriterionKind.FILE_TABLE_CELL, wrong)
    assert not result.met and result.reason.endswith("the cell reads ''")
    outside = dict(params, table=3)
    assert check(CriterionKind.FILE_TABLE_CELL, outside).reason == (
        "memo.docx table 3 row 1 col 1 does not exist (memo.docx has 1 tables)"
    )


def test_file_slide_shape_text_and_table_cell(check: Grader, workspace: Path) -> None:
    body = {
        "path": "deck.pptx",
        "slide": 1,
        "shape": "Body",
        "numbers": [{"value": 15, "unit": "%"}],
    }
    unmet = check(CriterionKind.FILE_SLIDE_SHAPE, body)
    assert not unmet.met and unmet.reason.endswith("it reads 'Revenue grew 12%'")
    write_deck(workspace / "deck.pptx", body="Revenue grew 15%")
    assert check(CriterionKind.FILE_SLIDE_SHAPE, body).met
    cell = dict(body, shape="figures", row=1, col=0, numbers=[{"value": 4.5e6}])
    assert check(CriterionKind.FILE_SLIDE_SHAPE, cell).met


def test_file_slide_shape_names_what_is_there(check: Grader) -> None:
    missing = {"path": "deck.pptx", "slide": 1, "shape": "Title", "text": [["x"]]}
    assert check(CriterionKind.FILE_SLIDE_SHAPE, missing).reason == (
        "deck.pptx slide 1 / Title: no such shape (shapes: 'Body', 'Figures')"
    )
    beyond = dict(missing, slide=4)
    assert check(CriterionKind.FILE_SLIDE_SHAPE, beyond).reason == (
        "deck.pptx has 1 slides; no slide 4"
    )


def test_file_created_needs_a_new_parseable_file_with_the_content(
    check: Grader, workspace: Path
) -> None:
    params = {"path": "out/*.docx", "file_type": "docx", "text": [["recommendation"]]}
    absent = check(CriterionKind.FILE_CREATED, params)
    assert absent.reason == "no file matching 'out/*.docx' (files created: none)"
    (workspace / "out").mkdir()
    (workspace / "out" / "memo.docx").write_text("not really a document")
    fake = check(CriterionKind.FILE_CREATED, params)
    assert not fake.met
    assert fake.reason.startswith("out/memo.docx is not a readable docx file: not a zip file")
    write_memo(workspace / "out" / "memo.docx", ["Our recommendation: proceed"])
    made = check(CriterionKind.FILE_CREATED, params)
    assert made.met
    assert (
        made.reason == "out/memo.docx was created as docx; out/memo.docx mentions 'recommendation'"
    )


def test_file_created_rejects_a_file_that_existed_before(check: Grader) -> None:
    result = check(CriterionKind.FILE_CREATED, {"path": "notes.md", "file_type": "md"})
    assert not result.met and result.reason == "notes.md existed before the agent ran: not created"


def test_file_created_reports_missing_content(check: Grader, workspace: Path) -> None:
    (workspace / "summary.md").write_text("Revenue was 4.2m.\n")
    params = {"path": "summary.md", "file_type": "md", "numbers": [{"value": 4.5e6}]}
    result = check(CriterionKind.FILE_CREATED, params)
    assert not result.met and "numbers found: 4.2m" in result.reason


def test_files_unchanged_met_when_nothing_or_only_allowed_paths_changed(
    check: Grader, workspace: Path
) -> None:
    assert check(CriterionKind.FILES_UNCHANGED, {}).reason == (
        "no file was created, modified or deleted"
    )
    write_model(workspace / "model.xlsx", b7=12)
    (workspace / "out").mkdir()
    (workspace / "out" / "a.md").write_text("x")
    allowed = {"allowed": ["model.xlsx", "out/"]}
    assert check(CriterionKind.FILES_UNCHANGED, allowed).met


def test_files_unchanged_lists_offending_changes_with_their_location(
    check: Grader, workspace: Path
) -> None:
    write_model(workspace / "model.xlsx", b7=12)
    (workspace / "notes.md").unlink()
    result = check(CriterionKind.FILES_UNCHANGED, {"allowed": ["out/*"]})
    assert not result.met
    assert result.reason == (
        "changed outside the allowed paths: deleted notes.md; "
        "modified model.xlsx (P&L!B7: 10 -> 12)"
    )


def test_files_unchanged_catches_an_equal_size_edit(check: Grader, workspace: Path) -> None:
    notes = workspace / "notes.md"
    notes.write_text(notes.read_text().replace("4.5m", "4.9m"))
    result = check(CriterionKind.FILES_UNCHANGED, {})
    assert not result.met and "modified notes.md (line 5: 'Revenue 4.5m.' -> 'Revenue 4.9m.')" in (
        result.reason
    )


K = CriterionKind
XLSX = {"path": "m.xlsx", "sheet": "S", "cell": "B7", "value": 1}
SPEC = {"text": [["a"]]}


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        (K.ANSWER_NUMBER, {"valeu": 3}, "value"),
        (K.ANSWER_NUMBER, {"value": 3, "tolerance": 0.1}, "tolerance"),
        (K.ANSWER_NUMBER, {"value": "3"}, "value"),
        (K.ANSWER_NUMBER, {"value": True}, "value"),
        (K.ANSWER_NUMBER, {"value": 3, "unit": "USD"}, "unit"),
        (K.ANSWER_TEXT, {"any_of": "Acme"}, "any_of"),
        (K.FILE_CELL, dict(XLSX, path="m.docx"), "path"),
        (K.FILE_CELL, dict(XLSX, cell="7B"), "cell"),
        (K.FILE_PARAGRAPH, {"path": "m.docx"}, "text"),
        (K.FILE_PARAGRAPH, dict(SPEC, path="m.pdf", paragraph=1), "paragraph"),
        (K.FILE_TABLE_CELL, dict(SPEC, path="m.docx", table=0, row=-1, col=0), "row"),
        (K.FILE_SLIDE_SHAPE, dict(SPEC, path="d.pptx", slide=0, shape="B"), "slide"),
        (K.FILE_CREATED, {"path": "x.doc", "file_type": "doc"}, "file_type"),
        (K.FILES_UNCHANGED, {"allowed": "out/"}, "allowed"),
        (K.LLM_JUDGE, {}, "statement"),
    ],
)
def test_malformed_params_raise_a_grader_error_naming_the_field(
    check: Grader, kind: CriterionKind, params: dict[str, Any], field: str
) -> None:
    with pytest.raises(GraderError, match=rf"criterion 'c1' \({kind.value}\): param '{field}'"):
        check(kind, params)


def test_params_are_validated_before_any_file_is_read(tmp_path: Path, before: Snapshot) -> None:
    rubric = [
        Criterion("ok", CriterionKind.FILES_UNCHANGED, "d", 1.0, {}),
        Criterion("bad", CriterionKind.ANSWER_NUMBER, "d", 1.0, {}),
    ]
    # The workspace does not exist: reading it would be a different error.
    with pytest.raises(GraderError, match="criterion 'bad'"):
        grade_task(make_task(tmp_path, rubric), "", before, tmp_path / "no-such-dir")


def test_score_is_the_weighted_fraction_met(before: Snapshot, workspace: Path) -> None:
    rubric = [
        Criterion("a", CriterionKind.ANSWER_NUMBER, "d", 3.0, {"value": 10}),
        Criterion("b", CriterionKind.ANSWER_TEXT, "d", 1.0, {"any_of": ["Globex"]}),
    ]
    result = grade(rubric, "Acme, 10", before, take_snapshot(workspace))
    assert result.score == pytest.approx(0.75)
    assert not result.passed
    assert [r.met for r in result.criteria] == [True, False]
    full = grade(rubric, "Globex, 10", before, take_snapshot(workspace))
    assert full.score == 1.0 and full.passed


def test_a_crashing_check_is_a_grader_error_not_a_zero(
    before: Snapshot, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*_: object) -> CriterionResult:
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(CHECKS, CriterionKind.ANSWER_NUMBER, crash)
    rubric = [Criterion("a", CriterionKind.ANSWER_NUMBER, "d", 1.0, {"value": 1})]
    with pytest.raises(GraderError, match=r"criterion 'a' \(answer_number\) crashed: ZeroDiv"):
        grade(rubric, "1", before, take_snapshot(workspace))


def make_task(tmp_path: Path, rubric: list[Criterion]) -> Task:
    return Task(
        task_id="t1",
        instruction="Find the revenue.",
        rubric=tuple(rubric),
        domain=Domain.CONSULTING,
        tier=1,
        template="test",
        world_id="w1",
        world_dir=tmp_path / "world",
        task_dir=tmp_path / "task",
    )


def test_answer_only_tasks_never_snapshot_the_workspace(tmp_path: Path, before: Snapshot) -> None:
    rubric = [Criterion("a", CriterionKind.ANSWER_NUMBER, "d", 1.0, {"value": 4.5e6})]
    result = grade_task(make_task(tmp_path, rubric), "4.5m", before, tmp_path / "no-such-dir")
    assert result.passed


def test_an_unreadable_workspace_is_a_grader_error(tmp_path: Path, before: Snapshot) -> None:
    rubric = [Criterion("a", CriterionKind.FILES_UNCHANGED, "d", 1.0, {})]
    with pytest.raises(GraderError, match="cannot snapshot workspace"):
        grade_task(make_task(tmp_path, rubric), "", before, tmp_path / "no-such-dir")


def test_a_deliverable_naming_the_wrong_answer_fails(check: Grader, workspace: Path) -> None:
    (workspace / "memo.md").write_text("Top segment: Cloud, ahead of Hardware.\n")
    params = {"path": "memo.md", "file_type": "md", "text": [["cloud"]], "none_of": ["Hardware"]}
    result = check(CriterionKind.FILE_CREATED, params)
    assert not result.met and result.reason == "memo.md: mentions 'Hardware', which is wrong"
    (workspace / "memo.md").write_text("Top segment: Cloud.\n")
    assert check(CriterionKind.FILE_CREATED, params).met
