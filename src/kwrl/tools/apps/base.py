"""What every app shares: the workspace root, path checks, matching, record lines, atomic saves.

An app's public methods are its tools (the MCP layer turns every public function of the class
and its bases into one), so `App` has no public methods of its own: its helpers start with `_`.

Search semantics are the same in every app, so a model learns them once: the query is split into
words, and a record (a line, a table row with its header, a paragraph, a message) matches when it
contains every word, ignoring case. A phrase is therefore found, and so is "Retail Q3 2025" in a
sheet row whose header names the quarter. Records are printed one per line, as `key=value` pairs
separated by ` | `, values exactly as stored, so the number a model copies is the number the file
holds.

Saves are atomic: the new bytes go to a temporary file in the same folder, which then replaces
the original, so a tool that fails halfway (or a timeout) never leaves a half-written document.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kwrl.tools.errors import ToolError
from kwrl.tools.paths import relative, resolve

MAX_HITS = 100
"""Search results listed before the rest are only counted."""

APP_HINTS = {
    ".pdf": "use pdf_read_pages, pdf_tables or pdf_search",
    ".xlsx": "use sheets_list_sheets, sheets_read_range or sheets_search",
    ".xlsm": "use sheets_list_sheets, sheets_read_range or sheets_search",
    ".csv": "use sheets_read_sheet or sheets_search (or filesystem_read)",
    ".docx": "use docs_read or docs_search",
    ".pptx": "use slides_read_deck or slides_search",
    ".mbox": "use mail_list_messages or mail_search",
    ".ics": "use calendar_list_events or calendar_search",
    ".json": "use filesystem_read (chat exports: chat_list_channels)",
}
"""Suffix -> the tools that read such a file (named as on the combined endpoint, `app_method`)."""


def app_hint(suffix: str) -> str:
    """`use docs_read or docs_search` for a .docx; "" for a suffix no app owns."""
    return APP_HINTS.get(suffix.lower(), "")


class App:
    """An app on one workspace: constructed with its root; every public method is a tool."""

    name = "app"
    suffixes: tuple[str, ...] = ()
    """File suffixes the app's document tools accept (empty: any)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"workspace root is not a folder: {root}")

    def _file(self, rel: str, suffixes: Sequence[str] | None = None) -> Path:
        """An existing file in the workspace with one of `suffixes` (default: the app's)."""
        path = resolve(self.root, rel, kind="file")
        allowed = self.suffixes if suffixes is None else tuple(suffixes)
        if allowed and path.suffix.lower() not in allowed:
            hint = app_hint(path.suffix)
            raise ToolError(
                f"{rel} is not a {' or '.join(allowed)} file"
                + (f"; {hint}" if hint else f"; {self.name} tools read {', '.join(allowed)}")
            )
        return path

    def _new_file(self, rel: str, suffixes: Sequence[str]) -> Path:
        """A path for a file that does not exist yet; missing folders are created."""
        path = resolve(self.root, rel, must_exist=False)
        if path.suffix.lower() not in suffixes:
            raise ToolError(f"{rel}: the name must end in {' or '.join(suffixes)}")
        if path.exists():
            raise ToolError(f"{rel} already exists; choose another name or edit the file")
        if path.parent.exists() and not path.parent.is_dir():
            raise ToolError(f"the folder of {rel} is a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _rel(self, path: Path) -> str:
        return relative(self.root, path)


def plural(count: int, noun: str) -> str:
    """`1 row`, `3 rows`."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def terms(query: str) -> list[str]:
    """The lowercase words of a query; a ToolError for an empty one."""
    words = query.lower().split()
    if not words:
        raise ToolError("the query is empty; give a word or phrase to look for")
    return words


def matches(words: Sequence[str], text: str) -> bool:
    """Whether `text` contains every one of `words`, ignoring case and runs of whitespace."""
    flat = " ".join(text.lower().split())
    return all(word in flat for word in words)


def value_text(value: object) -> str:
    """A stored value as printed: None -> ``, numbers and text exactly as `str` shows them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return " ".join(str(value).split()) if isinstance(value, str) else str(value)


def pairs(keys: Sequence[str], values: Sequence[str]) -> str:
    """`key=value | key=value` for the non-empty values (a read-only table row)."""
    parts = []
    for index, value in enumerate(values):
        if value == "":
            continue
        key = keys[index] if index < len(keys) else ""
        parts.append(f"{key}={value}" if key else value)
    return " | ".join(parts) if parts else "(empty)"


def indexed_row(header: Sequence[str], row: Sequence[str]) -> str:
    """`col 0 Segment=Retail | col 1 Revenue ($m)=` : every cell, with the index an edit takes
    and its column header, empty cells included (they are what an edit fills in)."""
    cells = []
    for index, value in enumerate(row):
        key = header[index] if index < len(header) else ""
        cells.append(f"col {index} {key}={value}" if key else f"col {index}={value}")
    return " | ".join(cells)


def hit_list(lines: Iterable[str], query: str, where: str, hint: str = "") -> str:
    """Search results, at most MAX_HITS listed; a sentence (never "") when there are none."""
    found = list(lines)
    if not found:
        extra = f"; {hint}" if hint else ""
        return f"no matches for '{query}' in {where}{extra}"
    shown = found[:MAX_HITS]
    head = f"{len(found)} match{'es' if len(found) != 1 else ''} for '{query}' in {where}"
    tail = [f"[{len(found) - MAX_HITS} more matches not shown; use more words to narrow "
            "the query]"] if len(found) > MAX_HITS else []
    return "\n".join([head, *shown, *tail])


def clean_text(text: str) -> str:
    """Text from a parser, one line per line: PDF glyph codes such as `(cid:127)` become `-`."""
    return re.sub(r"\(cid:\d+\)", "-", text)


def parse_id(text: str, prefix: str, what: str) -> int:
    """`p12` or `12` -> 12; a ToolError naming the expected form otherwise."""
    raw = str(text).strip().lower().removeprefix(prefix)
    if not raw.isdigit():
        raise ToolError(f"'{text}' is not a {what} id; use ids like {prefix}0, {prefix}12")
    return int(raw)


def atomic_save(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a temporary file next to `path`, then move it over `path`.

    The temporary file is removed if `write` fails; the original's permissions are kept.
    """
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically."""
    atomic_save(path, lambda tmp: tmp.write_bytes(data))


def corrupt(rel: str, kind: str, exc: BaseException) -> ToolError:
    """The error for a file its parser rejects: names the file, the format and the reason."""
    reason = str(exc).strip() or type(exc).__name__
    return ToolError(f"{rel} cannot be read as {kind} ({type(exc).__name__}: {reason[:200]}); "
                     "the file may be corrupt or mislabelled: check it with filesystem_info")


def utc_text(moment: dt.datetime | dt.date) -> str:
    """`2025-07-21 09:30 UTC` (a naive datetime is taken as UTC); a date alone as `2025-07-21`."""
    if not isinstance(moment, dt.datetime):
        return moment.isoformat()
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def parse_when(text: str, what: str) -> dt.datetime:
    """An ISO date or datetime from an agent, in UTC (naive: taken as UTC; date: midnight)."""
    raw = text.strip().replace(" UTC", "").replace("Z", "+00:00")
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ToolError(f"{what} '{text}' is not an ISO date or time; use 2026-02-04 or "
                        "2026-02-04T10:00") from exc
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
