"""The writers render the document model into real files that real readers parse back, and the
same model always gives the same bytes."""

from __future__ import annotations

import csv
import datetime as dt
import email
import io
import json
import mailbox
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from email import policy
from pathlib import Path
from typing import Any

import docx
import icalendar
import openpyxl
import pdfplumber
import pytest
from lxml import etree
from pptx import Presentation
from pptx.enum.chart import XL_CHART_TYPE

from kwrl.worlds.docmodel import (
    Attachment,
    CalendarEvent,
    Chart,
    ChatChannel,
    ChatMessage,
    Deck,
    Document,
    Email,
    Formula,
    Paragraph,
    Sheet,
    Slide,
    Table,
    Workbook,
)
from kwrl.worlds.writers import (
    write_chat,
    write_csv,
    write_docx,
    write_eml,
    write_ics,
    write_markdown,
    write_mbox,
    write_pdf,
    write_pptx,
    write_text,
    write_xlsx,
)

REVENUE = Table(
    header=("Region", "Revenue", "Growth"),
    rows=(("EMEA", 4500000, 0.12), ("APAC", 3100000, None), ("Americas", "n/a", -0.03)),
    caption="Revenue by region, FY2024",
)
REPORT = Document(
    title="FY2024 Regional Review",
    blocks=(
        Paragraph("Summary", "heading1"),
        Paragraph("EMEA led growth for the third year running."),
        Paragraph("Renewals closed early", "bullet"),
        Paragraph("Two new distributors", "bullet"),
        Paragraph("Outlook", "heading2"),
        Paragraph("7.2 Termination requires ninety days' notice.", "numbered"),
        REVENUE,
    ),
    author="Dana Reyes",
    date=dt.date(2025, 2, 14),
)
TWO_COLUMN = Document(
    title="Field Notes",
    blocks=tuple(
        Paragraph(f"Para{i:02d} " + "the survey team logged readings at each station. " * 6)
        for i in range(30)
    ),
    columns=2,
)
WORKBOOK = Workbook(
    sheets=(
        Sheet(
            "Sales",
            rows=(
                ("Region", "Q1", "Q2"),
                ("EMEA", 120, 130.5),
                ("APAC", 80, 95),
                ("Total", Formula("=SUM(B2:B3)", 200), Formula("=SUM(C2:C3)", 225.5)),
            ),
        ),
        Sheet("Notes", rows=(("Label", "Value"), ("=not a formula", Formula('="Q"&1', "Q1")))),
    ),
    author="Dana Reyes",
    date=dt.date(2025, 2, 14),
)
DECK = Deck(
    title="Board update",
    slides=(
        Slide("Highlights", bullets=("Revenue up 12%", "Two new markets"), notes="Pause here."),
        Slide("By region", table=REVENUE),
        Slide(
            "Trend",
            chart=Chart("Revenue ($m)", ("Q1", "Q2", "Q3"), (("EMEA", (1.0, 1.2, 1.5)),)),
        ),
        Slide(
            "Mix",
            bullets=("Services grew fastest",),
            chart=Chart(
                "Mix", ("Q1", "Q2"), (("Products", (3.0, 4.0)), ("Services", (1.0, 2.0))), "line"
            ),
        ),
    ),
    date=dt.date(2025, 2, 14),
)
MINUTES = Attachment("minutes.csv", b"item,owner\nbudget,dana\n", "text/csv")
THREAD = (
    Email(
        "m1@acme.example",
        "Dana Reyes <dana@acme.example>",
        ("lee@acme.example",),
        dt.datetime(2025, 1, 6, 9, 30),
        "Budget",
        "From now on budgets go through finance.\n",
        attachments=(MINUTES,),
    ),
    Email(
        "m2@acme.example",
        "Lee Park <lee@acme.example>",
        ("dana@acme.example",),
        dt.datetime(2025, 1, 6, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        "Re: Budget",
        "Agreed.\n",
        cc=("cfo@acme.example",),
        in_reply_to="m1@acme.example",
    ),
    Email(
        "m3@acme.example",
        "Dana Reyes <dana@acme.example>",
        ("lee@acme.example",),
        dt.datetime(2025, 1, 6, 11, 0),
        "Re: Budget",
        "Thanks.\n",
        in_reply_to="m2@acme.example",
    ),
)
CHANNELS = (
    ChatChannel(
        "finance",
        (
            ChatMessage("dana", dt.datetime(2025, 1, 6, 9, 0), "Budget memo is out"),
            ChatMessage("lee", dt.datetime(2025, 1, 6, 9, 5), "Seen it"),
        ),
        topic="Budgets and forecasts",
    ),
)
EVENTS = (
    CalendarEvent(
        "ev1@acme.example",
        "Budget review",
        dt.datetime(2025, 1, 8, 14, 0),
        dt.datetime(2025, 1, 8, 15, 0),
        location="Room 4",
        attendees=("dana@acme.example", "lee@acme.example"),
    ),
    CalendarEvent("ev2@acme.example", "Offsite", dt.datetime(2025, 1, 9), dt.datetime(2025, 1, 10)),
)

WRITES: dict[str, tuple[Callable[[Any, Path], None], Any]] = {
    "report.pdf": (write_pdf, REPORT),
    "columns.pdf": (write_pdf, TWO_COLUMN),
    "report.docx": (write_docx, REPORT),
    "book.xlsx": (write_xlsx, WORKBOOK),
    "deck.pptx": (write_pptx, DECK),
    "mail.mbox": (write_mbox, THREAD),
    "reply.eml": (write_eml, THREAD[2]),
    "chat.json": (write_chat, CHANNELS),
    "calendar.ics": (write_ics, EVENTS),
    "report.md": (write_markdown, REPORT),
    "report.txt": (write_text, REPORT),
    "revenue.csv": (write_csv, REVENUE),
}
OOXML_DATES = {"report.docx": REPORT.date, "book.xlsx": WORKBOOK.date, "deck.pptx": DECK.date}


def write_all(directory: Path) -> dict[str, bytes]:
    """Write every sample file into `directory`; return each file's bytes by name."""
    for name, (writer, model) in WRITES.items():
        writer(model, directory / name)
    return {name: (directory / name).read_bytes() for name in WRITES}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("written")
    write_all(directory)
    return directory


@pytest.mark.parametrize("name", sorted(WRITES))
def test_writing_the_same_model_twice_gives_identical_bytes(name: str, tmp_path: Path) -> None:
    writer, model = WRITES[name]
    writer(model, tmp_path / f"first-{name}")
    writer(model, tmp_path / f"second-{name}")
    assert (tmp_path / f"first-{name}").read_bytes() == (tmp_path / f"second-{name}").read_bytes()


def test_another_process_with_another_hash_seed_writes_the_same_bytes(
    written: Path, tmp_path: Path
) -> None:
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "import test_writers; test_writers.write_all(Path(sys.argv[2]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "TZ": "Pacific/Auckland"}
    subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(tmp_path)],
        env=env,
        check=True,
        timeout=60,
    )
    for name in WRITES:
        assert (tmp_path / name).read_bytes() == (written / name).read_bytes(), name


