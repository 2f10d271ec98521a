"""Extraction reads every world and deliverable format into structure, and never raises."""

from __future__ import annotations

import datetime as dt
import json
import mailbox
import zipfile
from email.message import EmailMessage
from pathlib import Path

import docx
import icalendar
import openpyxl
import pptx
import pytest
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.util import Inches
from reportlab.lib.pagesizes import A4
from reportlab.platypus import SimpleDocTemplate, Table, TableStyle

from kwrl.graders.extract import (
    BinaryContent,
    CsvContent,
    DocxContent,
    ExtractionError,
    IcsContent,
    JsonContent,
    MailContent,
    PdfContent,
    PptxContent,
    TextContent,
    XlsxCell,
    XlsxContent,
    extract,
)


def cache_formula(path: Path, formula: str, value: str) -> None:
    """Give a formula the cached value a spreadsheet program would store (openpyxl writes none)."""
    with zipfile.ZipFile(path) as source:
        parts = {name: source.read(name) for name in source.namelist()}
    sheet = "xl/worksheets/sheet1.xml"
    parts[sheet] = parts[sheet].replace(
        f"<f>{formula}</f><v></v>".encode(), f"<f>{formula}</f><v>{value}</v>".encode()
    )
    with zipfile.ZipFile(path, "w") as target:
        for name, data in parts.items():
            target.writestr(name, data)


def make_xlsx(path: Path) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "P&L"
    sheet.append(["Line", "FY2024"])
    sheet.append(["Revenue", 4_500_000])
    sheet.append(["Costs", 1_500_000.5])
    sheet.append(["Profit", "=B2-B3"])
    sheet.append(["Uncached", "=B2*2"])
    sheet["D1"] = dt.date(2025, 3, 14)
    book.create_sheet("Notes")["A1"] = "draft"
    book.save(path)
    cache_formula(path, "B2-B3", "2999999.5")
    return path


def test_xlsx_cells_carry_cached_value_and_formula(tmp_path: Path) -> None:
    content = extract(make_xlsx(tmp_path / "model.xlsx"))
    assert isinstance(content, XlsxContent)
    assert list(content.sheets) == ["P&L", "Notes"]
    assert content.cell("P&L", "B2") == XlsxCell(4_500_000)
    assert content.cell("P&L", "b4") == XlsxCell(2_999_999.5, "=B2-B3")
    assert content.cell("P&L", "$B$5") == XlsxCell(None, "=B2*2")
    assert content.cell("P&L", "D1") == XlsxCell("2025-03-14T00:00:00")
    assert content.cell("P&L", "Z99") is None
    assert "4500000" in content.text() and "draft" in content.text()


