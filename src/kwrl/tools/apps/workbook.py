"""Spreadsheet files for the sheets app: read every cell with formula and value, save with values.

Reading loads the workbook twice, as the grader's extractor does: once for formulas and literal
values, once (`data_only`) for the values a spreadsheet program cached for the formulas.
openpyxl cannot give both in one pass. CSV files read as one sheet of text cells.

Saving is where openpyxl loses information: it writes every formula with an empty cached value.
`save_workbook` therefore recomputes all formulas of the book (`formulas.evaluate_workbook`),
writes the package to memory, puts the values back into each worksheet part with the world
writer's own patch (`cached_values_patch`), and replaces the file atomically. The result tells
the caller which formula values changed and which could not be computed.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kwrl.tools.apps.base import atomic_write, corrupt
from kwrl.tools.apps.formulas import CellKey, Value, evaluate_workbook
from kwrl.tools.errors import ToolError
from kwrl.worlds.writers.ooxml import PartPatch, normalize_package
from kwrl.worlds.writers.spreadsheet import cached_values_patch

XLSX_SUFFIXES = (".xlsx", ".xlsm")
CSV_SUFFIXES = (".csv", ".tsv")


@dataclass(frozen=True)
class Cell:
    value: Value
    """The literal value, or the cached value of a formula (None when there is none)."""
    formula: str | None = None


@dataclass
class Grid:
    """One sheet's non-empty cells by (row, column), both 1-based."""

    name: str
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)

    @property
    def max_row(self) -> int:
        return max((r for r, _ in self.cells), default=0)

    @property
    def max_col(self) -> int:
        return max((c for _, c in self.cells), default=0)


@dataclass
class Recalc:
    """What a save did to the formulas of the book."""

    computed: int = 0
    changed: list[tuple[str, str, Value, Value]] = field(default_factory=list)
    """(sheet, address, old cached value, new value): new formulas, and formulas that read an
    edited cell (directly or through other formulas) and whose value moved."""
    refreshed: int = 0
    """Other formulas whose new value differs from the value cached before (a stale cache)."""
    failed: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(sheet, address, formula, reason) for formulas left without a cached value."""


def read_grids(path: Path, rel: str) -> dict[str, Grid]:
    """Every sheet of an xlsx (or the one sheet of a csv, named after the file) by name."""
    if path.suffix.lower() in CSV_SUFFIXES:
        return {path.stem: _csv_grid(path, rel)}
    import openpyxl

    try:
        raw = _load_cells(openpyxl.load_workbook(path, read_only=True, data_only=False))
        cached: dict[str, dict[tuple[int, int], tuple[bool, Any]]] = {}
        if any(is_formula for cells in raw.values() for is_formula, _ in cells.values()):
            cached = _load_cells(openpyxl.load_workbook(path, read_only=True, data_only=True))
    except Exception as exc:  # openpyxl raises zip, XML and key errors on damaged files
        raise corrupt(rel, "an xlsx workbook", exc) from exc
    grids = {}
    for name, cells in raw.items():
        grid = Grid(name)
        for key, (is_formula, value) in cells.items():
            if is_formula:
                grid.cells[key] = Cell(_plain(cached.get(name, {}).get(key, (False, None))[1]),
                                       value)
            else:
                grid.cells[key] = Cell(_plain(value))
        grids[name] = grid
    return grids


def _load_cells(book: Any) -> dict[str, dict[tuple[int, int], tuple[bool, Any]]]:
    """Each sheet's (row, col) -> (is a formula, value); formulas come as `=...` text."""
    try:
        sheets = {}
        for ws in book.worksheets:
            ws.reset_dimensions()  # a stale <dimension> would cut a read-only sheet short
            cells = {}
            for row in ws.iter_rows():
                for cell in row:
                    if cell.value is None:
                        continue
                    value = cell.value
                    is_formula = cell.data_type == "f"
                    if is_formula and not isinstance(value, str):
                        value = "=" + str(getattr(value, "text", value)).lstrip("=")
                    cells[(cell.row, cell.column)] = (is_formula, value)
            sheets[ws.title] = cells
        return sheets
    finally:
        book.close()


