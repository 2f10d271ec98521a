"""The sheets app: read, search and edit spreadsheets (xlsx; csv read-only) by cell address.

Two output shapes. Reading a range prints a grid, one line per row with its row number and
column letters in the first line, so every value has an address a model can edit:
`6 | Total | 209.2 [=SUM(B2:B5)]`; a formula cell shows its value first (where every other
cell's value is) and the formula in brackets, `?` when there is no cached value. Searching
prints whole matching rows as `Sheet!row N: B6 Q1 2024=209.2 | ...`, each cell labelled with its
address and its column header (row 1), so the row that answers a question is self-describing.

Every edit saves at once, atomically, with all formulas recomputed (see `workbook.py`); the
result lists the formula values that changed and any formula left without a value.
"""

from __future__ import annotations

import re

from openpyxl.utils.cell import (
    column_index_from_string,
    get_column_letter,
    range_boundaries,
)

from kwrl.tools.apps.base import App, hit_list, matches, plural, terms, value_text
from kwrl.tools.apps.workbook import (
    CSV_SUFFIXES,
    XLSX_SUFFIXES,
    Cell,
    Grid,
    Recalc,
    open_book,
    read_grids,
    save_workbook,
)
from kwrl.tools.errors import ToolError
from kwrl.tools.truncate import truncate

CellInput = str | float | int | None
MAX_LISTED_CHANGES = 20
_CELL_REF = re.compile(r"^\$?([A-Za-z]{1,3})\$?(\d+)$")
_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?$")
_BAD_SHEET_CHARS = set("[]:*?/\\")


def _shown(cell: Cell | None) -> str:
    if cell is None:
        return ""
    if cell.formula is None:
        return value_text(cell.value)
    value = "?" if cell.value is None else value_text(cell.value)
    return f"{value} [{cell.formula}]"


def _value(cell: Cell | None) -> str:
    return "" if cell is None else value_text(cell.value)


def _grid_lines(grid: Grid, r1: int, r2: int, c1: int, c2: int) -> list[str]:
    """The non-empty rows of the area, under a line naming its non-empty columns.

    Built from the cells that exist, never by walking the area: a sheet with one far-away
    cell spans a billion addresses.
    """
    inside = [(r, c) for r, c in grid.cells if r1 <= r <= r2 and c1 <= c <= c2]
    cols = sorted({c for _, c in inside})
    lines = ["row | " + " | ".join(get_column_letter(c) for c in cols)]
    for r in sorted({r for r, _ in inside}):
        lines.append(f"{r} | " + " | ".join(_shown(grid.cells.get((r, c))) for c in cols))
    return lines


