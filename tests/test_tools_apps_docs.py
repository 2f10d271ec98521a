"""The docs app on a generated world: paragraphs and table cells by id, edits that keep the rest
of the document, and results the grader's extractor reads back."""

from __future__ import annotations

from pathlib import Path

import docx
import pytest

from kwrl.graders.extract import DocxContent, TextContent, extract
from kwrl.tools import ToolError
from kwrl.tools.apps import Docs
from kwrl.worlds.compose import Paths
from kwrl.worlds.facts import WorldFacts

World = tuple[WorldFacts, Path]


def word(root: Path, rel: str) -> DocxContent:
    content = extract(root / rel)
    assert isinstance(content, DocxContent), content
    return content


def test_read_shows_paragraph_ids_style_marks_and_tables_in_place(world: World) -> None:
    facts, root = world
    lines = Docs(root).read(Paths(facts).cost_review).splitlines()
    assert lines[0] == f"{Paths(facts).cost_review}: 5 paragraphs, 1 table; showing p0-p4"
    assert lines[1] == f"p0 [title] {facts.company}: cost review"
    assert lines[2] == "p1 [heading1] Baseline"
    assert lines[3] == f"p2 The addressable cost base is ${facts.cost_base:,.1f}m (FY2025)."
    assert lines[4].startswith("table 0 (5 rows x 2 cols")
    assert lines[5] == "table 0 row 0: col 0=Category | col 1=Cost ($m)"
    assert lines[6].startswith("table 0 row 1: col 0 Category=Personnel | col 1 Cost ($m)=")
    assert lines[-1].startswith("p4 Management has set a savings target")


def test_read_pages_through_paragraphs_with_start_and_count(world: World) -> None:
    facts, root = world
    first = Docs(root).read(Paths(facts).cost_review, start=0, count=2)
    assert "p1 [heading1] Baseline" in first and "p2 " not in first and "table 0" not in first
    assert "[more: docs_read with start=2]" in first
    second = Docs(root).read(Paths(facts).cost_review, start=2, count=1).splitlines()
    assert second[1].startswith("p2 ") and second[2].startswith("table 0 (5 rows")
    assert Docs(root).read(Paths(facts).cost_review, start=3, count=5).splitlines()[1] \
        == "p3 [heading1] Target"


def test_search_returns_matching_paragraphs_and_table_rows_only(world: World) -> None:
    facts, root = world
    docs = Docs(root)
    rel = Paths(facts).segment_summary
    segment = facts.segments[1]
    hits = docs.search(rel, segment).splitlines()
    revenue = facts.revenue[segment][facts.draft_period]
    assert hits == [f"1 match for '{segment}' in {rel}",
                    f"table 0 row 2: col 0 Segment={segment} | col 1 Revenue ($m)={revenue} | "
                    "col 2 EBITDA ($m)="]
    assert docs.search(rel, "ebitda figures").splitlines()[1].startswith("p2 The table below")
    assert docs.search(rel, "zzz") == f"no matches for 'zzz' in {rel}"


def test_fill_table_cell_saves_a_value_the_grader_reads_and_keeps_the_rest(
        world: World, workspace: Path) -> None:
    facts = world[0]
    rel = Paths(facts).segment_summary
    before = word(workspace, rel)
    segment = facts.segments[0]
    value = str(facts.ebitda[segment][facts.draft_period])
    report = Docs(workspace).fill_table_cell(rel, 0, 1, 2, value)
    assert report == f"saved {rel}: table 0 row 1 col 2 (EBITDA ($m)): '' -> '{value}'"
    after = word(workspace, rel)
    assert after.tables[0][1][2] == value
    assert after.paragraphs == before.paragraphs
    assert [row[:2] for row in after.tables[0]] == [row[:2] for row in before.tables[0]]
    assert f"col 2 EBITDA ($m)={value}" in Docs(workspace).search(rel, segment)
    header = docx.Document(str(workspace / rel)).tables[0].rows[0].cells[2].paragraphs[0]
    assert any(run.bold for run in header.runs)  # formatting of other cells is untouched


