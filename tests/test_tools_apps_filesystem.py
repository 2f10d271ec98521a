"""The filesystem app on a generated world: listing, finding, reading and searching text files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kwrl.tools import ToolError
from kwrl.tools.apps import Filesystem
from kwrl.worlds.compose import Paths
from kwrl.worlds.facts import WorldFacts


@pytest.fixture
def fs(world: tuple[WorldFacts, Path]) -> Filesystem:
    return Filesystem(world[1])


def test_list_files_shows_folders_with_counts_then_files_with_sizes(fs: Filesystem) -> None:
    root = fs.list_files(".")
    assert root.splitlines()[0].startswith("./: ")
    assert "Reports/ (9 files)" in root
    reports = fs.list_files("Reports")
    assert "Reports/Quarterly_Report_Q1_2024.pdf | " in reports
    assert " KB" in reports


def test_tree_prints_full_relative_paths_to_the_given_depth(fs: Filesystem) -> None:
    shallow = fs.tree(".", depth=1)
    assert "Reports/ (9 files)" in shallow
    assert "Reports/Quarterly_Report_Q1_2024.pdf" not in shallow
    assert "  Reports/Quarterly_Report_Q1_2024.pdf" in fs.tree(".", depth=2)


def test_find_matches_globs_and_plain_words_on_names(world: tuple[WorldFacts, Path],
                                                     fs: Filesystem) -> None:
    q3 = fs.find("*Q3*").splitlines()
    on_disk = [p for p in world[1].rglob("*") if "q3" in p.name.lower()]
    assert q3[0] == f"{len(on_disk)} files match '*Q3*'"
    assert any(line.startswith("Reports/Quarterly_Report_Q3_2024.pdf | ") for line in q3)
    assert all("Q3" in line for line in q3[1:])
    assert "Mail/inbox.mbox" in fs.find("inbox")
    assert "Reports/Quarterly_Report_Q4_2025.pdf" in fs.find("reports/*q4_2025.pdf")
    assert fs.find("*.xyz").startswith("no files match '*.xyz'")


def test_search_returns_only_matching_lines_with_path_and_line_number(
        world: tuple[WorldFacts, Path], fs: Filesystem) -> None:
    facts = world[0]
    hits = fs.search("superseded use the final").splitlines()
    assert hits[0] == "1 match for 'superseded use the final' in the text files under ./"
    path, number, text = hits[1].split(":", 2)
    assert path == "Chat/channels.json"
    lines = (world[1] / path).read_text().splitlines()
    assert lines[int(number) - 1].strip() == text.strip()
    segment = facts.segments[0]
    value = str(facts.revenue[segment]["Q1 2025"])
    csv_hits = fs.search(f"{segment} {value}", "Data")
    assert "Data/segment_revenue_2025.csv:" in csv_hits
    assert all(segment in line for line in csv_hits.splitlines()[1:])


def test_search_without_hits_points_to_the_office_search_tools(fs: Filesystem) -> None:
    answer = fs.search("zzzunlikely")
    assert answer.startswith("no matches for 'zzzunlikely'")
    assert "pdf_search" in answer and "sheets_search" in answer


def test_info_describes_type_size_and_document_counts(
        world: tuple[WorldFacts, Path], fs: Filesystem) -> None:
    paths = Paths(world[0])
    pdf = fs.info(paths.report("Q1 2025"))
    assert "type=pdf" in pdf and "pages=1" in pdf and "pdf_read_pages" in pdf
    assert "sheets=Revenue, EBITDA, Margin, Notes" in fs.info(paths.financials)
    assert "type=folder | files=9" in fs.info("Reports")


def test_read_numbers_lines_and_pages_with_offset_and_limit(fs: Filesystem) -> None:
    first = fs.read("Chat/channels.json", limit=3)
    assert first.splitlines()[1] == "1: {"
    assert "[more: read with offset=3]" in first
    rest = fs.read("Chat/channels.json", offset=3, limit=2)
    assert rest.splitlines()[1].startswith("4: ")
    with pytest.raises(ToolError, match="use an offset below"):
        fs.read("Chat/channels.json", offset=10_000)


def test_read_sends_office_files_to_their_app(world: tuple[WorldFacts, Path],
                                              fs: Filesystem) -> None:
    paths = Paths(world[0])
    with pytest.raises(ToolError, match="not text; use sheets_list_sheets"):
        fs.read(paths.financials)
    with pytest.raises(ToolError, match="use pdf_read_pages"):
        fs.read(paths.report("Q1 2025"))
    with pytest.raises(ToolError, match="does not exist"):
        fs.read("Reports/nope.md")


def test_large_outputs_are_cut_with_a_note_on_reading_the_rest(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("".join(f"row {i} value {i * 3}\n" for i in range(2000)))
    fs = Filesystem(tmp_path)
    text = fs.read("big.txt", limit=2000)
    assert "characters cut" in text and "offset" in text
    assert "row 0 value 0" in text and "row 1999 value 5997" in text
    hits = fs.search("value")
    assert "[1900 more matches not shown" in hits


def test_outputs_are_never_empty(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("")
    fs = Filesystem(tmp_path)
    assert fs.list_files("empty") == "empty/ is empty"
    assert fs.read("blank.txt") == "blank.txt is empty (0 lines)"
    assert fs.tree("empty") == "empty/ is empty"


def test_a_copied_world_reads_the_same(world: tuple[WorldFacts, Path], tmp_path: Path) -> None:
    shutil.copytree(world[1], tmp_path / "copy")
    assert Filesystem(tmp_path / "copy").find("*Q3*") == Filesystem(world[1]).find("*Q3*")
