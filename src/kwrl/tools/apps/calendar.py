"""The calendar app: the world's iCalendar file (`Calendar/calendar.ics`), listed and added to.

Events print one per line, sorted by start, in UTC: `start=2026-02-04 10:00 UTC | end=... |
summary=Steering committee: Acme | location=Room 4.01 | attendees=a@x.example, b@x.example |
uid=e0@x.example`. Date filters take ISO dates or datetimes; an end given as a date includes
that whole day. New events get uids `agent-N@kwrl.local` and the file is rewritten atomically
with icalendar, keeping every other component as it was.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from kwrl.tools.apps.base import (
    App,
    atomic_write,
    hit_list,
    matches,
    parse_when,
    terms,
    utc_text,
)
from kwrl.tools.errors import ToolError
from kwrl.tools.paths import resolve
from kwrl.tools.truncate import truncate

CALENDAR_FILE = "Calendar/calendar.ics"
ID_DOMAIN = "kwrl.local"


def _moment(prop: Any) -> dt.datetime | dt.date | None:
    value = getattr(prop, "dt", None)
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _as_datetime(value: dt.datetime | dt.date) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value, dt.time(), tzinfo=dt.UTC)


def _attendees(event: Any) -> list[str]:
    found = event.get("attendee", [])
    found = found if isinstance(found, list) else [found]
    return [re.sub(r"(?i)^mailto:", "", str(a)) for a in found]


def _event_line(event: Any) -> str:
    start, end = _moment(event.get("dtstart")), _moment(event.get("dtend"))
    parts = [f"start={utc_text(start) if start else '?'}", f"end={utc_text(end) if end else '?'}",
             f"summary={event.get('summary', '')}"]
    for key in ("location", "description"):
        if event.get(key):
            parts.append(f"{key}={' '.join(str(event.get(key)).split())}")
    attendees = _attendees(event)
    if attendees:
        parts.append(f"attendees={', '.join(attendees)}")
    parts.append(f"uid={event.get('uid', '')}")
    return " | ".join(parts)


def _sort_key(event: Any) -> dt.datetime:
    start = _moment(event.get("dtstart"))
    return _as_datetime(start) if start else dt.datetime.min.replace(tzinfo=dt.UTC)


class Calendar(App):
    """The team calendar: list events in a period, search, create events."""

    name = "calendar"

    def list_events(self, start: str | None = None, end: str | None = None,
                    path: str = CALENDAR_FILE) -> str:
        """List events overlapping the period from `start` to `end`, sorted by start time.

        Args:
            start: ISO date or datetime, e.g. 2026-02-01 (default: no lower bound).
            end: ISO date (whole day included) or datetime (default: no upper bound).
            path: the .ics file (default Calendar/calendar.ics).
        """
        _, rel, calendar = self._load(path)
        low = parse_when(start, "start") if start else None
        high = parse_when(end, "end") if end else None
        if high is not None and end and "T" not in end and " " not in end.strip():
            high += dt.timedelta(days=1)  # a date as the end means the whole of that day
        events = sorted(calendar.walk("VEVENT"), key=_sort_key)
        chosen = [e for e in events if self._overlaps(e, low, high)]
        period = f" from {start or 'the beginning'} to {end or 'the end'}" if start or end else ""
        if not chosen:
            return f"no events in {rel}{period} ({len(events)} events in the calendar)"
        head = f"{rel}: {len(chosen)} event{'s' if len(chosen) != 1 else ''}{period} (times UTC)"
        return truncate("\n".join([head, *(_event_line(e) for e in chosen)]),
                        hint="give a shorter period with start and end")

    def search(self, query: str, path: str = CALENDAR_FILE) -> str:
        """Find events whose summary, location, description or attendees contain all words.

        Args:
            query: words that must all appear in one event.
            path: the .ics file (default Calendar/calendar.ics).
        """
        words = terms(query)
        _, rel, calendar = self._load(path)
        hits = [_event_line(e) for e in sorted(calendar.walk("VEVENT"), key=_sort_key)
                if matches(words, _event_line(e))]
        return truncate(hit_list(hits, query, rel), hint="use more words to narrow the query")

    def create_event(self, summary: str, start: str, end: str, location: str = "",
                     attendees: list[str] | None = None, path: str = CALENDAR_FILE) -> str:
        """Create an event (saved to the calendar file).

        Args:
            summary: the event title.
            start: ISO datetime, e.g. 2026-02-04T10:00 (UTC unless an offset is given).
            end: ISO datetime, after start.
            location: where it takes place.
            attendees: e-mail addresses of the attendees.
            path: the .ics file (default Calendar/calendar.ics).
        """
        import icalendar

        if not summary.strip():
            raise ToolError("the summary is empty; give the event a title")
        begin, finish = parse_when(start, "start"), parse_when(end, "end")
        if finish <= begin:
            raise ToolError(f"end ({end}) must be after start ({start})")
        file, rel, calendar = self._load(path)
        taken = {str(e.get("uid", "")) for e in calendar.walk("VEVENT")}
        number = 1
        while f"agent-{number}@{ID_DOMAIN}" in taken:
            number += 1
        event = icalendar.Event()
        event.add("uid", f"agent-{number}@{ID_DOMAIN}")
        event.add("dtstamp", dt.datetime.now(dt.UTC).replace(microsecond=0))
        event.add("dtstart", begin)
        event.add("dtend", finish)
        event.add("summary", summary)
        if location:
            event.add("location", location)
        for address in attendees or []:
            event.add("attendee", icalendar.vCalAddress(f"mailto:{address.strip()}"))
        calendar.add_component(event)
        atomic_write(file, calendar.to_ical())
        return f"created in {rel}: {_event_line(event)}"

    def _load(self, path: str) -> tuple[Path, str, Any]:
        import icalendar

        if not (self.root / path).exists():
            raise ToolError(f"no calendar at {path}; look for one with filesystem_find pattern "
                            "*.ics and pass it as path")
        file = resolve(self.root, path, kind="file")
        try:
            calendar = icalendar.Calendar.from_ical(file.read_bytes())
        except Exception as exc:  # icalendar raises ValueError and others on bad input
            raise ToolError(f"{path} cannot be read as an iCalendar file ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); the file may be corrupt") from exc
        return file, self._rel(file), calendar

    def _overlaps(self, event: Any, low: dt.datetime | None, high: dt.datetime | None) -> bool:
        start, end = _moment(event.get("dtstart")), _moment(event.get("dtend"))
        if start is None:
            return low is None and high is None
        begin = _as_datetime(start)
        finish = _as_datetime(end) if end else begin
        return (low is None or finish >= low) and (high is None or begin < high)