def test_replace_and_insert_paragraph_keep_styles_and_shift_ids(
        world: World, workspace: Path) -> None:
    rel = Paths(world[0]).cost_review
    docs = Docs(workspace)
    assert "p1 'Baseline' -> 'Cost baseline'" in docs.replace_paragraph(rel, "p1", "Cost baseline")
    report = docs.insert_paragraph(rel, "p2", "Savings of $10.0m identified.", "bullet")
    assert "inserted p3 [bullet]" in report
    content = word(workspace, rel)
    assert (content.paragraphs[1].text, content.paragraphs[1].style) == \
        ("Cost baseline", "Heading 1")
    assert (content.paragraphs[3].text, content.paragraphs[3].style) == \
        ("Savings of $10.0m identified.", "List Bullet")
    assert content.paragraphs[4].text == "Target"
    assert "p4 [heading1] Target" in docs.read(rel)


def test_create_writes_docx_and_markdown_the_grader_reads(workspace: Path) -> None:
    docs = Docs(workspace)
    body = ["# Findings", "Revenue grew 4.2%.", "- Online led growth"]
    assert docs.create("Memos/findings.docx", "Findings memo", body) == \
        "created Memos/findings.docx: p0 is the title, p1-p3 the paragraphs"
    content = word(workspace, "Memos/findings.docx")
    assert [(p.text, p.style) for p in content.paragraphs] == [
        ("Findings memo", "Title"), ("Findings", "Heading 1"), ("Revenue grew 4.2%.", "Normal"),
        ("Online led growth", "List Bullet")]
    docs.create("Memos/findings.md", "Findings memo", body)
    text = extract(workspace / "Memos/findings.md")
    assert isinstance(text, TextContent)
    assert text.paragraphs() == ["# Findings memo", "## Findings", "Revenue grew 4.2%.",
                                 "- Online led growth"]
    with pytest.raises(ToolError, match="already exists"):
        docs.create("Memos/findings.md", "again", [])


def test_markdown_paragraphs_are_blocks_that_can_be_edited(workspace: Path) -> None:
    (workspace / "note.md").write_text("# Note\n\nFirst para.\n\nSecond para.\n")
    docs = Docs(workspace)
    assert docs.search("note.md", "second") == "1 match for 'second' in note.md\np2 Second para."
    docs.replace_paragraph("note.md", "p1", "First, edited.")
    docs.insert_paragraph("note.md", "p1", "Inserted", "heading1")
    assert (workspace / "note.md").read_text() == \
        "# Note\n\nFirst, edited.\n\n## Inserted\n\nSecond para.\n"
    with pytest.raises(ToolError, match="is not a .docx file"):
        docs.fill_table_cell("note.md", 0, 0, 0, "x")


def test_bad_ids_are_errors_that_give_the_valid_range(world: World) -> None:
    facts, root = world
    docs = Docs(root)
    rel = Paths(facts).segment_summary
    with pytest.raises(ToolError, match=r"has paragraph ids p0-p2; 9 is not one"):
        docs.replace_paragraph(rel, "p9", "x")
    with pytest.raises(ToolError, match="'para 2' is not a paragraph id; use ids like p0"):
        docs.replace_paragraph(rel, "para 2", "x")
    with pytest.raises(ToolError, match="has table ids 0-0"):
        docs.fill_table_cell(rel, 3, 0, 0, "x")
    with pytest.raises(ToolError, match="table 0 has rows 0-"):
        docs.fill_table_cell(rel, 0, 99, 0, "x")
    with pytest.raises(ToolError, match="table 0 has cols 0-2"):
        docs.fill_table_cell(rel, 0, 1, 5, "x")
    with pytest.raises(ToolError, match="unknown style 'fancy'"):
        docs.insert_paragraph(rel, "p0", "x", "fancy")  # type: ignore[arg-type]


def test_a_corrupt_document_is_a_tool_error_naming_the_file(workspace: Path) -> None:
    (workspace / "Memos" / "broken.docx").write_bytes(b"not a zip at all")
    with pytest.raises(ToolError, match="Memos/broken.docx cannot be read as a Word document"):
        Docs(workspace).read("Memos/broken.docx")


def test_long_documents_are_cut_with_a_hint(workspace: Path) -> None:
    Docs(workspace).create("long.md", "Long", [f"Paragraph {i} " + "words " * 40
                                               for i in range(100)])
    text = Docs(workspace).read("long.md")
    assert "characters cut" in text and "docs_read with a smaller count" in text