def test_xlsx_without_formulas_is_read(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    book.active["A1"] = 7
    book.save(tmp_path / "plain.xlsx")
    content = extract(tmp_path / "plain.xlsx")
    assert isinstance(content, XlsxContent)
    assert content.cell("Sheet", "A1") == XlsxCell(7)


def make_docx(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Board memo", level=1)
    document.add_paragraph("")
    paragraph = document.add_paragraph("Revenue reached $4.5M.")
    table = document.add_table(rows=2, cols=2)
    for r in range(2):
        for c in range(2):
            table.cell(r, c).text = f"r{r}c{c}"
    document.add_comment(paragraph.runs, text="Check this figure", author="Dana")
    document.save(path)
    return path


def test_docx_paragraphs_tables_and_comments(tmp_path: Path) -> None:
    content = extract(make_docx(tmp_path / "memo.docx"))
    assert isinstance(content, DocxContent)
    assert [(p.text, p.style) for p in content.paragraphs] == [
        ("Board memo", "Heading 1"),
        ("", "Normal"),
        ("Revenue reached $4.5M.", "Normal"),
    ]
    assert content.tables == ((("r0c0", "r0c1"), ("r1c0", "r1c1")),)
    assert [(c.author, c.text) for c in content.comments] == [("Dana", "Check this figure")]
    assert "r1c1" in content.text()


def make_pptx(path: Path) -> Path:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Overview"
    body = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(4), Inches(1))
    body.name = "Body"
    body.text_frame.text = "Revenue grew 12%"
    twin = slide.shapes.add_textbox(Inches(1), Inches(3), Inches(4), Inches(1))
    twin.name = "Body"
    twin.text_frame.text = "second body"
    slide.notes_slide.notes_text_frame.text = "speak slowly"
    second = deck.slides.add_slide(deck.slide_layouts[6])
    table = second.shapes.add_table(2, 2, Inches(1), Inches(1), Inches(4), Inches(1))
    table.name = "Figures"
    table.table.cell(1, 1).text = "4.5m"
    data = CategoryChartData()
    data.categories = ["2023", "2024"]
    data.add_series("Revenue", (4.0, 4.5))
    chart = second.shapes.add_chart(
        XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(3), Inches(4), Inches(3), data
    )
    chart.name = "Trend"
    deck.save(path)
    return path


def test_pptx_shapes_by_name_tables_and_chart_series(tmp_path: Path) -> None:
    content = extract(make_pptx(tmp_path / "deck.pptx"))
    assert isinstance(content, PptxContent)
    first, second = content.slides
    assert first.number == 1 and second.number == 2
    assert first.shapes["Body"].text == "Revenue grew 12%"
    assert first.shapes["Body #2"].text == "second body"
    assert first.notes == "speak slowly"
    assert second.shapes["Figures"].table == (("", ""), ("", "4.5m"))
    assert second.shapes["Trend"].series == {"Revenue": (4.0, 4.5)}
    assert second.shapes["Trend"].categories == ("2023", "2024")
    assert "Revenue: 4, 4.5" in content.text()


def test_pptx_shapes_inside_groups_are_found(tmp_path: Path) -> None:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    group = slide.shapes.add_group_shape()
    inner = group.shapes.add_textbox(Inches(1), Inches(1), Inches(2), Inches(1))
    inner.name = "Callout"
    inner.text_frame.text = "Net debt 1.2bn"
    deck.save(tmp_path / "grouped.pptx")
    content = extract(tmp_path / "grouped.pptx")
    assert isinstance(content, PptxContent)
    assert content.slides[0].shapes["Callout"].text == "Net debt 1.2bn"


def test_pdf_pages_text_and_tables(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    table = Table([["Segment", "Revenue"], ["Retail", "4,500,000"]])
    table.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.5, "black")]))
    SimpleDocTemplate(str(path), pagesize=A4).build([table])
    content = extract(path)
    assert isinstance(content, PdfContent)
    assert len(content.pages) == 1
    assert "Retail 4,500,000" in content.pages[0].text
    assert content.pages[0].tables == ((("Segment", "Revenue"), ("Retail", "4,500,000")),)


