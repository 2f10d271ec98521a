"""Located, structured differences between two extractions of the same file.

"report.xlsx was modified" does not tell a person, or a judge, whether the agent did the task;
`Sheet1!B7: 10 -> 12` does. Each format is compared on its own structure: spreadsheet cells by
address, document paragraphs by a sequence alignment (so one inserted paragraph is one addition,
not a cascade of changes) and table cells by position, slide shapes by name, text and CSV by line,
JSON by key path, mail by message id, calendar events by uid. Anything else, or a file that cannot
be read on one side, is one whole-file change.

Positions follow the criteria's params: paragraphs and docx tables, rows and columns 0-based,
slides 1-based; text lines and CSV rows 1-based, as editors show them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from kwrl.graders.extract import (
    BinaryContent,
    CsvContent,
    DocxContent,
    Extracted,
    ExtractionError,
    IcsContent,
    JsonContent,
    MailContent,
    PdfContent,
    PptxContent,
    Rows,
    SlideShape,
    TextContent,
    XlsxCell,
    XlsxContent,
    scalar_text,
)

SHOW_CHARS = 60


@dataclass(frozen=True)
class Change:
    """One located change inside a file."""

    where: str
    """Where, for a person: `Sheet1!B7`, `paragraph 4`, `slide 3 / Body`, `line 12`."""
    before: str | None
    """What was there; None when something was added."""
    after: str | None
    """What is there now; None when something was removed."""

    def __str__(self) -> str:
        if self.before is None:
            return f"{self.where} added: {_show(self.after)}"
        if self.after is None:
            return f"{self.where} removed: {_show(self.before)}"
        return f"{self.where}: {_show(self.before)} -> {_show(self.after)}"


def _show(text: str | None) -> str:
    text = text or ""
    if len(text) > SHOW_CHARS:
        text = text[: SHOW_CHARS - 3] + "..."
    try:
        float(text.replace(",", ""))
        return text
    except ValueError:
        return repr(text)


def content_changes(before: Extracted, after: Extracted) -> tuple[Change, ...]:
    """The located changes from `before` to `after` (both extractions of one path)."""
    if type(before) is not type(after) or isinstance(before, BinaryContent | ExtractionError):
        return (Change("whole file", _summary(before), _summary(after)),)
    differ = _DIFFERS[type(before)]
    return tuple(differ(before, after))


def _summary(content: Extracted) -> str:
    if isinstance(content, ExtractionError):
        return f"unreadable ({content.reason})"
    if isinstance(content, BinaryContent):
        return f"{content.size} bytes, sha256 {content.sha256[:12]}"
    return f"{content.kind} content"


def _xlsx(before: XlsxContent, after: XlsxContent) -> Iterator[Change]:
    for sheet in _union(before.sheets, after.sheets):
        if sheet not in after.sheets:
            yield Change(f"sheet {sheet}", f"{len(before.sheets[sheet])} cells", None)
            continue
        if sheet not in before.sheets:
            yield Change(f"sheet {sheet}", None, f"{len(after.sheets[sheet])} cells")
            continue
        old, new = before.sheets[sheet], after.sheets[sheet]
        for address in sorted(set(old) | set(new), key=_address_key):
            if old.get(address) != new.get(address):
                yield Change(f"{sheet}!{address}", _cell(old.get(address)), _cell(new.get(address)))


def _address_key(address: str) -> tuple[int, int, str]:
    letters = address.rstrip("0123456789")
    digits = address[len(letters) :]
    return (int(digits or 0), len(letters), letters)


def _cell(cell: XlsxCell | None) -> str | None:
    if cell is None:
        return None
    if cell.formula is None:
        return scalar_text(cell.value)
    cached = "no cached value" if cell.value is None else scalar_text(cell.value)
    return f"{cell.formula} [{cached}]"


def _docx(before: DocxContent, after: DocxContent) -> Iterator[Change]:
    old = [(p.style, p.text) for p in before.paragraphs]
    new = [(p.style, p.text) for p in after.paragraphs]
    for i, j, b, a in _aligned(old, new):
        if b is not None and a is not None and b[1] == a[1]:
            yield Change(f"paragraph {j} style", b[0], a[0])
        else:
            where = f"paragraph {j if a is not None else i}"
            yield Change(where, b[1] if b else None, a[1] if a else None)
    for t in range(max(len(before.tables), len(after.tables))):
        old_t = before.tables[t] if t < len(before.tables) else None
        new_t = after.tables[t] if t < len(after.tables) else None
        yield from _table_changes(f"table {t}", old_t, new_t)
    old_c = [f"{c.author}: {c.text}" for c in before.comments]
    new_c = [f"{c.author}: {c.text}" for c in after.comments]
    for i, j, b, a in _aligned(old_c, new_c):
        yield Change(f"comment {j if a is not None else i}", b, a)


def _table_changes(where: str, old: Rows | None, new: Rows | None) -> Iterator[Change]:
    if old is None or new is None:
        size = _table_size(old if new is None else new)
        yield Change(where, size if new is None else None, size if old is None else None)
        return
    for r in range(max(len(old), len(new))):
        old_row = old[r] if r < len(old) else ()
        new_row = new[r] if r < len(new) else ()
        for c in range(max(len(old_row), len(new_row))):
            b = old_row[c] if c < len(old_row) else None
            a = new_row[c] if c < len(new_row) else None
            if b != a:
                yield Change(f"{where} row {r} col {c}", b, a)


def _table_size(rows: Rows | None) -> str:
    rows = rows or ()
    return f"{len(rows)}x{max((len(r) for r in rows), default=0)} table"


def _pptx(before: PptxContent, after: PptxContent) -> Iterator[Change]:
    old = {s.number: s for s in before.slides}
    new = {s.number: s for s in after.slides}
    for number in sorted(set(old) | set(new)):
        if number not in new or number not in old:
            slide = old.get(number) or new[number]
            text = " / ".join(s.text for s in slide.shapes.values() if s.text)
            yield Change(
                f"slide {number}", text if number in old else None, text if number in new else None
            )
            continue
        shapes_old, shapes_new = old[number].shapes, new[number].shapes
        for name in _union(shapes_old, shapes_new):
            yield from _shape_changes(
                f"slide {number} / {name}", shapes_old.get(name), shapes_new.get(name)
            )
        if old[number].notes != new[number].notes:
            yield Change(f"slide {number} / notes", old[number].notes, new[number].notes)


def _shape_changes(where: str, old: SlideShape | None, new: SlideShape | None) -> Iterator[Change]:
    if old is None or new is None:
        yield Change(where, old.all_text() if old else None, new.all_text() if new else None)
        return
    if old.text != new.text:
        yield Change(where, old.text, new.text)
    if old.table != new.table:
        yield from _table_changes(where, old.table, new.table)
    if old.series != new.series or old.categories != new.categories:
        series_old, series_new = old.series or {}, new.series or {}
        for name in _union(series_old, series_new):
            b, a = series_old.get(name), series_new.get(name)
            if b != a or old.categories != new.categories:
                yield Change(f"{where} / series {name}", _values(b), _values(a))


def _values(values: Sequence[float | None] | None) -> str | None:
    return None if values is None else ", ".join(scalar_text(v) for v in values)


def _lines(before: Sequence[str], after: Sequence[str], label: str) -> Iterator[Change]:
    for i, j, b, a in _aligned(before, after):
        yield Change(f"{label} {(j if a is not None else i) + 1}", b, a)


def _text(before: TextContent, after: TextContent) -> Iterator[Change]:
    return _lines(before.lines, after.lines, "line")


def _csv(before: CsvContent, after: CsvContent) -> Iterator[Change]:
    return _lines([",".join(r) for r in before.rows], [",".join(r) for r in after.rows], "row")


def _pdf(before: PdfContent, after: PdfContent) -> Iterator[Change]:
    for p in range(max(len(before.pages), len(after.pages))):
        old = before.pages[p].text.splitlines() if p < len(before.pages) else []
        new = after.pages[p].text.splitlines() if p < len(after.pages) else []
        yield from _lines(old, new, f"page {p + 1} line")


def _json(before: JsonContent, after: JsonContent) -> Iterator[Change]:
    old, new = dict(_flatten(before.value, "$")), dict(_flatten(after.value, "$"))
    for key in _union(old, new):
        if old.get(key) != new.get(key):
            yield Change(key, old.get(key), new.get(key))


def _flatten(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten(item, f"{path}.{key}")
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _flatten(item, f"{path}[{index}]")
    else:
        yield path, json.dumps(value, ensure_ascii=False)


def _records(before: Sequence[Any], after: Sequence[Any], key: str, label: str) -> Iterator[Change]:
    old = {getattr(r, key) or f"#{n}": r for n, r in enumerate(before)}
    new = {getattr(r, key) or f"#{n}": r for n, r in enumerate(after)}
    for ident in _union(old, new):
        b, a = old.get(ident), new.get(ident)
        if b is None or a is None:
            yield Change(f"{label} {ident}", _record(b), _record(a))
            continue
        for name in b.__dataclass_fields__:
            if getattr(b, name) != getattr(a, name):
                old_value, new_value = str(getattr(b, name)), str(getattr(a, name))
                yield Change(f"{label} {ident} / {name}", old_value, new_value)


def _record(record: Any) -> str | None:
    if record is None:
        return None
    return str(getattr(record, "subject", None) or getattr(record, "summary", ""))


def _mail(before: MailContent, after: MailContent) -> Iterator[Change]:
    return _records(before.messages, after.messages, "message_id", "message")


def _ics(before: IcsContent, after: IcsContent) -> Iterator[Change]:
    return _records(before.events, after.events, "uid", "event")


def _aligned(
    old: Sequence[Any], new: Sequence[Any]
) -> Iterator[tuple[int, int, Any | None, Any | None]]:
    """Differing items after aligning two sequences: (old index, new index, old, new)."""
    matcher = SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            i, j = i1 + k, j1 + k
            b = old[i] if i < i2 else None
            a = new[j] if j < j2 else None
            yield min(i, i2), min(j, j2), b, a


def _union(first: Any, second: Any) -> list[Any]:
    """Keys of both, in first-seen order."""
    return list(dict.fromkeys([*first, *second]))


_DIFFERS: dict[type, Callable[[Any, Any], Iterator[Change]]] = {
    XlsxContent: _xlsx,
    DocxContent: _docx,
    PptxContent: _pptx,
    TextContent: _text,
    CsvContent: _csv,
    PdfContent: _pdf,
    JsonContent: _json,
    MailContent: _mail,
    IcsContent: _ics,
}