def _plain(value: Any) -> Value:
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _csv_grid(path: Path, rel: str) -> Grid:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise corrupt(rel, "UTF-8 text", exc) from exc
    grid = Grid(path.stem)
    for r, row in enumerate(csv.reader(io.StringIO(text), delimiter=delimiter), start=1):
        for c, value in enumerate(row, start=1):
            if value != "":
                grid.cells[(r, c)] = Cell(value)
    return grid


def open_book(path: Path, rel: str) -> Any:
    """The workbook for editing (formulas kept); a ToolError for a csv or a damaged file."""
    if path.suffix.lower() in CSV_SUFFIXES:
        raise ToolError(f"{rel} is a CSV file: sheets edits .xlsx workbooks; create one with "
                        "sheets_create, or change the CSV with the code tools")
    import openpyxl

    try:
        return openpyxl.load_workbook(path, keep_vba=path.suffix.lower() == ".xlsm")
    except Exception as exc:
        raise corrupt(rel, "an xlsx workbook", exc) from exc


def save_workbook(book: Any, path: Path, old: dict[str, Grid] | None = None,
                  edited: set[CellKey] | None = None) -> Recalc:
    """Recompute every formula, save `book` to `path` with the values cached, atomically.

    `old` (the book as read before the edit) and `edited` (the cells the edit set) let the
    result say which formula values the edit moved.
    """
    from openpyxl.utils.datetime import to_excel

    values: dict[str, dict[str, Value]] = {}
    formulas: dict[str, dict[str, str]] = {}
    recalc = Recalc()
    for ws in book.worksheets:
        values[ws.title], formulas[ws.title] = {}, {}
        # The cells that exist, not `iter_rows`: that walks (and creates) every cell of the
        # bounding box, millions for a sheet with one far-away cell.
        for cell in list(ws._cells.values()):
            value = cell.value
            if value is None:
                continue
            if cell.data_type != "f":
                is_date = isinstance(value, dt.date | dt.datetime)
                values[ws.title][cell.coordinate] = to_excel(value) if is_date else value
            elif isinstance(value, str):
                formulas[ws.title][cell.coordinate] = value
            else:
                text = "=" + str(getattr(value, "text", "")).lstrip("=")
                recalc.failed.append((ws.title, cell.coordinate, text,
                                      "array formulas are not evaluated"))
    evaluation = evaluate_workbook(values, formulas)
    computed = evaluation.values
    recalc.computed = sum(len(cells) for cells in computed.values())
    for sheet, cells in evaluation.failed.items():
        for address, reason in cells.items():
            recalc.failed.append((sheet, address, formulas[sheet][address], reason))
    affected = evaluation.affected_by(edited or set())
    for sheet, address, before, new in _changes(computed, formulas, old or {}):
        if before is None or (sheet, address) in affected:
            recalc.changed.append((sheet, address, before.value if before else None, new))
        elif before.value != new:
            recalc.refreshed += 1
    buffer = io.BytesIO()
    book.save(buffer)
    # openpyxl names worksheet parts while saving; only then does `ws.path` mean anything.
    patches: dict[str, PartPatch] = {
        ws.path.lstrip("/"): cached_values_patch(computed.get(ws.title, {}))
        for ws in book.worksheets
    }
    atomic_write(path, normalize_package(buffer.getvalue(), dt.date.today(), patches))
    return recalc


def _changes(computed: dict[str, dict[str, Value]], formulas: dict[str, dict[str, str]],
             old: dict[str, Grid]) -> list[tuple[str, str, Cell | None, Value]]:
    """(sheet, address, the cell before if it held the same formula, new value) per formula
    whose value is new or differs from the one cached before."""
    from openpyxl.utils.cell import column_index_from_string, coordinate_from_string

    changes = []
    for sheet, cells in computed.items():
        for address, new in cells.items():
            letters, row = coordinate_from_string(address)
            before = old.get(sheet, Grid(sheet)).cells.get((row, column_index_from_string(letters)))
            if before is None or before.formula != formulas[sheet][address]:
                changes.append((sheet, address, None, new))
            elif before.value != new:
                changes.append((sheet, address, before, new))
    return changes