@pytest.mark.parametrize("name", sorted(OOXML_DATES))
def test_ooxml_zip_entries_and_core_dates_are_fixed(name: str, written: Path) -> None:
    stamp = f"{OOXML_DATES[name].isoformat()}T00:00:00Z"
    packages = [(written / name).read_bytes()]
    while packages:
        with zipfile.ZipFile(io.BytesIO(packages.pop())) as package:
            for info in package.infolist():
                assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
                assert (info.create_system, info.external_attr) == (3, 0o644 << 16)
                if info.filename.endswith(".xlsx"):  # chart data embedded in the deck
                    packages.append(package.read(info))
            core = etree.fromstring(package.read("docProps/core.xml"))
            dates = [
                core.findtext(f"{{http://purl.org/dc/terms/}}{tag}")
                for tag in ("created", "modified")
            ]
            assert dates == [stamp, stamp]


def test_pdf_text_and_table_read_back_with_pdfplumber(written: Path) -> None:
    with pdfplumber.open(written / "report.pdf") as pdf:
        page = pdf.pages[0]
        text = page.extract_text()
        tables = page.extract_tables()
        assert pdf.metadata["Title"] == "FY2024 Regional Review"
        assert pdf.metadata["Author"] == "Dana Reyes"
        assert pdf.metadata["CreationDate"].startswith("D:20250214")
    assert "FY2024 Regional Review" in text
    assert "7.2 Termination requires ninety days' notice." in text
    assert "Renewals closed early" in text
    assert tables == [
        [
            ["Region", "Revenue", "Growth"],
            ["EMEA", "4500000", "0.12"],
            ["APAC", "3100000", ""],
            ["Americas", "n/a", "-0.03"],
        ]
    ]


