"""The contract every app keeps: registered names, documented and typed tools, and truncation
of large outputs with a note on how to read the rest."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest

from kwrl.tools import ToolError
from kwrl.tools.apps import APPS
from kwrl.tools.apps.base import atomic_write, hit_list, matches, terms
from kwrl.tools.truncate import truncate


def tool_methods(app: type) -> dict[str, typing.Callable[..., str]]:
    return {name: fn for name, fn in inspect.getmembers(app, inspect.isfunction)
            if not name.startswith("_")}


def test_the_registry_names_the_eight_apps() -> None:
    assert list(APPS) == ["filesystem", "pdf", "sheets", "docs", "slides", "mail", "chat",
                          "calendar"]


@pytest.mark.parametrize("name", list(APPS))
def test_every_tool_is_documented_typed_and_returns_str(name: str) -> None:
    methods = tool_methods(APPS[name])
    assert methods, f"{name} has no tools"
    for method_name, method in methods.items():
        assert not method_name.startswith(name), "the MCP layer adds the app prefix"
        doc = inspect.getdoc(method) or ""
        assert doc.strip(), f"{name}.{method_name} has no docstring"
        if len(inspect.signature(method).parameters) > 1:
            assert "Args:" in doc, f"{name}.{method_name} does not describe its arguments"
        hints = typing.get_type_hints(method)
        assert hints["return"] is str
        for parameter in list(inspect.signature(method).parameters)[1:]:
            assert parameter in hints, f"{name}.{method_name}({parameter}) has no type"


def test_an_app_needs_an_existing_workspace_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        APPS["filesystem"](tmp_path / "missing")


def test_truncate_keeps_head_and_tail_around_a_marker_with_the_hint() -> None:
    text = "".join(f"line {i:04d}\n" for i in range(3000))
    cut = truncate(text, 1200, hint="read with offset")
    assert len(cut) < 1400
    assert cut.startswith("line 0000")
    assert cut.rstrip().endswith("line 2999")
    assert f"characters cut of {len(text):,}. read with offset ..." in cut
    head, marker, tail = cut.partition("\n[...")
    assert len(head) == 800 and len(tail.split("...]\n", 1)[1]) == 400


def test_truncate_returns_text_that_fits_unchanged() -> None:
    assert truncate("short", 100, hint="x") == "short"
    with pytest.raises(ValueError):
        truncate("x", 0)


def test_search_terms_must_all_appear_in_a_record_ignoring_case_and_spacing() -> None:
    words = terms("Retail  Q3 2025")
    assert matches(words, "Segment=Retail | Q3   2025=45.5")
    assert not matches(words, "Segment=Retail | Q2 2025=45.5")
    with pytest.raises(ToolError, match="query is empty"):
        terms("   ")


def test_a_search_without_hits_says_so_instead_of_returning_nothing() -> None:
    assert hit_list([], "ebitda", "a.pdf") == "no matches for 'ebitda' in a.pdf"
    many = hit_list([f"hit {i}" for i in range(150)], "x", "f")
    assert many.startswith("150 matches") and "[50 more matches not shown" in many


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "memo.md"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, b"new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["memo.md"]


def test_empty_documents_give_a_sentence_not_an_empty_string(tmp_path: Path) -> None:
    import docx
    import icalendar
    import openpyxl
    from reportlab.pdfgen import canvas

    (tmp_path / "Mail").mkdir()
    (tmp_path / "Mail" / "inbox.mbox").write_bytes(b"")
    (tmp_path / "Chat").mkdir()
    (tmp_path / "Chat" / "channels.json").write_text('{"channels": [{"name": "quiet"}]}')
    (tmp_path / "Calendar").mkdir()
    (tmp_path / "Calendar" / "calendar.ics").write_bytes(icalendar.Calendar().to_ical())
    docx.Document().save(str(tmp_path / "empty.docx"))
    openpyxl.Workbook().save(tmp_path / "empty.xlsx")
    blank = canvas.Canvas(str(tmp_path / "blank.pdf"))
    blank.showPage()
    blank.save()
    apps = {name: app(tmp_path) for name, app in APPS.items()}
    outputs = {
        "mail": apps["mail"].list_messages(),
        "chat": apps["chat"].read("quiet"),
        "calendar": apps["calendar"].list_events(),
        "docs": apps["docs"].read("empty.docx"),
        "sheets": apps["sheets"].read_sheet("empty.xlsx", "Sheet"),
        "sheets list": apps["sheets"].list_sheets("empty.xlsx"),
        "pdf": apps["pdf"].read_pages("blank.pdf"),
        "pdf tables": apps["pdf"].tables("blank.pdf"),
    }
    assert outputs == {
        "mail": "Mail/inbox.mbox has no messages",
        "chat": "#quiet has no messages",
        "calendar": "no events in Calendar/calendar.ics (0 events in the calendar)",
        "docs": "empty.docx has no paragraphs",
        "sheets": "Sheet!A1:A1 is empty; the sheet is empty",
        "sheets list": "empty.xlsx: 1 sheet\nsheet=Sheet | empty",
        "pdf": "--- page 1 of 1 ---\n(no text on this page)",
        "pdf tables": "no tables found on blank.pdf (1 page); tables without ruling lines "
                      "read as text: use pdf_read_pages or pdf_search",
    }