def _coerce(value: CellInput) -> CellInput | bool:
    """What a typed value becomes in the sheet: numeric text is a number, as Excel does it."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("'"):
            return text[1:]
        if _NUMBER.match(text):
            return float(text) if "." in text else int(text)
    return value


def _address(ref: str) -> tuple[int, int]:
    match = _CELL_REF.match(ref.strip())
    if match is None:
        raise ToolError(f"'{ref}' is not a cell address; use A1 notation such as B7")
    col, row = column_index_from_string(match[1].upper()), int(match[2])
    if row < 1 or row > 1_048_576 or col > 16_384:
        raise ToolError(f"'{ref}' is outside a worksheet (A1:XFD1048576)")
    return row, col


class Sheets(App):
    """Spreadsheets: list sheets, read ranges, search rows, edit cells (xlsx; csv read-only)."""

    name = "sheets"
    suffixes = (*XLSX_SUFFIXES, *CSV_SUFFIXES)

    def list_sheets(self, path: str) -> str:
        """List the sheets of a workbook with their used range and their header row (row 1).

        Args:
            path: .xlsx (or .csv) file relative to the workspace root.
        """
        grids = read_grids(self._file(path), path)
        lines = [f"{path}: {plural(len(grids), 'sheet')}"]
        for grid in grids.values():
            if not grid.cells:
                lines.append(f"sheet={grid.name} | empty")
                continue
            header = [value_text(grid.cells[k].value) for k in sorted(grid.cells) if k[0] == 1]
            lines.append(f"sheet={grid.name} | range=A1:{get_column_letter(grid.max_col)}"
                         f"{grid.max_row} | rows={grid.max_row} | cols={grid.max_col} | "
                         f"row 1: {' | '.join(header[:15])}")
        return truncate("\n".join(lines), hint="use sheets_read_range on one sheet")

    def read_range(self, path: str, sheet: str, range: str) -> str:
        """Read a range such as `A1:D10` (or `B7`, or `A:C`): one line per row, columns lettered.

        Formula cells show `value [=formula]`; `?` means no cached value.

        Args:
            path: .xlsx (or .csv) file relative to the workspace root.
            sheet: sheet name (see sheets_list_sheets; a csv has one sheet, any name works).
            range: A1-style range; `Sheet!A1:D10` also works.
        """
        area = range.strip()
        if "!" in area:
            sheet, area = area.rsplit("!", 1)
            sheet = sheet.strip("'")
        grid = self._grid(path, sheet)
        try:
            c1, r1, c2, r2 = range_boundaries(area.replace("$", "").upper())
        except (ValueError, TypeError) as exc:
            raise ToolError(f"'{area}' is not a range; use A1 notation such as A1:D10") from exc
        r1, r2 = r1 or 1, r2 or max(grid.max_row, 1)
        c1, c2 = c1 or 1, c2 or max(grid.max_col, 1)
        return self._render(grid, r1, r2, c1, c2, "use sheets_read_range with a smaller range")

    def read_sheet(self, path: str, sheet: str, max_rows: int = 50) -> str:
        """Read the first `max_rows` rows of a sheet, all columns, one line per row.

        Args:
            path: .xlsx (or .csv) file relative to the workspace root.
            sheet: sheet name (see sheets_list_sheets).
            max_rows: rows to show from row 1 (the rest: sheets_read_range).
        """
        grid = self._grid(path, sheet)
        last = min(grid.max_row, max(1, max_rows))
        text = self._render(grid, 1, max(last, 1), 1, max(grid.max_col, 1),
                            "use sheets_read_range for a part of the sheet")
        if grid.max_row > last:
            end = get_column_letter(grid.max_col)
            text += (f"\n[rows 1-{last} of {grid.max_row} shown; read more with "
                     f"sheets_read_range range='A{last + 1}:{end}{min(grid.max_row, last * 2)}']")
        return text

    def search(self, path: str, query: str, sheet: str | None = None) -> str:
        """Find rows containing all words of `query` (matched with the header row, row 1).

        Each hit is a whole row: `Sheet!row 3: A3 Segment=Retail | B3 Q1 2024=45.5 | ...`,
        every cell labelled with its address and column header. Formula cells show their value.

        Args:
            path: .xlsx (or .csv) file relative to the workspace root.
            query: words that must all appear in the row or its header.
            sheet: only this sheet (default: every sheet).
        """
        words = terms(query)
        grids = read_grids(self._file(path), path)
        chosen = [self._pick(grids, sheet, path)] if sheet else list(grids.values())
        hits = []
        for grid in chosen:
            header = {c: value_text(cell.value) for (r, c), cell in grid.cells.items() if r == 1}
            by_row: dict[int, set[int]] = {}
            for r, c in grid.cells:
                by_row.setdefault(r, set()).add(c)
            for row in sorted(by_row):
                # Empty cells under a header are shown too: they are what an edit fills in.
                cols = sorted(by_row[row] | set(header))
                cells = [(c, _value(grid.cells.get((row, c)))) for c in cols]
                context = " ".join(v for _, v in cells) + " " + " ".join(
                    header.get(c, "") for c, _ in cells)
                if matches(words, context):
                    hits.append(_row_line(grid.name, row, cells, header))
        where = f"{path}" + (f"!{sheet}" if sheet else "")
        return truncate(hit_list(hits, query, where), hint="add a sheet or more words")

    def edit_cells(self, path: str, sheet: str, updates: dict[str, CellInput]) -> str:
        """Set cells by address and save: `{"D5": 45.5, "A9": "Total", "B9": "=SUM(B2:B8)"}`.

        Numbers stay numbers (numeric text becomes a number; start with ' to keep it text);
        text starting with = is a formula; null clears the cell. All formulas of the workbook
        are recomputed; the result lists the values that changed.

        Args:
            path: .xlsx file relative to the workspace root.
            sheet: sheet name.
            updates: cell address -> new value.
        """
        if not updates:
            raise ToolError("updates is empty; give cell addresses and values like {\"B7\": 12}")
        file = self._file(path)
        old = read_grids(file, path)
        name = self._pick(old, sheet, path).name
        targets = {ref: _address(ref) for ref in updates}
        book = open_book(file, path)
        ws = book[name]
        done = []
        for ref, value in updates.items():
            row, col = targets[ref]
            before = _shown(old[name].cells.get((row, col))) or "empty"
            try:
                ws.cell(row=row, column=col).value = _coerce(value)
            except AttributeError as exc:  # openpyxl's MergedCell has a read-only value
                raise ToolError(f"{name}!{ref} is inside a merged cell; set the merged range's "
                                "first cell instead") from exc
            except ValueError as exc:  # e.g. control characters openpyxl refuses to store
                raise ToolError(f"{name}!{ref} cannot hold that value ({exc})") from exc
            after = value_text(_coerce(value)) or "empty"
            done.append(f"{name}!{get_column_letter(col)}{row}: {before} -> {after}")
        edited = {(name, f"{get_column_letter(c)}{r}") for r, c in targets.values()}
        return _edit_report(path, done, save_workbook(book, file, old, edited))

    def append_rows(self, path: str, sheet: str, rows: list[list[CellInput]]) -> str:
        """Append rows below the last used row of a sheet and save; values as in edit_cells.

        Args:
            path: .xlsx file relative to the workspace root.
            sheet: sheet name.
            rows: rows of cell values, column A first.
        """
        if not rows:
            raise ToolError("rows is empty; give rows like [[\"Retail\", 45.5]]")
        file = self._file(path)
        old = read_grids(file, path)
        grid = self._pick(old, sheet, path)
        book = open_book(file, path)
        ws = book[grid.name]
        first = grid.max_row + 1
        for offset, row in enumerate(rows):
            for col, value in enumerate(row, start=1):
                if value is not None:
                    ws.cell(row=first + offset, column=col).value = _coerce(value)
        last = first + len(rows) - 1
        width = max((len(r) for r in rows), default=1)
        done = [f"appended {plural(len(rows), 'row')} to {grid.name}: "
                f"A{first}:{get_column_letter(max(width, 1))}{last}"]
        edited = {(grid.name, f"{get_column_letter(c)}{first + i}")
                  for i, row in enumerate(rows) for c in range(1, len(row) + 1)}
        return _edit_report(path, done, save_workbook(book, file, old, edited))

    def add_sheet(self, path: str, name: str) -> str:
        """Add an empty sheet to a workbook and save.

        Args:
            path: .xlsx file relative to the workspace root.
            name: the new sheet's name (at most 31 characters, none of [ ] : * ? / \\).
        """
        file = self._file(path)
        _check_sheet_name(name)
        old = read_grids(file, path)
        if name.lower() in {n.lower() for n in old}:
            raise ToolError(f"{path} already has a sheet named '{name}'; sheets: {', '.join(old)}")
        book = open_book(file, path)
        book.create_sheet(name)
        recalc = save_workbook(book, file, old)
        return _edit_report(path, [f"added sheet {name} (now: {', '.join(book.sheetnames)})"],
                            recalc)

    def create(self, path: str, sheet: str = "Sheet1", rows: list[list[CellInput]] | None = None
               ) -> str:
        """Create a new .xlsx workbook with one sheet, optionally filled with rows from A1.

        Args:
            path: new .xlsx file relative to the workspace root (must not exist).
            sheet: name of the first sheet.
            rows: rows of cell values (row 1 is usually the header); values as in edit_cells.
        """
        import openpyxl

        file = self._new_file(path, (".xlsx",))
        _check_sheet_name(sheet)
        book = openpyxl.Workbook()
        ws = book.active
        ws.title = sheet
        for r, row in enumerate(rows or [], start=1):
            for c, value in enumerate(row, start=1):
                if value is not None:
                    ws.cell(row=r, column=c).value = _coerce(value)
        recalc = save_workbook(book, file)
        done = [f"created {path} with sheet {sheet} ({plural(len(rows or []), 'row')})"]
        return _edit_report(path, done, recalc)

    def _grid(self, path: str, sheet: str) -> Grid:
        return self._pick(read_grids(self._file(path), path), sheet, path)

    def _pick(self, grids: dict[str, Grid], sheet: str, path: str) -> Grid:
        if path.lower().endswith(CSV_SUFFIXES):
            return next(iter(grids.values()))  # a csv has one sheet: any name reads it
        if sheet in grids:
            return grids[sheet]
        folded = [g for name, g in grids.items() if name.lower() == sheet.strip().lower()]
        if len(folded) == 1:
            return folded[0]
        raise ToolError(f"no sheet '{sheet}' in {path}; sheets: {', '.join(grids)}")

    def _render(self, grid: Grid, r1: int, r2: int, c1: int, c2: int, hint: str) -> str:
        lines = _grid_lines(grid, r1, r2, c1, c2)
        used = f"A1:{get_column_letter(max(grid.max_col, 1))}{max(grid.max_row, 1)}"
        area = f"{get_column_letter(c1)}{r1}:{get_column_letter(c2)}{r2}"
        if len(lines) == 1:
            where = f"the sheet's data is in {used}" if grid.cells else "the sheet is empty"
            return f"{grid.name}!{area} is empty; {where}"
        head = f"{grid.name}!{area} (sheet uses {used})"
        if any("? [=" in line for line in lines):
            head += "; ? = formula without a computed value"
        return truncate("\n".join([head, *lines]), hint=hint)


def _row_line(sheet: str, row: int, cells: list[tuple[int, str]], header: dict[int, str]
              ) -> str:
    parts = []
    for col, value in cells:
        address = f"{get_column_letter(col)}{row}"
        label = header.get(col, "") if row != 1 else ""
        parts.append(f"{address} {label}={value}" if label else f"{address}={value}")
    tag = " (header)" if row == 1 else ""
    return f"{sheet}!row {row}{tag}: " + " | ".join(parts)


def _check_sheet_name(name: str) -> None:
    if not name.strip() or len(name) > 31 or _BAD_SHEET_CHARS & set(name):
        raise ToolError(f"'{name}' is not a valid sheet name: 1-31 characters, none of "
                        "[ ] : * ? / \\")


def _edit_report(path: str, done: list[str], recalc: Recalc) -> str:
    lines = [f"saved {path}", *done]
    if recalc.computed or recalc.failed:
        lines.append(f"recomputed {plural(recalc.computed, 'formula')}")
    for sheet, address, old, new in recalc.changed[:MAX_LISTED_CHANGES]:
        before = "empty" if old is None else value_text(old)
        lines.append(f"formula value {sheet}!{address}: {before} -> {value_text(new)}")
    if len(recalc.changed) > MAX_LISTED_CHANGES:
        lines.append(f"[{len(recalc.changed) - MAX_LISTED_CHANGES} more formula values changed]")
    if recalc.refreshed:
        lines.append(f"{plural(recalc.refreshed, 'other formula value')} not affected by this "
                     "edit refreshed (the cached values were stale or rounded)")
    for sheet, address, formula, reason in recalc.failed:
        lines.append(f"NOT computed, no cached value: {sheet}!{address} {formula} ({reason})")
    return truncate("\n".join(lines), hint="read the cells with sheets_read_range")