def test_two_column_pdf_puts_earlier_paragraphs_left_and_later_ones_right(written: Path) -> None:
    with pdfplumber.open(written / "columns.pdf") as pdf:
        page = pdf.pages[0]
        middle = page.width / 2
        markers = [w for w in page.extract_words() if w["text"].startswith("Para")]
    left = [w for w in markers if w["x1"] < middle]
    right = [w for w in markers if w["x0"] > middle]
    assert left and right and len(left) + len(right) == len(markers)
    # Body flows down the left column first, then the right one, side by side on the page.
    assert max(w["text"] for w in left) < min(w["text"] for w in right)
    assert min(w["top"] for w in right) < max(w["top"] for w in left)


def test_docx_reads_back_styles_text_table_and_properties(written: Path) -> None:
    word = docx.Document(str(written / "report.docx"))
    paragraphs = [(p.style.name, p.text) for p in word.paragraphs]
    assert paragraphs[:4] == [
        ("Title", "FY2024 Regional Review"),
        ("Heading 1", "Summary"),
        ("Normal", "EMEA led growth for the third year running."),
        ("List Bullet", "Renewals closed early"),
    ]
    assert ("Heading 2", "Outlook") in paragraphs
    assert ("Normal", "7.2 Termination requires ninety days' notice.") in paragraphs
    assert ("Caption", "Revenue by region, FY2024") in paragraphs
    (table,) = word.tables
    assert table.style.name == "Table Grid"
    cells = [[cell.text for cell in row.cells] for row in table.rows]
    assert cells[0] == ["Region", "Revenue", "Growth"]
    assert cells[2] == ["APAC", "3100000", ""]
    assert word.core_properties.author == "Dana Reyes"
    assert word.core_properties.created == dt.datetime(2025, 2, 14, tzinfo=dt.UTC)


def test_xlsx_keeps_formulas_and_their_cached_values(written: Path) -> None:
    formulas = openpyxl.load_workbook(written / "book.xlsx", data_only=False)
    cached = openpyxl.load_workbook(written / "book.xlsx", data_only=True)
    assert formulas.sheetnames == ["Sales", "Notes"]
    assert formulas["Sales"]["B4"].value == "=SUM(B2:B3)"
    assert [cached["Sales"][ref].value for ref in ("B4", "C4")] == [200, 225.5]
    assert formulas["Notes"]["B2"].value == '="Q"&1'
    assert cached["Notes"]["B2"].value == "Q1"
    assert formulas["Notes"]["A2"].value == "=not a formula"
    assert formulas["Notes"]["A2"].data_type == "s"
    assert formulas["Sales"]["A1"].font.b and not formulas["Sales"]["A2"].font.b
    assert formulas.properties.creator == "Dana Reyes"


def test_pptx_shapes_are_addressable_by_name(written: Path) -> None:
    slides = list(Presentation(str(written / "deck.pptx")).slides)
    assert [[shape.name for shape in slide.shapes] for slide in slides] == [
        ["Title", "Body"],
        ["Title", "Table"],
        ["Title", "Chart"],
        ["Title", "Body", "Chart"],
    ]
    assert slides[0].shapes.title.text == "Highlights"
    body = next(shape for shape in slides[0].shapes if shape.name == "Body")
    assert [p.text for p in body.text_frame.paragraphs] == ["Revenue up 12%", "Two new markets"]
    assert slides[0].notes_slide.notes_text_frame.text == "Pause here."
    assert not slides[1].has_notes_slide
    table = next(shape for shape in slides[1].shapes if shape.name == "Table").table
    assert [table.cell(0, c).text for c in range(3)] == ["Region", "Revenue", "Growth"]
    assert table.cell(3, 1).text == "n/a"
    bar = next(shape for shape in slides[2].shapes if shape.name == "Chart").chart
    assert bar.chart_type == XL_CHART_TYPE.COLUMN_CLUSTERED
    assert bar.chart_title.text_frame.text == "Revenue ($m)"
    assert list(bar.plots[0].categories) == ["Q1", "Q2", "Q3"]
    assert [(s.name, tuple(s.values)) for s in bar.series] == [("EMEA", (1.0, 1.2, 1.5))]
    line = next(shape for shape in slides[3].shapes if shape.name == "Chart").chart
    assert line.chart_type == XL_CHART_TYPE.LINE_MARKERS
    assert [s.name for s in line.series] == ["Products", "Services"]


