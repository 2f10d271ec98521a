"""A neutral model of the documents a world contains, rendered to files by `kwrl.worlds.writers`.

World composition decides *what* a document says (from the hidden fact table); the writers decide
how each format lays it out. Keeping the two apart is what lets one fact appear, consistently, in a
PDF, a spreadsheet, a slide and an e-mail.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Literal

CellValue = str | int | float | None


@dataclass(frozen=True)
class Paragraph:
    text: str
    style: Literal["body", "heading1", "heading2", "bullet", "numbered"] = "body"
    """`numbered` paragraphs carry their own number in `text` (e.g. `7.2 Termination ...`)."""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[CellValue, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class ColumnBreak:
    """PDF only: continue in the next column (other formats have no columns and skip it)."""


Block = Paragraph | Table | ColumnBreak


@dataclass(frozen=True)
class Document:
    """A memo, report, contract or note (pdf, docx, md, txt)."""

    title: str
    blocks: tuple[Block, ...]
    author: str = "kwrl"
    date: dt.date = dt.date(2025, 1, 1)
    columns: int = 1
    """PDF only: 2 lays the body out in two columns (tables span one column)."""


@dataclass(frozen=True)
class Formula:
    """A spreadsheet formula with the value a spreadsheet program would have cached for it."""

    expr: str
    """Excel syntax with the leading `=`, e.g. `=SUM(B2:B5)`."""
    cached: CellValue


@dataclass(frozen=True)
class Sheet:
    name: str
    rows: tuple[tuple[CellValue | Formula, ...], ...]
    """Row 1 first; cell A1 is rows[0][0]."""


@dataclass(frozen=True)
class Workbook:
    sheets: tuple[Sheet, ...]
    author: str = "kwrl"
    date: dt.date = dt.date(2025, 1, 1)
    """Stamped into the file's created/modified properties."""


@dataclass(frozen=True)
class Chart:
    title: str
    categories: tuple[str, ...]
    series: tuple[tuple[str, tuple[float, ...]], ...]
    """(series name, one value per category)."""
    kind: Literal["bar", "line"] = "bar"


@dataclass(frozen=True)
class Slide:
    title: str
    bullets: tuple[str, ...] = ()
    table: Table | None = None
    chart: Chart | None = None
    notes: str = ""


@dataclass(frozen=True)
class Deck:
    title: str
    slides: tuple[Slide, ...]
    author: str = "kwrl"
    date: dt.date = dt.date(2025, 1, 1)
    """Stamped into the file's created/modified properties."""


@dataclass(frozen=True)
class Attachment:
    filename: str
    content: bytes
    mime_type: str = "application/octet-stream"


@dataclass(frozen=True)
class Email:
    message_id: str
    """Without angle brackets, e.g. `m001@acme.example`."""
    sender: str
    """`Name <address>`."""
    to: tuple[str, ...]
    date: dt.datetime
    subject: str
    body: str
    cc: tuple[str, ...] = ()
    in_reply_to: str | None = None
    attachments: tuple[Attachment, ...] = ()


@dataclass(frozen=True)
class ChatMessage:
    user: str
    ts: dt.datetime
    text: str


@dataclass(frozen=True)
class ChatChannel:
    name: str
    messages: tuple[ChatMessage, ...]
    topic: str = ""


@dataclass(frozen=True)
class CalendarEvent:
    uid: str
    summary: str
    start: dt.datetime
    end: dt.datetime
    location: str = ""
    description: str = ""
    attendees: tuple[str, ...] = field(default_factory=tuple)
    """E-mail addresses."""
