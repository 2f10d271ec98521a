"""Render a world's communication: e-mail (mbox, eml), chat export (JSON) and calendar (ics).

E-mail is built with the stdlib `email` package, so headers are folded and encoded the way mail
clients expect. Three things would otherwise make the bytes differ from run to run, and each is
fixed from the model: the `Date` header (from `Email.date`), the multipart boundary (derived from
the Message-ID instead of `random`), and the mbox `From ` separator line, which `mailbox.mbox`
stamps with the current time unless the message carries its own (we set it from `Email.date`).

Threads: `In-Reply-To` names the parent; `References` lists the ancestors from the thread root
down, as far as they are among the messages being written (RFC 5322 §3.6.4).

Naive datetimes anywhere in this module are taken as UTC, so a file never depends on the
machine's time zone. The calendar is written in UTC (`Z` times), with `DTSTAMP` set to the event
start rather than the time of writing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import mailbox
from collections.abc import Mapping, Sequence
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime, parseaddr
from pathlib import Path

import icalendar

from kwrl.worlds.docmodel import CalendarEvent, ChatChannel, Email

ICS_PRODID = "-//kwrl//worlds//EN"


def write_eml(email: Email, path: Path, *, thread: Sequence[Email] = ()) -> None:
    """Write one message as an RFC 5322 .eml file.

    `thread` (the other messages of the world, optional) lets `References` name the whole chain
    of ancestors, as it does in the mbox; without it, `References` names the parent only.
    """
    message = _email_message(email, _by_id([*thread, email]))
    path.write_bytes(message.as_bytes())


def write_mbox(emails: Sequence[Email], path: Path) -> None:
    """Write `emails`, in the given order, as one mbox file (replacing any file at `path`)."""
    by_id = _by_id(emails)
    path.unlink(missing_ok=True)
    box = mailbox.mbox(path, create=True)
    try:
        for email in emails:
            message = _email_message(email, by_id)
            sent = _utc(email.date).strftime("%a %b %d %H:%M:%S %Y")
            message.set_unixfrom(f"From {parseaddr(email.sender)[1] or 'unknown'} {sent}")
            box.add(message)
        box.flush()
    finally:
        box.close()


def write_chat(channels: Sequence[ChatChannel], path: Path) -> None:
    """Write a chat export as JSON: channels with name, topic and messages (user, ts, text)."""
    export = {
        "channels": [
            {
                "name": channel.name,
                "topic": channel.topic,
                "messages": [
                    {"user": m.user, "ts": _utc(m.ts).isoformat(), "text": m.text}
                    for m in channel.messages
                ],
            }
            for channel in channels
        ]
    }
    text = json.dumps(export, sort_keys=True, indent=2, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")


def write_ics(events: Sequence[CalendarEvent], path: Path) -> None:
    """Write `events` as one iCalendar (RFC 5545) file."""
    calendar = icalendar.Calendar()
    calendar.add("prodid", ICS_PRODID)
    calendar.add("version", "2.0")
    for event in events:
        calendar.add_component(_ics_event(event))
    path.write_bytes(calendar.to_ical())


def _email_message(email: Email, by_id: Mapping[str, Email]) -> EmailMessage:
    message = EmailMessage(policy=policy.default)
    message["Message-ID"] = f"<{email.message_id}>"
    message["Date"] = format_datetime(_utc(email.date))
    message["From"] = email.sender
    message["To"] = ", ".join(email.to)
    if email.cc:
        message["Cc"] = ", ".join(email.cc)
    message["Subject"] = email.subject
    if email.in_reply_to is not None:
        message["In-Reply-To"] = f"<{email.in_reply_to}>"
        message["References"] = " ".join(f"<{ref}>" for ref in _references(email, by_id))
    message.set_content(email.body)
    for attachment in email.attachments:
        maintype, _, subtype = attachment.mime_type.partition("/")
        message.add_attachment(
            attachment.content,
            maintype=maintype,
            subtype=subtype or "octet-stream",
            filename=attachment.filename,
        )
    if message.is_multipart():
        digest = hashlib.sha256(email.message_id.encode()).hexdigest()[:24]
        message.set_boundary(f"=_kwrl_{digest}")
    return message


def _references(email: Email, by_id: Mapping[str, Email]) -> list[str]:
    """Ancestors of `email`, root first; stops at a parent that is not among `by_id`."""
    chain: list[str] = []
    parent_id = email.in_reply_to
    while parent_id is not None and parent_id not in chain:
        chain.append(parent_id)
        parent = by_id.get(parent_id)
        parent_id = parent.in_reply_to if parent is not None else None
    return chain[::-1]


def _by_id(emails: Sequence[Email]) -> dict[str, Email]:
    return {email.message_id: email for email in emails}


def _ics_event(event: CalendarEvent) -> icalendar.Event:
    component = icalendar.Event()
    component.add("uid", event.uid)
    component.add("dtstamp", _utc(event.start))
    component.add("dtstart", _utc(event.start))
    component.add("dtend", _utc(event.end))
    component.add("summary", event.summary)
    if event.location:
        component.add("location", event.location)
    if event.description:
        component.add("description", event.description)
    for address in event.attendees:
        component.add("attendee", icalendar.vCalAddress(f"mailto:{address}"))
    return component


def _utc(moment: dt.datetime) -> dt.datetime:
    """`moment` in UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)