def test_mbox_reads_back_threads_dates_and_attachments(written: Path) -> None:
    raw = (written / "mail.mbox").read_bytes()
    assert raw.startswith(b"From dana@acme.example Mon Jan 06 09:30:00 2025\n")
    messages = list(mailbox.mbox(written / "mail.mbox", create=False))
    assert [m["Message-ID"] for m in messages] == [f"<m{i}@acme.example>" for i in (1, 2, 3)]
    first, second, third = messages
    assert first["Date"] == "Mon, 06 Jan 2025 09:30:00 +0000"
    assert second["Date"] == "Mon, 06 Jan 2025 09:00:00 +0000"  # 10:00 at +01:00
    assert second["Cc"] == "cfo@acme.example"
    assert third["In-Reply-To"] == "<m2@acme.example>"
    assert third["References"] == "<m1@acme.example> <m2@acme.example>"
    (attachment,) = [part for part in first.walk() if part.get_filename()]
    assert attachment.get_filename() == "minutes.csv"
    assert attachment.get_content_type() == "text/csv"
    assert attachment.get_payload(decode=True) == MINUTES.content
    # mbox quotes a body line starting with "From " so it cannot pass for a separator.
    assert b"\n>From now on budgets" in raw


def test_eml_names_the_whole_thread_when_given_it(tmp_path: Path) -> None:
    write_eml(THREAD[2], tmp_path / "alone.eml")
    write_eml(THREAD[2], tmp_path / "threaded.eml", thread=THREAD)
    alone = email.message_from_bytes((tmp_path / "alone.eml").read_bytes(), policy=policy.default)
    threaded = email.message_from_bytes(
        (tmp_path / "threaded.eml").read_bytes(), policy=policy.default
    )
    assert alone["References"] == "<m2@acme.example>"
    assert threaded["References"] == "<m1@acme.example> <m2@acme.example>"
    assert threaded.get_content() == "Thanks.\n"


def test_ics_parses_with_events_in_utc_stamped_at_their_start(written: Path) -> None:
    calendar = icalendar.Calendar.from_ical((written / "calendar.ics").read_bytes())
    events = list(calendar.walk("VEVENT"))
    assert calendar["PRODID"] == "-//kwrl//worlds//EN"
    assert [str(e["UID"]) for e in events] == ["ev1@acme.example", "ev2@acme.example"]
    review = events[0]
    assert review.decoded("DTSTART") == dt.datetime(2025, 1, 8, 14, tzinfo=dt.UTC)
    assert review.decoded("DTSTAMP") == review.decoded("DTSTART")
    assert str(review["LOCATION"]) == "Room 4"
    assert [str(a) for a in review["ATTENDEE"]] == [
        "mailto:dana@acme.example",
        "mailto:lee@acme.example",
    ]


def test_chat_export_is_json_with_iso_timestamps(written: Path) -> None:
    export = json.loads((written / "chat.json").read_text(encoding="utf-8"))
    assert export == {
        "channels": [
            {
                "name": "finance",
                "topic": "Budgets and forecasts",
                "messages": [
                    {
                        "user": "dana",
                        "ts": "2025-01-06T09:00:00+00:00",
                        "text": "Budget memo is out",
                    },
                    {"user": "lee", "ts": "2025-01-06T09:05:00+00:00", "text": "Seen it"},
                ],
            }
        ]
    }


def test_markdown_text_and_csv_carry_the_same_table(written: Path) -> None:
    markdown = (written / "report.md").read_text(encoding="utf-8")
    assert markdown.startswith("# FY2024 Regional Review\n\n## Summary\n")
    assert "- Renewals closed early\n- Two new distributors\n" in markdown
    assert "| Region | Revenue | Growth |\n|---|---|---|\n| EMEA | 4500000 | 0.12 |" in markdown
    text = (written / "report.txt").read_text(encoding="utf-8").splitlines()
    assert text[:2] == ["FY2024 Regional Review", "======================"]
    assert "Region    Revenue  Growth" in text
    assert "APAC      3100000" in text
    with (written / "revenue.csv").open(encoding="utf-8", newline="") as stream:
        rows = list(csv.reader(stream))
    assert rows == [
        ["Region", "Revenue", "Growth"],
        ["EMEA", "4500000", "0.12"],
        ["APAC", "3100000", ""],
        ["Americas", "n/a", "-0.03"],
    ]
