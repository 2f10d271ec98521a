"""Render a `Document` as a PDF with reportlab's platypus layout engine.

Each page is a `BaseDocTemplate` page with one frame per column. The first page also has a
full-width frame on top, sized to the title, so the title spans both columns of a two-column
document while the body flows left column, right column, next page. Two columns are the case that
matters: text extraction that reads the page line by line interleaves the two columns, so a world
can ask an agent to read a layout that defeats naive tools. Tables span one column.

Output is byte-for-byte reproducible: reportlab's invariant mode removes the wall clock and the
random file ID, and a date formatter replaces invariant mode's fixed 2000-01-01 with the model's
date as the creation and modification date. Text uses the 14 standard fonts (WinAnsi encoding), so
nothing is embedded and characters outside Latin-1 plus a few typographic marks do not render.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, StyleSheet1, getSampleStyleSheet
from reportlab.lib.units import cm
from reportlab.pdfgen.canvas import Canvas
from reportlab.platypus import (
    BaseDocTemplate,
    Flowable,
    Frame,
    FrameBreak,
    PageTemplate,
    TableStyle,
)
from reportlab.platypus import Paragraph as PdfParagraph
from reportlab.platypus import Table as PdfTable

from kwrl.worlds.docmodel import Block, ColumnBreak, Document, Table
from kwrl.worlds.writers.text import cell_text

PAGE_WIDTH, PAGE_HEIGHT = A4
MARGIN = 2 * cm
COLUMN_GAP = 0.8 * cm
FRAME_PADDING = 6  # points; reportlab's default on every side of a frame
PARAGRAPH_STYLES = {
    "body": "BodyText",
    "numbered": "BodyText",
    "bullet": "Bullet",
    "heading1": "Heading2",
    "heading2": "Heading3",
}
GRID_STYLE = TableStyle(
    [
        ("GRID", (0, 0), (-1, -1), 0.5, colors.grey),
        ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ]
)


def write_pdf(doc: Document, path: Path) -> None:
    """Write `doc` as a PDF laid out in `doc.columns` columns, the title spanning all of them."""
    if doc.columns < 1:
        raise ValueError(f"a document needs at least one column, got {doc.columns}")
    styles = _styles()
    title = PdfParagraph(escape(doc.title), styles["Title"])
    title_height = title.wrap(PAGE_WIDTH - 2 * MARGIN - 2 * FRAME_PADDING, PAGE_HEIGHT)[1]
    template = BaseDocTemplate(
        str(path),
        pagesize=A4,
        leftMargin=MARGIN,
        rightMargin=MARGIN,
        topMargin=MARGIN,
        bottomMargin=MARGIN,
        title=doc.title,
        author=doc.author,
        creator="kwrl",
        subject="",
        invariant=1,
    )
    template.addPageTemplates(_page_templates(doc.columns, title_height + 2 * FRAME_PADDING))
    column_width = template.pageTemplates[-1].frames[0].width - 2 * FRAME_PADDING
    story: list[Flowable] = [title, FrameBreak()]
    for block in doc.blocks:
        story.extend(_flowables(block, styles, column_width))
    template.build(story, canvasmaker=_canvas_dated(doc))


def _page_templates(columns: int, title_frame_height: float) -> list[PageTemplate]:
    """The first page: a title frame over the columns; every later page: columns only."""
    body_height = PAGE_HEIGHT - 2 * MARGIN
    first = [
        Frame(
            MARGIN,
            PAGE_HEIGHT - MARGIN - title_frame_height,
            PAGE_WIDTH - 2 * MARGIN,
            title_frame_height,
            id="title",
        )
    ]
    first += _column_frames(columns, body_height - title_frame_height, "first")
    return [
        PageTemplate("first", frames=first, onPage=_draw_page_number, autoNextPageTemplate="later"),
        PageTemplate(
            "later", frames=_column_frames(columns, body_height, "later"), onPage=_draw_page_number
        ),
    ]


def _column_frames(columns: int, height: float, prefix: str) -> list[Frame]:
    width = (PAGE_WIDTH - 2 * MARGIN - (columns - 1) * COLUMN_GAP) / columns
    return [
        Frame(MARGIN + i * (width + COLUMN_GAP), MARGIN, width, height, id=f"{prefix}-column{i}")
        for i in range(columns)
    ]


def _draw_page_number(canvas: Canvas, _template: BaseDocTemplate) -> None:
    canvas.saveState()
    canvas.setFont("Helvetica", 8)
    canvas.drawCentredString(PAGE_WIDTH / 2, MARGIN / 2, str(canvas.getPageNumber()))
    canvas.restoreState()


def _canvas_dated(doc: Document) -> Callable[..., Canvas]:
    """A canvas factory whose PDF carries `doc.date` as creation and modification date."""
    stamp = f"D:{doc.date:%Y%m%d}000000+00'00'"

    def make_canvas(*args: object, **kwargs: object) -> Canvas:
        canvas = Canvas(*args, **kwargs)
        canvas.setDateFormatter(lambda *_: stamp)
        return canvas

    return make_canvas


def _styles() -> StyleSheet1:
    styles = getSampleStyleSheet()
    for heading in ("Heading2", "Heading3"):
        # A heading never ends a column without the text it introduces.
        styles[heading].keepWithNext = 1
    styles["Bullet"].leftIndent = 14
    styles["Bullet"].bulletIndent = 4
    styles.add(ParagraphStyle("Cell", parent=styles["BodyText"], fontSize=9, leading=11))
    styles.add(ParagraphStyle("HeaderCell", parent=styles["Cell"], fontName="Helvetica-Bold"))
    # keepWithNext: a caption never ends a column without its table.
    styles.add(
        ParagraphStyle(
            "Caption", parent=styles["Italic"], spaceBefore=6, spaceAfter=3, keepWithNext=1
        )
    )
    return styles


def _flowables(block: Block, styles: StyleSheet1, width: float) -> list[Flowable]:
    if isinstance(block, ColumnBreak):
        return [FrameBreak()]
    if isinstance(block, Table):
        return _table(block, styles, width)
    bullet = "\N{BULLET}" if block.style == "bullet" else None
    style = styles[PARAGRAPH_STYLES[block.style]]
    return [PdfParagraph(escape(block.text), style, bulletText=bullet)]


def _table(table: Table, styles: StyleSheet1, width: float) -> list[Flowable]:
    header = [PdfParagraph(escape(text), styles["HeaderCell"]) for text in table.header]
    rows = [
        [PdfParagraph(escape(cell_text(value)), styles["Cell"]) for value in row]
        for row in table.rows
    ]
    grid = PdfTable(
        [header, *rows],
        colWidths=_column_widths(table, width),
        repeatRows=1,
        hAlign="LEFT",
        style=GRID_STYLE,
        spaceBefore=6,
        spaceAfter=6,
    )
    if not table.caption:
        return [grid]
    return [PdfParagraph(escape(table.caption), styles["Caption"]), grid]


def _column_widths(table: Table, width: float) -> list[float]:
    """Share `width` among the columns in proportion to their longest text (at least 4 chars)."""
    lengths = [len(text) for text in table.header]
    for row in table.rows:
        lengths = [
            max(length, len(cell_text(value))) for length, value in zip(lengths, row, strict=True)
        ]
    weights = [min(max(length, 4), 40) for length in lengths]
    return [width * weight / sum(weights) for weight in weights]
