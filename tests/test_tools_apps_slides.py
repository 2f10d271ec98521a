"""The slides app on a generated world: shapes by name, tables as labelled rows, charts as
series, and edits the grader's extractor reads back with the formatting kept."""

from __future__ import annotations

from pathlib import Path

import pptx
import pytest
from pptx.util import Pt

from kwrl.graders.extract import PptxContent, extract
from kwrl.tools import ToolError
from kwrl.tools.apps import Slides
from kwrl.worlds.compose import Paths
from kwrl.worlds.facts import WorldFacts

World = tuple[WorldFacts, Path]
PERIOD = "Q4 2025"


def deck(root: Path, rel: str) -> PptxContent:
    content = extract(root / rel)
    assert isinstance(content, PptxContent), content
    return content


def test_read_deck_lists_slides_shapes_tables_and_chart_series(world: World) -> None:
    facts, root = world
    text = Slides(root).read_deck(Paths(facts).board_deck(PERIOD))
    lines = text.splitlines()
    assert lines[0].endswith(": 5 slides")
    assert "--- slide 2 ---" in lines and "Title: Key figures" in lines
    assert f"  Total revenue {PERIOD}: [to be completed]" in lines
    segment = facts.segments[0]
    row = (f"  row 1: col 0 Segment={segment} | col 1 Revenue ($m)={facts.revenue[segment][PERIOD]}"
           f" | col 2 EBITDA ($m)={facts.ebitda[segment][PERIOD]}")
    assert row in lines
    series = " | ".join(f"{p}={facts.revenue[segment][p]}"
                        for p in ("Q1 2025", "Q2 2025", "Q3 2025", "Q4 2025"))
    assert f"  series {segment}: {series}" in lines


def test_search_finds_body_lines_table_rows_and_series_with_locations(world: World) -> None:
    facts, root = world
    rel = Paths(facts).board_deck(PERIOD)
    slides = Slides(root)
    assert slides.search(rel, "total revenue").splitlines()[1] == \
        f"slide 2, Body: Total revenue {PERIOD}: [to be completed]"
    segment = facts.segments[-1]
    hits = slides.search(rel, segment).splitlines()[1:]
    assert [h.split(":")[0] for h in hits] == [
        f"slide 3, Table row {len(facts.segments)}", f"slide 4, Chart series {segment}"]
    assert slides.search(rel, "zzz") == f"no matches for 'zzz' in {rel}"


def test_edit_shape_replaces_paragraphs_and_keeps_the_font(world: World, workspace: Path) -> None:
    facts = world[0]
    rel = Paths(facts).board_deck(PERIOD)
    total = f"Total revenue {PERIOD}: ${facts.total('revenue', PERIOD):,.1f}m"
    text = f"{total}\nTotal EBITDA {PERIOD}: ${facts.total('ebitda', PERIOD):,.1f}m"
    report = Slides(workspace).edit_shape(rel, 2, "body", text)
    assert report.startswith(f"saved {rel}: slide 2 Body now has 2 paragraphs (was: Total")
    assert deck(workspace, rel).slides[1].shapes["Body"].text == text
    body = pptx.Presentation(str(workspace / rel)).slides[1].shapes[1]
    assert [p.runs[0].font.size for p in body.text_frame.paragraphs] == [Pt(20), Pt(20)]
    assert f"  {total}" in Slides(workspace).read_slide(rel, 2)


def test_edit_table_cell_and_add_slide_are_read_back(world: World, workspace: Path) -> None:
    rel = Paths(world[0]).board_deck(PERIOD)
    slides = Slides(workspace)
    assert "row 1 col 1: " in slides.edit_table_cell(rel, 3, "Table", 1, 1, "99.9")
    assert slides.add_slide(rel, "Conclusions", ["Growth continued", "Margins held"]) == \
        f"saved {rel}: added slide 6 with Title and Body (2 bullets)"
    content = deck(workspace, rel)
    assert content.slides[2].shapes["Table"].table[1][1] == "99.9"
    assert content.slides[5].shapes["Title"].text == "Conclusions"
    assert content.slides[5].shapes["Body"].text == "Growth continued\nMargins held"
    assert slides.read_slide(rel, 6).splitlines() == [
        "--- slide 6 ---", "Title: Conclusions", "Body:", "  Growth continued", "  Margins held"]


def test_errors_name_what_exists(world: World) -> None:
    facts, root = world
    rel = Paths(facts).board_deck(PERIOD)
    slides = Slides(root)
    with pytest.raises(ToolError, match="has slides 1-5; slide 9 does not exist"):
        slides.read_slide(rel, 9)
    with pytest.raises(ToolError, match="no shape 'Subtitle' on slide 2; shapes: Title, Body"):
        slides.edit_shape(rel, 2, "Subtitle", "x")
    with pytest.raises(ToolError, match="holds no text .*slides_edit_table_cell"):
        slides.edit_shape(rel, 3, "Table", "x")
    with pytest.raises(ToolError, match="is not a table"):
        slides.edit_table_cell(rel, 2, "Body", 0, 0, "x")
    with pytest.raises(ToolError, match=r"rows 0-\d+ and cols 0-2"):
        slides.edit_table_cell(rel, 3, "Table", 0, 7, "x")


def test_a_corrupt_deck_is_a_tool_error_naming_the_file(workspace: Path) -> None:
    (workspace / "Board" / "broken.pptx").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    with pytest.raises(ToolError, match="Board/broken.pptx cannot be read as a PowerPoint deck"):
        Slides(workspace).read_deck("Board/broken.pptx")
