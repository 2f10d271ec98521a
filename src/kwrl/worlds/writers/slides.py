"""Render a `Deck` as a 16:9 PowerPoint file with python-pptx.

Graders address slide content by shape name, so every shape a writer places gets a fixed name:
"Title", "Body" (the bullets), "Table" and "Chart". Bullets go into the layout's body
placeholder, which draws real bullet glyphs from the slide master; slides without bullets use the
"Title Only" layout so no empty "Click to add text" box is left behind.

Below the title, the slide's body, table and chart share the content area side by side in that
order. Positions are computed, not inherited, because the default template's layouts are 4:3.
`Deck.title` becomes the file's title property rather than an extra slide, so slide N of the
model is slide N of the file. Chart data is embedded as an xlsx by python-pptx; the
`normalize_package` pass fixes its timestamps too.
"""

from __future__ import annotations

import io
from pathlib import Path

from pptx import Presentation
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE, XL_LEGEND_POSITION
from pptx.presentation import Presentation as PresentationFile
from pptx.shapes.base import BaseShape
from pptx.slide import Slide as PptxSlide
from pptx.text.text import TextFrame
from pptx.util import Emu, Inches, Length, Pt

from kwrl.worlds.docmodel import Chart, Deck, Slide, Table
from kwrl.worlds.writers.ooxml import normalize_package, package_datetime
from kwrl.worlds.writers.text import cell_text

SLIDE_WIDTH = Inches(13.333)
SLIDE_HEIGHT = Inches(7.5)
MARGIN = Inches(0.5)
GAP = Inches(0.3)
TITLE_HEIGHT = Inches(1.0)
CONTENT_TOP = Inches(1.5)
LAYOUT_TITLE_AND_CONTENT = 1
LAYOUT_TITLE_ONLY = 5
CHART_TYPES = {"bar": XL_CHART_TYPE.COLUMN_CLUSTERED, "line": XL_CHART_TYPE.LINE_MARKERS}

Box = tuple[Emu, Emu, Emu, Emu]
"""left, top, width, height."""


def write_pptx(deck: Deck, path: Path) -> None:
    """Write `deck` as a .pptx with named Title/Body/Table/Chart shapes and speaker notes."""
    presentation = Presentation()
    presentation.slide_width = SLIDE_WIDTH
    presentation.slide_height = SLIDE_HEIGHT
    _set_core_properties(presentation, deck)
    for slide in deck.slides:
        _add_slide(presentation, slide)
    buffer = io.BytesIO()
    presentation.save(buffer)
    path.write_bytes(normalize_package(buffer.getvalue(), deck.date))


def _set_core_properties(presentation: PresentationFile, deck: Deck) -> None:
    properties = presentation.core_properties
    properties.title = deck.title
    properties.author = deck.author
    properties.last_modified_by = deck.author
    properties.created = package_datetime(deck.date)
    properties.modified = package_datetime(deck.date)
    properties.revision = 1


def _add_slide(presentation: PresentationFile, slide: Slide) -> None:
    layout_index = LAYOUT_TITLE_AND_CONTENT if slide.bullets else LAYOUT_TITLE_ONLY
    pptx_slide = presentation.slides.add_slide(presentation.slide_layouts[layout_index])
    title = pptx_slide.shapes.title
    title.name = "Title"
    title.text = slide.title
    _place(title, (MARGIN, Inches(0.3), SLIDE_WIDTH - 2 * MARGIN, TITLE_HEIGHT))
    boxes = iter(_content_boxes(sum(map(bool, (slide.bullets, slide.table, slide.chart)))))
    if slide.bullets:
        _fill_body(pptx_slide, slide.bullets, next(boxes))
    if slide.table is not None:
        _add_table(pptx_slide, slide.table, next(boxes))
    if slide.chart is not None:
        _add_chart(pptx_slide, slide.chart, next(boxes))
    if slide.notes:
        pptx_slide.notes_slide.notes_text_frame.text = slide.notes


def _content_boxes(count: int) -> list[Box]:
    """Split the area below the title into `count` side-by-side boxes."""
    if count == 0:
        return []
    area_width = SLIDE_WIDTH - 2 * MARGIN
    width = Emu((area_width - (count - 1) * GAP) // count)
    height = Emu(SLIDE_HEIGHT - CONTENT_TOP - MARGIN)
    return [(Emu(MARGIN + i * (width + GAP)), CONTENT_TOP, width, height) for i in range(count)]


def _place(shape: BaseShape, box: Box) -> None:
    shape.left, shape.top, shape.width, shape.height = box


def _fill_body(pptx_slide: PptxSlide, bullets: tuple[str, ...], box: Box) -> None:
    body = pptx_slide.placeholders[1]
    body.name = "Body"
    _place(body, box)
    text_frame = body.text_frame
    text_frame.text = bullets[0]
    for bullet in bullets[1:]:
        text_frame.add_paragraph().text = bullet
    _set_font_size(text_frame, Pt(20 if len(bullets) <= 6 else 16))


def _add_table(pptx_slide: PptxSlide, table: Table, box: Box) -> None:
    left, top, width, height = box
    row_count = 1 + len(table.rows)
    row_height = Emu(min(Inches(0.5), height // row_count))
    frame = pptx_slide.shapes.add_table(
        row_count, len(table.header), left, top, width, Emu(row_height * row_count)
    )
    frame.name = "Table"
    grid = frame.table
    texts = [list(table.header)] + [[cell_text(value) for value in row] for row in table.rows]
    for row_index, row in enumerate(texts):
        for column_index, text in enumerate(row):
            cell = grid.cell(row_index, column_index)
            cell.text = text
            _set_font_size(cell.text_frame, Pt(12))


def _set_font_size(text_frame: TextFrame, size: Length) -> None:
    # On the runs: PowerPoint does not reliably apply a paragraph's default run properties.
    for paragraph in text_frame.paragraphs:
        for run in paragraph.runs:
            run.font.size = size


def _add_chart(pptx_slide: PptxSlide, chart: Chart, box: Box) -> None:
    data = CategoryChartData()
    data.categories = chart.categories
    for name, values in chart.series:
        data.add_series(name, values)
    frame = pptx_slide.shapes.add_chart(CHART_TYPES[chart.kind], *box, data)
    frame.name = "Chart"
    pptx_chart = frame.chart
    pptx_chart.has_title = True
    pptx_chart.chart_title.text_frame.text = chart.title
    pptx_chart.has_legend = len(chart.series) > 1
    if pptx_chart.has_legend:
        pptx_chart.legend.position = XL_LEGEND_POSITION.BOTTOM
        pptx_chart.legend.include_in_layout = False