def make_message(subject: str, message_id: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "Dana Reyes <dana@acme.example>"
    message["To"] = "Sam Li <sam@acme.example>, ops@acme.example"
    message["Subject"] = subject
    message["Date"] = "Fri, 14 Mar 2025 10:30:00 +0000"
    message["Message-ID"] = f"<{message_id}>"
    message.set_content("The revised figure is 4.5m.")
    message.add_attachment(b"x", maintype="application", subtype="pdf", filename="terms.pdf")
    return message


def test_eml_and_mbox_messages(tmp_path: Path) -> None:
    (tmp_path / "one.eml").write_bytes(bytes(make_message("Figures", "m1@acme.example")))
    box = mailbox.mbox(tmp_path / "inbox.mbox")
    box.add(make_message("First", "m1@acme.example"))
    box.add(make_message("Second", "m2@acme.example"))
    box.close()
    eml = extract(tmp_path / "one.eml")
    assert isinstance(eml, MailContent)
    (message,) = eml.messages
    assert message.message_id == "m1@acme.example"
    assert message.sender == "Dana Reyes <dana@acme.example>"
    assert message.to == ("Sam Li <sam@acme.example>", "ops@acme.example")
    assert message.date == "2025-03-14T10:30:00+00:00"
    assert message.body == "The revised figure is 4.5m."
    assert message.attachments == ("terms.pdf",)
    mbox = extract(tmp_path / "inbox.mbox")
    assert isinstance(mbox, MailContent)
    assert [m.subject for m in mbox.messages] == ["First", "Second"]


def test_ics_events(tmp_path: Path) -> None:
    calendar = icalendar.Calendar()
    event = icalendar.Event()
    event.add("uid", "e1@acme")
    event.add("summary", "Board review")
    event.add("dtstart", dt.datetime(2025, 3, 14, 10, 0))
    event.add("dtend", dt.datetime(2025, 3, 14, 11, 0))
    event.add("attendee", "mailto:dana@acme.example")
    calendar.add_component(event)
    (tmp_path / "cal.ics").write_bytes(calendar.to_ical())
    content = extract(tmp_path / "cal.ics")
    assert isinstance(content, IcsContent)
    (parsed,) = content.events
    assert (parsed.uid, parsed.summary) == ("e1@acme", "Board review")
    assert parsed.start == "2025-03-14T10:00:00"
    assert parsed.attendees == ("dana@acme.example",)


def test_json_csv_text_and_binary(tmp_path: Path) -> None:
    (tmp_path / "chat.json").write_text(json.dumps({"messages": [{"text": "hi"}]}))
    (tmp_path / "t.csv").write_text('name,amount\nRetail,"4,500,000"\n')
    (tmp_path / "n.md").write_text("# Title\n\nFirst para\nline two\n\nSecond para\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    assert extract(tmp_path / "chat.json") == JsonContent({"messages": [{"text": "hi"}]})
    assert extract(tmp_path / "t.csv") == CsvContent((("name", "amount"), ("Retail", "4,500,000")))
    text = extract(tmp_path / "n.md")
    assert isinstance(text, TextContent)
    assert text.paragraphs() == ["# Title", "First para\nline two", "Second para"]
    binary = extract(tmp_path / "blob.bin")
    assert isinstance(binary, BinaryContent) and binary.size == 2


def test_every_content_is_json_serialisable(tmp_path: Path) -> None:
    made = [make_xlsx(tmp_path / "a.xlsx"), make_docx(tmp_path / "a.docx")]
    for path in [*made, make_pptx(tmp_path / "a.pptx")]:
        document = extract(path).to_json()
        assert json.loads(json.dumps(document))["type"] == path.suffix[1:]


def test_a_truncated_xlsx_is_an_error_value_with_a_reason(tmp_path: Path) -> None:
    path = make_xlsx(tmp_path / "model.xlsx")
    path.write_bytes(path.read_bytes()[:200])
    content = extract(path)
    assert isinstance(content, ExtractionError)
    assert content.reason.startswith("not a zip file")
    assert str(content).startswith(str(path))


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("memo.docx", b"plain text, not a package", "not a zip file"),
        ("deck.pptx", b"", "not a zip file"),
        ("report.pdf", b"%PDF-1.4 garbage", "cannot be read as pdf"),
        ("data.json", b"{not json", "not valid JSON"),
        ("notes.md", b"\xff\xfe\xfa broken", "not UTF-8 text"),
        ("cal.ics", b"BEGIN:NOTHING", "cannot be read as ics"),
    ],
)
def test_corrupt_files_become_error_values(
    tmp_path: Path, name: str, data: bytes, reason: str
) -> None:
    (tmp_path / name).write_bytes(data)
    content = extract(tmp_path / name)
    assert isinstance(content, ExtractionError)
    assert content.reason.startswith(reason), content.reason


def test_a_zip_that_is_not_an_office_package_is_an_error_value(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "fake.xlsx", "w") as archive:
        archive.writestr("hello.txt", "hi")
    content = extract(tmp_path / "fake.xlsx")
    assert isinstance(content, ExtractionError)
    assert "xlsx" in content.reason


def test_a_missing_file_is_an_error_value(tmp_path: Path) -> None:
    content = extract(tmp_path / "nope.docx")
    assert isinstance(content, ExtractionError)
    assert content.reason.startswith("cannot read")


def test_a_file_can_be_read_as_a_named_kind(tmp_path: Path) -> None:
    (tmp_path / "memo").write_text("line one\nline two\n")
    assert isinstance(extract(tmp_path / "memo"), BinaryContent)
    assert extract(tmp_path / "memo", kind="md") == TextContent(("line one", "line two"))
