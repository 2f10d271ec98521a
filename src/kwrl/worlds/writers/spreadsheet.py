"""Render a `Workbook` as an xlsx file whose formulas carry the values Excel would have cached.

A real spreadsheet stores each formula together with its last computed value, and most readers
(pandas, `openpyxl.load_workbook(data_only=True)`, an agent's quick script) only see that cached
value. openpyxl writes formulas with an empty `<v/>`, so after it saves we fill in each formula
cell's `<v>` from `Formula.cached` (numbers as numbers, text with `t="str"`) while the package
passes through `normalize_package`. The formula itself stays, so `data_only=False` still reads
`=SUM(B2:B5)`.

Row 1 of every sheet is treated as a header and set in bold; column widths follow the longest
text in each column so the file opens readable.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import openpyxl
from lxml import etree
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter
from openpyxl.worksheet.worksheet import Worksheet

from kwrl.worlds.docmodel import CellValue, Formula, Sheet, Workbook
from kwrl.worlds.writers.ooxml import PartPatch, normalize_package, package_datetime

SPREADSHEET_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
MAX_COLUMN_WIDTH = 60

CachedValues = Mapping[str, CellValue]
"""Cell reference (`B6`) to the cached value of the formula in that cell."""


def write_xlsx(wb: Workbook, path: Path) -> None:
    """Write `wb` as an .xlsx, one worksheet per sheet, formulas with their cached values."""
    book = openpyxl.Workbook()
    book.remove(book.active)
    book.properties.creator = wb.author
    book.properties.lastModifiedBy = wb.author
    book.properties.created = package_datetime(wb.date)
    book.properties.modified = package_datetime(wb.date)
    cached_by_sheet = [_fill_sheet(book.create_sheet(sheet.name), sheet) for sheet in wb.sheets]
    buffer = io.BytesIO()
    book.save(buffer)
    # openpyxl numbers worksheet parts while saving; only then does `worksheet.path` name one.
    patches: dict[str, PartPatch] = {
        worksheet.path.lstrip("/"): partial(_add_cached_values, cached=cached)
        for worksheet, cached in zip(book.worksheets, cached_by_sheet, strict=True)
    }
    path.write_bytes(normalize_package(buffer.getvalue(), wb.date, patches))


def _fill_sheet(worksheet: Worksheet, sheet: Sheet) -> dict[str, CellValue]:
    """Write the cells of `sheet`; return the cached value of every formula by cell reference."""
    cached: dict[str, CellValue] = {}
    header_font = Font(bold=True)
    for row_index, row in enumerate(sheet.rows, start=1):
        for column_index, value in enumerate(row, start=1):
            if value is None:
                continue
            cell = worksheet.cell(row=row_index, column=column_index)
            if isinstance(value, Formula):
                cell.value = value.expr
                cached[cell.coordinate] = value.cached
            else:
                cell.value = value
                if isinstance(value, str):
                    # openpyxl would take text such as "=total" for a formula.
                    cell.data_type = "s"
            if row_index == 1:
                cell.font = header_font
    _fit_column_widths(worksheet, sheet)
    return cached


def cached_values_patch(cached: CachedValues) -> PartPatch:
    """A `normalize_package` patch that writes `cached` into one worksheet part's formula cells.

    For code that saves a workbook with openpyxl and must put the cached values back (the
    sheets app after an edit); a formula whose value is None is left without one.
    """
    return partial(_add_cached_values, cached=cached)


def _fit_column_widths(worksheet: Worksheet, sheet: Sheet) -> None:
    widths: dict[int, int] = {}
    for row in sheet.rows:
        for column_index, value in enumerate(row, start=1):
            shown = value.cached if isinstance(value, Formula) else value
            length = len(str(shown)) if shown is not None else 0
            widths[column_index] = max(widths.get(column_index, 0), length)
    for column_index, width in widths.items():
        letter = get_column_letter(column_index)
        worksheet.column_dimensions[letter].width = min(width + 2, MAX_COLUMN_WIDTH)


def _add_cached_values(sheet_xml: bytes, cached: CachedValues) -> bytes:
    """Put each formula's cached value into its `<v>`; formulas without one keep an empty cell."""
    root = etree.fromstring(sheet_xml)
    for cell in root.iter(f"{{{SPREADSHEET_NS}}}c"):
        reference = cell.get("r")
        formula = cell.find(f"{{{SPREADSHEET_NS}}}f")
        if formula is None or reference not in cached:
            continue
        value = cached[reference]
        for stale in cell.findall(f"{{{SPREADSHEET_NS}}}v"):
            cell.remove(stale)
        if value is None:
            continue
        cell.set("t", _cached_type(value))
        # <v> must follow <f> (CT_Cell: f, v, is, extLst).
        formula.addnext(_value_element(value))
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)


def _cached_type(value: str | int | float) -> str:
    # `str` is a formula's text result (not a shared string); bool is checked before int.
    if isinstance(value, str):
        return "str"
    return "b" if isinstance(value, bool) else "n"


def _value_element(value: str | int | float) -> etree._Element:
    element = etree.Element(f"{{{SPREADSHEET_NS}}}v")
    if isinstance(value, str):
        element.text = value
    elif isinstance(value, bool):
        element.text = "1" if value else "0"
    else:
        element.text = repr(value)
    return element
