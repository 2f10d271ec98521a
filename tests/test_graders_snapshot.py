"""Snapshots record files by content hash; diffs say what changed and where.

These tests edit a directory in place, so the before-snapshot keeps its bytes (`keep_content`);
a trial's before-snapshot is taken of the world's pristine files and need not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import docx
import openpyxl
import pptx
import pytest
from pptx.util import Inches

from kwrl.graders import Snapshot, diff_snapshots, take_snapshot
from kwrl.graders.diff import Change
from kwrl.graders.extract import ExtractionError, TextContent, XlsxContent


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "docs" / "deep").mkdir(parents=True)
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "docs" / "table.csv").write_text("name,amount\nRetail,10\nBank,20\n")
    (root / "docs" / "deep" / "data.json").write_text('{"a": 1, "b": [1, 2]}')
    return root


def test_a_snapshot_records_every_file_by_relative_path_size_and_hash(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    assert list(snapshot.files) == ["docs/deep/data.json", "docs/table.csv", "notes.txt"]
    entry = snapshot.files["notes.txt"]
    assert entry.size == len("alpha\nbeta\ngamma\n")
    assert len(entry.sha256) == 64 and entry.symlink_target is None
    assert "./docs//table.csv" in snapshot


def test_a_symlink_is_recorded_and_not_followed(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", workspace / "link.txt")
    os.symlink(tmp_path, workspace / "linked_dir")
    snapshot = take_snapshot(workspace)
    assert snapshot.files["link.txt"].symlink_target == str(tmp_path / "outside.txt")
    assert snapshot.files["linked_dir"].symlink_target == str(tmp_path)
    assert not any(p.startswith("linked_dir/") for p in snapshot.files)
    content = snapshot.extract("link.txt")
    assert isinstance(content, ExtractionError) and "symbolic link" in content.reason


def test_an_equal_size_edit_is_detected(workspace: Path) -> None:
    before = take_snapshot(workspace, keep_content=True)
    (workspace / "notes.txt").write_text("alpha\nbeta\ndelta\n")  # same byte count
    after = take_snapshot(workspace)
    assert before.files["notes.txt"].size == after.files["notes.txt"].size
    diff = diff_snapshots(before, after)
    assert diff.modified == ("notes.txt",)
    assert diff.changes("notes.txt") == (Change("line 3", "gamma", "delta"),)


def test_created_deleted_and_unchanged_files(workspace: Path) -> None:
    before = take_snapshot(workspace, keep_content=True)
    (workspace / "notes.txt").unlink()
    (workspace / "out").mkdir()
    (workspace / "out" / "memo.md").write_text("# Memo\n")
    diff = diff_snapshots(before, take_snapshot(workspace))
    assert diff.created == ("out/memo.md",)
    assert diff.deleted == ("notes.txt",)
    assert diff.modified == ()
    assert diff.describe() == ["created out/memo.md", "deleted notes.txt"]
    assert diff_snapshots(before, before).is_empty


def test_extraction_is_lazy_and_cached(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    first = snapshot.extract("notes.txt")
    assert isinstance(first, TextContent)
    assert snapshot.extract("notes.txt") is first


def test_content_changed_on_disk_after_the_snapshot_is_not_graded(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    (workspace / "notes.txt").write_text("rewritten\n")
    content = snapshot.extract("notes.txt")
    assert isinstance(content, ExtractionError)
    assert "changed on disk" in content.reason


def test_a_snapshot_can_keep_its_bytes(workspace: Path) -> None:
    snapshot = take_snapshot(workspace, keep_content=True)
    (workspace / "notes.txt").write_text("rewritten\n")
    assert snapshot.extract("notes.txt") == TextContent(("alpha", "beta", "gamma"))


def test_glob_matching_crosses_directories(workspace: Path) -> None:
    snapshot = take_snapshot(workspace)
    assert snapshot.matching("docs/*.csv") == ["docs/table.csv"]
    assert snapshot.matching("*.json") == ["docs/deep/data.json"]
    assert snapshot.matching("/notes.txt") == ["notes.txt"]
    assert Snapshot.empty(workspace).matching("*") == []


def test_csv_and_json_diffs_are_located(workspace: Path) -> None:
    before = take_snapshot(workspace, keep_content=True)
    (workspace / "docs" / "table.csv").write_text("name,amount\nRetail,12\nBank,20\nOil,5\n")
    (workspace / "docs" / "deep" / "data.json").write_text('{"a": 2, "b": [1, 2, 3]}')
    diff = diff_snapshots(before, take_snapshot(workspace))
    assert [str(c) for c in diff.changes("docs/table.csv")] == [
        "row 2: 'Retail,10' -> 'Retail,12'",
        "row 4 added: 'Oil,5'",
    ]
    assert [str(c) for c in diff.changes("docs/deep/data.json")] == [
        "$.a: 1 -> 2",
        "$.b[2] added: 3",
    ]


def write_book(path: Path, b7: object, extra_sheet: bool = False) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Sheet1"
    sheet["B7"] = b7
    sheet["C2"] = "label"
    if extra_sheet:
        book.create_sheet("Summary")["A1"] = "=Sheet1!B7"
    book.save(path)


def test_xlsx_diff_names_changed_cells_and_sheets(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    write_book(root / "model.xlsx", 10)
    before = take_snapshot(root, keep_content=True)
    write_book(root / "model.xlsx", 12, extra_sheet=True)
    diff = diff_snapshots(before, take_snapshot(root))
    assert [str(c) for c in diff.changes("model.xlsx")] == [
        "Sheet1!B7: 10 -> 12",
        "sheet Summary added: '1 cells'",
    ]
    assert diff.describe(detail=1) == ["modified model.xlsx (Sheet1!B7: 10 -> 12; +1 more)"]
    assert json.loads(json.dumps(diff.to_json()))["modified"][0]["path"] == "model.xlsx"


def test_docx_diff_aligns_paragraphs_and_locates_table_cells(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()

    def write(paragraphs: list[str], cell: str) -> None:
        document = docx.Document()
        for text in paragraphs:
            document.add_paragraph(text)
        document.add_table(rows=2, cols=2).cell(1, 0).text = cell
        document.save(root / "memo.docx")

    write(["Intro", "Revenue was 4.2m", "Outro"], "old")
    before = take_snapshot(root, keep_content=True)
    write(["Intro", "New finding", "Revenue was 4.5m", "Outro"], "new")
    changes = diff_snapshots(before, take_snapshot(root)).changes("memo.docx")
    assert [str(c) for c in changes] == [
        "paragraph 1: 'Revenue was 4.2m' -> 'New finding'",
        "paragraph 2 added: 'Revenue was 4.5m'",
        "table 0 row 1 col 0: 'old' -> 'new'",
    ]


def test_pptx_diff_names_slide_and_shape(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()

    def write(body: str, slides: int) -> None:
        deck = pptx.Presentation()
        for _ in range(slides):
            slide = deck.slides.add_slide(deck.slide_layouts[6])
            box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(3), Inches(1))
            box.name = "Body"
            box.text_frame.text = body
        deck.save(root / "deck.pptx")

    write("Revenue 4.2m", 3)
    before = take_snapshot(root, keep_content=True)
    write("Revenue 4.5m", 3)
    changes = diff_snapshots(before, take_snapshot(root)).changes("deck.pptx")
    assert str(changes[0]) == "slide 1 / Body: 'Revenue 4.2m' -> 'Revenue 4.5m'"
    assert [c.where for c in changes] == ["slide 1 / Body", "slide 2 / Body", "slide 3 / Body"]


def test_a_corrupted_file_is_one_whole_file_change(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    write_book(root / "model.xlsx", 10)
    before = take_snapshot(root, keep_content=True)
    data = (root / "model.xlsx").read_bytes()
    (root / "model.xlsx").write_bytes(data[: len(data) // 2])
    after = take_snapshot(root)
    (change,) = diff_snapshots(before, after).changes("model.xlsx")
    assert change.where == "whole file"
    assert change.before == "xlsx content"
    assert change.after is not None and change.after.startswith("unreadable (not a zip file")
    assert isinstance(before.extract("model.xlsx"), XlsxContent)


def test_binary_files_change_as_a_whole(workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"\x00" * 8)
    before = take_snapshot(workspace, keep_content=True)
    (workspace / "blob.bin").write_bytes(b"\x01" * 8)
    (change,) = diff_snapshots(before, take_snapshot(workspace)).changes("blob.bin")
    assert change.where == "whole file"
    assert change.before is not None and change.before.startswith("8 bytes, sha256 ")
