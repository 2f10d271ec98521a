"""Plain-text renderings of a document: Markdown, aligned plain text and CSV.

These are the formats an agent can read without a parser, so they stay close to what a person
would type: Markdown headings and pipe tables, plain text with underlined headings and
space-aligned columns, RFC 4180 CSV. `cell_text` is the one place a table cell becomes text, so a
value reads the same in every format (the PDF, docx and pptx writers use it too).

Numbers are rendered with `str`; a world that wants `$1,200.00` passes that string.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kwrl.worlds.docmodel import CellValue, ColumnBreak, Document, Paragraph, Table


def cell_text(value: CellValue) -> str:
    """How a table cell reads as text: empty for None, `str` otherwise."""
    return "" if value is None else str(value)


def write_markdown(doc: Document, path: Path) -> None:
    """Render `doc` as Markdown: `#` title, `##`/`###` headings, `-` bullets, pipe tables."""
    sections = [f"# {doc.title}"]
    for block in doc.blocks:
        if isinstance(block, ColumnBreak):
            continue
        sections.append(
            _markdown_table(block) if isinstance(block, Table) else _markdown_paragraph(block)
        )
    path.write_text(_join_blocks(sections), encoding="utf-8")


def write_text(doc: Document, path: Path) -> None:
    """Render `doc` as plain text: underlined headings, `-` bullets, space-aligned tables."""
    sections = [_underlined(doc.title, "=")]
    for block in doc.blocks:
        if isinstance(block, ColumnBreak):
            continue
        sections.append(
            _plain_table(block) if isinstance(block, Table) else _plain_paragraph(block)
        )
    path.write_text(_join_blocks(sections), encoding="utf-8")


def write_csv(table: Table, path: Path) -> None:
    """Write the header and rows of `table` as CSV (the caption has no place in CSV)."""
    with path.open("w", encoding="utf-8", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(table.header)
        writer.writerows([cell_text(value) for value in row] for row in table.rows)


def _join_blocks(sections: list[str]) -> str:
    # Consecutive list items stay together; everything else is separated by a blank line.
    text = ""
    for section in sections:
        if text:
            both_items = _is_list_item(section) and _is_list_item(text.rsplit("\n", 1)[-1])
            text += "\n" if both_items else "\n\n"
        text += section
    return text + "\n"


def _is_list_item(line: str) -> bool:
    return line.startswith("- ")


def _markdown_paragraph(paragraph: Paragraph) -> str:
    prefix = {"heading1": "## ", "heading2": "### ", "bullet": "- "}.get(paragraph.style, "")
    return prefix + paragraph.text


def _markdown_table(table: Table) -> str:
    def row_line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    lines = [f"*{table.caption}*", ""] if table.caption else []
    lines.append(row_line(list(table.header)))
    lines.append("|" + "|".join("---" for _ in table.header) + "|")
    lines.extend(row_line([cell_text(value) for value in row]) for row in table.rows)
    return "\n".join(lines)


def _plain_paragraph(paragraph: Paragraph) -> str:
    if paragraph.style == "heading1":
        return _underlined(paragraph.text, "-")
    if paragraph.style == "heading2":
        return paragraph.text
    if paragraph.style == "bullet":
        return f"- {paragraph.text}"
    return paragraph.text


def _plain_table(table: Table) -> str:
    grid = [list(table.header)] + [[cell_text(value) for value in row] for row in table.rows]
    widths = [max(len(row[column]) for row in grid) for column in range(len(table.header))]

    def row_line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True)
        ).rstrip()

    lines = [table.caption] if table.caption else []
    lines.append(row_line(grid[0]))
    lines.append("  ".join("-" * width for width in widths))
    lines.extend(row_line(row) for row in grid[1:])
    return "\n".join(lines)


def _underlined(text: str, mark: str) -> str:
    return f"{text}\n{mark * len(text)}"
