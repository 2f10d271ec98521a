"""The pdf app on a generated world: page text, clean table rows from two-column pages, and a
search that returns the row holding a fact with its header."""

from __future__ import annotations

from pathlib import Path

import pytest
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from kwrl.tools import ToolError
from kwrl.tools.apps import Pdf
from kwrl.worlds.compose import Paths, money
from kwrl.worlds.facts import WorldFacts

TWO_COLUMN = "Q1 2025"  # odd quarters are laid out in two columns, the table beside prose
ONE_COLUMN = "Q2 2025"


@pytest.fixture
def pdf(world: tuple[WorldFacts, Path]) -> Pdf:
    return Pdf(world[1])


def report(world: tuple[WorldFacts, Path], period: str) -> str:
    return Paths(world[0]).report(period)


def test_read_pages_heads_each_page_and_points_to_the_table_tool(
        world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    text = pdf.read_pages(report(world, TWO_COLUMN))
    first = text.splitlines()[0]
    assert first.startswith("--- page 1 of 1 --- (1 table: pdf_tables with page=1")
    assert f"{world[0].company}: Quarterly Report {TWO_COLUMN}" in text


def test_tables_gives_the_two_column_table_as_clean_rows(
        world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    facts = world[0]
    lines = pdf.tables(report(world, TWO_COLUMN)).splitlines()
    assert lines[0] == f"page 1, table 1 ({len(facts.segments) + 2} rows x 3 cols)"
    assert lines[1] == "Segment | Revenue ($m) | EBITDA ($m)"
    for segment in facts.segments:
        revenue, ebitda = facts.revenue[segment][TWO_COLUMN], facts.ebitda[segment][TWO_COLUMN]
        assert f"{segment} | {revenue} | {ebitda}" in lines


@pytest.mark.parametrize("period", [TWO_COLUMN, ONE_COLUMN])
def test_search_returns_the_matching_table_row_with_its_header(
        world: tuple[WorldFacts, Path], pdf: Pdf, period: str) -> None:
    facts = world[0]
    segment = facts.segments[1]
    hits = pdf.search(report(world, period), segment).splitlines()
    expected = (f"page 1, table 1: Segment={segment} | Revenue ($m)="
                f"{facts.revenue[segment][period]} | EBITDA ($m)={facts.ebitda[segment][period]}")
    assert hits[1] == expected
    others = [s for s in facts.segments if s != segment and s not in segment]
    assert not any(f"Segment={other} " in hit for other in others for hit in hits)


def test_search_matches_all_words_across_a_row_and_its_header(
        world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    facts = world[0]
    segment = facts.segments[0]
    hits = pdf.search(report(world, ONE_COLUMN), f"{segment} EBITDA").splitlines()
    assert hits[1].startswith(f"page 1, table 1: Segment={segment} |")
    assert any(h.startswith("page 1: ") and "EBITDA of" in h for h in hits[2:])


def test_search_rejoins_sentences_and_cuts_table_rows_out_of_two_column_prose(
        world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    facts = world[0]
    hits = pdf.search(report(world, TWO_COLUMN), "total revenue quarter").splitlines()
    total = money(facts.total("revenue", TWO_COLUMN))
    # On this page the sentence shares its lines with table rows; the hit is the sentence alone.
    assert hits[1:] == [f"page 1: Total revenue for the quarter was {total} across "
                        f"{len(facts.segments)} segments."]


def test_search_finds_a_sentence_broken_over_lines(tmp_path: Path) -> None:
    page = canvas.Canvas(str(tmp_path / "amendment.pdf"), pagesize=A4)
    page.drawString(40, 800, "Clause 12.2 is replaced with: Either party may terminate for")
    page.drawString(40, 782, "convenience on 90 days' written")
    page.drawString(40, 764, "notice. All other terms remain in force.")
    page.save()
    assert Pdf(tmp_path).search("amendment.pdf", "notice").splitlines()[1] == (
        "page 1: Clause 12.2 is replaced with: Either party may terminate for convenience on "
        "90 days' written notice.")


def test_search_without_hits_says_so(world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    rel = report(world, ONE_COLUMN)
    assert pdf.search(rel, "zzzunlikely") == f"no matches for 'zzzunlikely' in {rel}"


def test_page_numbers_outside_the_file_are_errors_that_give_the_range(
        world: tuple[WorldFacts, Path], pdf: Pdf) -> None:
    rel = report(world, ONE_COLUMN)
    with pytest.raises(ToolError, match="has 1 page; start must be between 1 and 1"):
        pdf.read_pages(rel, start=3)
    with pytest.raises(ToolError, match="has 1 page;"):
        pdf.tables(rel, page=2)


def test_other_formats_and_corrupt_files_are_tool_errors(
        world: tuple[WorldFacts, Path], pdf: Pdf, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="use sheets_list_sheets"):
        pdf.read_pages(Paths(world[0]).financials)
    (tmp_path / "Reports").mkdir()
    (tmp_path / "Reports" / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    with pytest.raises(ToolError, match="Reports/broken.pdf cannot be read as a PDF"):
        Pdf(tmp_path).search("Reports/broken.pdf", "x")


def test_long_documents_are_read_in_parts_and_cut_with_a_hint(tmp_path: Path) -> None:
    page = canvas.Canvas(str(tmp_path / "long.pdf"), pagesize=A4)
    for number in range(1, 26):
        for line in range(30):
            page.drawString(40, 800 - line * 18, f"page {number} line {line} revenue {line * 7}")
        page.showPage()
    page.save()
    pdf = Pdf(tmp_path)
    text = pdf.read_pages("long.pdf")
    assert "--- page 1 of 25 ---" in text and "--- page 20 of 25 ---" in text
    assert "characters cut" in text and "start/end" in text
    assert text.endswith("[pages 21-25 not read: pdf_read_pages with start=21]")
    assert pdf.read_pages("long.pdf", 24, 99).startswith("--- page 24 of 25 ---")
    assert pdf.tables("long.pdf", 3).startswith("no tables found on page 3")
