"""The sheets app on a generated world: reads and searches find the facts, and every edit saves a
workbook whose formulas all carry correct cached values, as the grader's extractor reads them."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import openpyxl
import pytest

from kwrl.graders.extract import XlsxContent, extract
from kwrl.tools import ToolError
from kwrl.tools.apps import Sheets
from kwrl.types import Domain
from kwrl.worlds.compose import Paths, budget_cell
from kwrl.worlds.domains import comps_workbook
from kwrl.worlds.facts import PERIODS, WorldFacts, make_world
from kwrl.worlds.writers import write_xlsx

World = tuple[WorldFacts, Path]


def stored(value: float) -> str:
    """How a literal number reads back from xlsx: openpyxl writes 67.0 as `67`, an int."""
    return str(int(value)) if float(value).is_integer() else str(value)


def book(root: Path, rel: str) -> XlsxContent:
    content = extract(root / rel)
    assert isinstance(content, XlsxContent), content
    return content


def test_list_sheets_gives_names_ranges_and_headers(world: World) -> None:
    facts, root = world
    text = Sheets(root).list_sheets(Paths(facts).financials)
    rows = len(facts.segments) + 2
    assert f"sheet=Revenue | range=A1:I{rows} | rows={rows} | cols=9 | row 1: Segment | Q1 2024" \
        in text
    assert "sheet=Notes | range=A1:B3" in text


def test_read_range_shows_values_and_formulas_with_their_cached_value(world: World) -> None:
    facts, root = world
    total_row = len(facts.segments) + 2
    text = Sheets(root).read_range(Paths(facts).financials, "Revenue", f"A1:C{total_row}")
    lines = text.splitlines()
    assert lines[1] == "row | A | B | C"
    assert lines[2] == "1 | Segment | Q1 2024 | Q2 2024"
    first = facts.segments[0]
    revenue = facts.revenue[first]
    assert f"2 | {first} | {stored(revenue['Q1 2024'])} | {stored(revenue['Q2 2024'])}" in lines
    total = facts.total("revenue", "Q1 2024")
    assert f"{total_row} | Total | {total} [=SUM(B2:B{total_row - 1})] |" in lines[-1]


def test_search_returns_only_matching_rows_labelled_by_address_and_header(world: World) -> None:
    facts, root = world
    segment = facts.segments[-1]
    hits = Sheets(root).search(Paths(facts).financials, segment).splitlines()
    row = facts.segments.index(segment) + 2
    assert hits[0] == f"3 matches for '{segment}' in {Paths(facts).financials}"
    revenue = hits[1]
    assert revenue.startswith(f"Revenue!row {row}: A{row} Segment={segment} | ")
    for col, period in enumerate(PERIODS):
        letter = "BCDEFGHI"[col]
        assert f"{letter}{row} {period}={stored(facts.revenue[segment][period])}" in revenue
    assert hits[2].startswith(f"EBITDA!row {row}:") and hits[3].startswith(f"Margin!row {row}:")


def test_search_matches_words_in_the_header_and_shows_empty_cells_to_fill(world: World) -> None:
    facts, root = world
    segment = facts.segments[0]
    hits = Sheets(root).search(Paths(facts).budget, f"{segment} Q4 2025", sheet="Actuals")
    cell = budget_cell(facts, segment)
    assert hits.splitlines()[0].startswith("1 match")
    assert hits.splitlines()[1].endswith(f"| {cell} Actual ($m)=")


def test_read_sheet_caps_rows_and_says_how_to_read_more(world: World) -> None:
    facts, root = world
    text = Sheets(root).read_sheet(Paths(facts).budget, "actuals", max_rows=3)
    assert text.splitlines()[2] == "1 | Segment | Period | Budget ($m) | Actual ($m)"
    assert "[rows 1-3 of" in text and "range='A4:D6'" in text


def test_an_edit_is_saved_and_every_formula_keeps_a_correct_cached_value(
        world: World, workspace: Path) -> None:
    facts = world[0]
    rel = Paths(facts).financials
    segment = facts.segments[0]
    report = Sheets(workspace).edit_cells(rel, "Revenue", {"B2": 50.5})
    old_total = facts.total("revenue", "Q1 2024")
    new_total = round(old_total - facts.revenue[segment]["Q1 2024"] + 50.5, 1)
    total_row = len(facts.segments) + 2
    assert f"Revenue!B2: {stored(facts.revenue[segment]['Q1 2024'])} -> 50.5" in report
    assert f"formula value Revenue!B{total_row}: {old_total} -> {new_total}" in report
    content = book(workspace, rel)
    assert content.cell("Revenue", "B2").value == 50.5
    revenue = {s: dict(facts.revenue[s]) for s in facts.segments}
    revenue[segment]["Q1 2024"] = 50.5
    for col, period in enumerate(PERIODS):
        letter = "BCDEFGHI"[col]
        for name, table in (("Revenue", revenue), ("EBITDA", facts.ebitda)):
            cached = content.cell(name, f"{letter}{total_row}")
            expected = sum(table[s][period] for s in facts.segments)
            assert cached.formula == f"=SUM({letter}2:{letter}{total_row - 1})"
            assert cached.value == pytest.approx(expected, abs=1e-9)
        for i, s in enumerate(facts.segments, start=2):
            margin = content.cell("Margin", f"{letter}{i}").value
            assert margin == round(facts.ebitda[s][period] / revenue[s][period], 4)


def test_a_second_read_sees_the_edit(world: World, workspace: Path) -> None:
    rel = Paths(world[0]).financials
    sheets = Sheets(workspace)
    sheets.edit_cells(rel, "Revenue", {"A2": "Renamed segment"})
    assert "2 | Renamed segment |" in sheets.read_range(rel, "Revenue", "A1:B2")
    assert "Revenue!row 2: A2 Segment=Renamed segment" in sheets.search(rel, "renamed")


def test_typed_values_keep_their_type(world: World, workspace: Path) -> None:
    rel = Paths(world[0]).budget
    Sheets(workspace).edit_cells(rel, "Actuals", {"D5": "45.5", "D9": 70, "E1": "'007",
                                                   "E2": "note", "C2": None})
    content = book(workspace, rel)
    assert content.cell("Actuals", "D5").value == 45.5
    assert content.cell("Actuals", "D9").value == 70
    assert content.cell("Actuals", "E1").value == "007"
    assert content.cell("Actuals", "E2").value == "note"
    assert content.cell("Actuals", "C2") is None


def test_new_formulas_get_values_and_unsupported_ones_are_reported(
        world: World, workspace: Path) -> None:
    rel = Paths(world[0]).financials
    report = Sheets(workspace).edit_cells(rel, "Revenue", {
        "J1": "FY 2024", "J2": "=ROUND(SUM(B2:E2),0)", "J3": "=VLOOKUP(B3,A1:B5,2)"})
    content = book(workspace, rel)
    expected = round(sum(world[0].revenue[world[0].segments[0]][p] for p in PERIODS[:4]))
    assert content.cell("Revenue", "J2").value == expected
    assert content.cell("Revenue", "J3").formula == "=VLOOKUP(B3,A1:B5,2)"
    assert content.cell("Revenue", "J3").value is None
    assert "NOT computed, no cached value: Revenue!J3 =VLOOKUP(B3,A1:B5,2) (function VLOOKUP" \
        in report
    assert "? [=VLOOKUP(B3,A1:B5,2)]" in Sheets(workspace).read_range(rel, "Revenue", "J3")


def test_append_rows_and_add_sheet_save_and_keep_formulas(world: World, workspace: Path) -> None:
    facts = world[0]
    rel = Paths(facts).financials
    sheets = Sheets(workspace)
    last = len(facts.segments) + 2
    report = sheets.append_rows(rel, "Revenue", [["Check", f"=B{last}*2"]])
    assert f"appended 1 row to Revenue: A{last + 1}:B{last + 1}" in report
    assert "added sheet Scratch" in sheets.add_sheet(rel, "Scratch")
    content = book(workspace, rel)
    assert list(content.sheets)[-1] == "Scratch"
    doubled = content.cell("Revenue", f"B{last + 1}").value
    assert doubled == pytest.approx(2 * facts.total("revenue", "Q1 2024"))
    assert content.cell("Revenue", f"B{last}").value == facts.total("revenue", "Q1 2024")
    assert sorted(p.name for p in (workspace / "Finance").iterdir() if p.name.startswith("."))\
        == []


def test_create_makes_a_workbook_the_grader_reads(workspace: Path) -> None:
    report = Sheets(workspace).create("Finance/summary.xlsx", "Summary",
                                      [["Item", "Value"], ["a", 2], ["b", 3.5], ["sum", "=B2+B3"]])
    assert "created Finance/summary.xlsx with sheet Summary (4 rows)" in report
    content = book(workspace, "Finance/summary.xlsx")
    assert content.cell("Summary", "B4").value == 5.5
    with pytest.raises(ToolError, match="already exists"):
        Sheets(workspace).create("Finance/summary.xlsx")


def test_errors_say_what_to_do_instead(world: World) -> None:
    facts, root = world
    sheets = Sheets(root)
    rel = Paths(facts).financials
    with pytest.raises(ToolError, match="no sheet 'Revnue' in .*; sheets: Revenue, EBITDA"):
        sheets.read_range(rel, "Revnue", "A1:B2")
    with pytest.raises(ToolError, match="'B2:' is not a range; use A1 notation"):
        sheets.read_range(rel, "Revenue", "B2:")
    with pytest.raises(ToolError, match="'2B' is not a cell address"):
        sheets.edit_cells(rel, "Revenue", {"2B": 1})
    with pytest.raises(ToolError, match="is a CSV file"):
        sheets.edit_cells(Paths(facts).csv(2025), "x", {"A1": 1})
    with pytest.raises(ToolError, match="not a .xlsx or .xlsm or .csv or .tsv file; use docs_read"):
        sheets.list_sheets(Paths(facts).segment_summary)
    with pytest.raises(ToolError, match="'Bad/Name' is not a valid sheet name"):
        sheets.add_sheet(rel, "Bad/Name")
    assert "is empty; the sheet's data is in A1:I" in sheets.read_range(rel, "Revenue", "Z50:Z60")


def test_a_corrupt_workbook_is_a_tool_error_naming_the_file(workspace: Path) -> None:
    (workspace / "Finance" / "broken.xlsx").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ToolError, match="Finance/broken.xlsx cannot be read as an xlsx workbook"):
        Sheets(workspace).search("Finance/broken.xlsx", "x")


def test_csv_files_read_and_search_as_one_sheet(world: World) -> None:
    facts, root = world
    rel = Paths(facts).csv(2025)
    segment = facts.segments[0]
    hits = Sheets(root).search(rel, segment)
    assert f"B2 Q1 2025={facts.revenue[segment]['Q1 2025']}" in hits  # csv: text as written
    assert "row | A | B" in Sheets(root).read_range(rel, "any", "A1:B2")


def test_large_ranges_are_cut_with_a_hint(tmp_path: Path) -> None:
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Data"
    for r in range(1, 2001):
        sheet.append([f"item {r}", r * 1.5, r])
    workbook.save(tmp_path / "big.xlsx")
    text = Sheets(tmp_path).read_range("big.xlsx", "Data", "A1:C2000")
    assert "characters cut" in text and "smaller range" in text
    assert "2000 | item 2000 | 3000 | 2000" in text


def test_rounded_multiples_in_a_comps_sheet_are_recomputed_like_excel(tmp_path: Path) -> None:
    facts = make_world("test", 3, 1, Domain.BANKING)
    write_xlsx(comps_workbook(facts), tmp_path / "comps.xlsx")
    before = book(tmp_path, "comps.xlsx")
    for i, peer in enumerate(facts.peers, start=2):  # the writer's cached values, read back
        assert before.cell("Comps", f"D{i}").value == peer.multiple
    peer = facts.peers[0]
    report = Sheets(tmp_path).edit_cells("comps.xlsx", "Comps", {"C2": peer.ebitda * 2})
    expected = float(Decimal(repr(peer.enterprise_value / (peer.ebitda * 2)))
                     .quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))
    after = book(tmp_path, "comps.xlsx")
    assert after.cell("Comps", "D2").value == expected
    assert f"formula value Comps!D2: {peer.multiple} -> {expected}" in report
    for i, other in enumerate(facts.peers[1:], start=3):
        assert after.cell("Comps", f"D{i}").value == other.multiple
