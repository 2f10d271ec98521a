"""The mail app: the world's mailboxes (`Mail/*.mbox`), read with the stdlib `mailbox` module.

A message is named by its Message-ID without angle brackets (`r2@acme.example`), the id the
grader's extractor reports, and every listing line starts with `id=` so the id can be copied
into `read`, `thread`, `attachment` or `reply`. Folders are the .mbox files of `Mail/`
(`inbox`, `sent`, ...); lookups by id search all of them, so a reply the agent sent shows up in
its thread. Times are printed in UTC.

Sending appends to `Mail/sent.mbox` (created when absent) with ids `agent-N@kwrl.local`, N
counting the sent folder's messages, so a trial's ids are the same from run to run; the date is
the time of sending. Nothing is delivered anywhere: the sent folder is the record a grader reads.
"""

from __future__ import annotations

import datetime as dt
import email
import mailbox
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses, parsedate_to_datetime
from pathlib import Path
from typing import Any

from kwrl.tools.apps.base import App, atomic_write, hit_list, matches, plural, terms, utc_text
from kwrl.tools.errors import ToolError
from kwrl.tools.paths import resolve
from kwrl.tools.truncate import truncate

MAIL_DIR = "Mail"
SENDER = "Agent <agent@kwrl.local>"
ID_DOMAIN = "kwrl.local"
MAX_ATTACHMENT_CHARS = 8_000
TEXT_TYPES = ("text/", "application/json", "application/csv", "application/xml")


@dataclass
class Message:
    id: str
    folder: str
    date: dt.datetime | None
    sender: str
    to: str
    cc: str
    subject: str
    body: str
    attachments: list[tuple[str, str, bytes]] = field(default_factory=list)
    """(filename, content type, bytes)."""
    in_reply_to: str = ""
    references: list[str] = field(default_factory=list)

    def summary(self) -> str:
        when = utc_text(self.date) if self.date else "unknown"
        line = f"id={self.id} | date={when} | from={self.sender} | subject={self.subject}"
        return line + (f" | attachments={len(self.attachments)}" if self.attachments else "")


def _ids(header: str) -> list[str]:
    return [part.strip("<>") for part in header.split() if part.strip("<>")]


def _parse(raw: Any, folder: str) -> Message:
    msg: EmailMessage = raw
    try:
        date = parsedate_to_datetime(str(msg["date"])) if msg["date"] else None
    except (TypeError, ValueError):
        date = None
    if date is not None and date.tzinfo is None:
        date = date.replace(tzinfo=dt.UTC)
    body_part = msg.get_body(preferencelist=("plain", "html"))
    body = body_part.get_content() if body_part is not None else ""
    attachments = [(part.get_filename() or "unnamed", part.get_content_type(),
                    part.get_payload(decode=True) or b"") for part in msg.iter_attachments()]
    parents = _ids(str(msg["in-reply-to"] or ""))
    return Message(
        id=str(msg["message-id"] or "").strip().strip("<>") or "(no id)",
        folder=folder, date=date, sender=str(msg["from"] or ""), to=str(msg["to"] or ""),
        cc=str(msg["cc"] or ""), subject=str(msg["subject"] or ""), body=body.strip(),
        attachments=attachments, in_reply_to=parents[0] if parents else "",
        references=_ids(str(msg["references"] or "")),
    )


def _read_mbox(path: Path, folder: str, rel: str) -> list[Message]:
    box = mailbox.mbox(path, factory=lambda f: email.message_from_binary_file(
        f, policy=policy.default), create=False)
    try:
        messages = [_parse(raw, folder) for raw in box]
    except Exception as exc:  # the email parser rarely raises, but a damaged file can
        raise ToolError(f"{rel} cannot be read as a mailbox ({type(exc).__name__}: {exc})"
                        ) from exc
    finally:
        box.close()
    if not messages and path.stat().st_size > 0:
        raise ToolError(f"{rel} is not an mbox mailbox (no 'From ' separator lines); "
                        "read it with filesystem_read")
    return messages


def _thread_root(message: Message, by_id: dict[str, Message]) -> str:
    """The id at the top of `message`'s chain: the oldest known ancestor, or its first ref."""
    if message.references:
        return message.references[0]
    current, seen = message, {message.id}
    while current.in_reply_to and current.in_reply_to not in seen:
        seen.add(current.in_reply_to)
        parent = by_id.get(current.in_reply_to)
        if parent is None:
            return current.in_reply_to
        current = parent
    return current.id


def _best_line(words: list[str], body: str) -> str:
    scored = [(sum(w in line.lower() for w in words), line.strip()) for line in body.splitlines()]
    scored = [(score, line) for score, line in scored if score and line]
    return max(scored, key=lambda pair: pair[0])[1][:300] if scored else ""


class Mail(App):
    """E-mail: list, search, read, follow threads, open attachments, send and reply."""

    name = "mail"

    def list_messages(self, folder: str = "inbox", limit: int = 50) -> str:
        """List messages of a folder, newest first: id, date, from, subject.

        Args:
            folder: `inbox`, `sent` (any .mbox in Mail/), or a workspace path to an .mbox file.
            limit: how many messages to list.
        """
        path, rel = self._folder(folder)
        messages = _read_mbox(path, Path(rel).stem, rel)
        if not messages:
            return f"{rel} has no messages"
        ordered = sorted(messages, key=lambda m: m.date or dt.datetime.min.replace(tzinfo=dt.UTC),
                         reverse=True)
        shown = ordered[:max(1, limit)]
        head = f"{rel}: {plural(len(messages), 'message')}, newest first"
        more = [f"[{len(ordered) - len(shown)} older not shown; raise limit]"] \
            if len(ordered) > len(shown) else []
        return truncate("\n".join([head, *(m.summary() for m in shown), *more]),
                        hint="use a smaller limit, or mail_search")

    def search(self, query: str, folder: str | None = None) -> str:
        """Find messages containing all words of `query`, with their ids and best matching line.

        Sender, recipients, subject, body and attachment names are searched.

        Args:
            query: words that must all appear in the message.
            folder: only this folder (default: every mailbox in Mail/).
        """
        words = terms(query)
        messages = self._messages(folder)
        hits = []
        for m in sorted(messages, key=lambda m: m.date or dt.datetime.min.replace(tzinfo=dt.UTC)):
            names = " ".join(a[0] for a in m.attachments)
            if matches(words, f"{m.sender} {m.to} {m.cc} {m.subject} {m.body} {names}"):
                line = _best_line(words, m.body)
                hits.append(m.summary() + (f" | line: {line}" if line else ""))
        where = folder or f"the mailboxes in {MAIL_DIR}/"
        return truncate(hit_list(hits, query, where), hint="use more words to narrow the query")

    def read(self, message_id: str) -> str:
        """Read one message: headers, body and attachment names.

        Args:
            message_id: the id from mail_list_messages or mail_search (no angle brackets).
        """
        m = self._find(message_id)
        lines = [f"id={m.id}", f"folder={m.folder}",
                 f"date={utc_text(m.date) if m.date else 'unknown'}", f"from={m.sender}",
                 f"to={m.to}"]
        lines += [f"cc={m.cc}"] if m.cc else []
        lines.append(f"subject={m.subject}")
        lines += [f"in_reply_to={m.in_reply_to}"] if m.in_reply_to else []
        for name, kind, data in m.attachments:
            lines.append(f"attachment={name} ({kind}, {len(data)} bytes; open with "
                         "mail_attachment)")
        lines += ["", m.body or "(empty body)"]
        return truncate("\n".join(lines), hint="the body was cut; save attachments with "
                        "mail_attachment")

    def thread(self, message_id: str) -> str:
        """Read the whole conversation a message belongs to, oldest first.

        Args:
            message_id: any message of the thread.
        """
        messages = self._messages(None)
        target = self._find(message_id, messages)
        by_id = {m.id: m for m in messages}
        root = _thread_root(target, by_id)
        members = [m for m in messages if _thread_root(m, by_id) == root]
        members.sort(key=lambda m: m.date or dt.datetime.min.replace(tzinfo=dt.UTC))
        blocks = []
        for number, m in enumerate(members, start=1):
            files = ", ".join(a[0] for a in m.attachments)
            head = f"--- {number}/{len(members)} {m.summary()}"
            blocks.append(head + (f" | files: {files}" if files else "") + f"\n{m.body}")
        return truncate("\n".join(blocks), hint="use mail_read on one message")

    def attachment(self, message_id: str, filename: str, save_as: str | None = None) -> str:
        """Open an attachment: text is returned (capped); with `save_as` it is written to a file.

        Args:
            message_id: the message's id.
            filename: the attachment's name as shown by mail_read.
            save_as: optional workspace path to save it to (e.g. `Data/final_revenue.csv`).
        """
        m = self._find(message_id)
        found = [a for a in m.attachments if a[0] == filename] or \
            [a for a in m.attachments if a[0].lower() == filename.strip().lower()]
        if not found:
            names = ", ".join(a[0] for a in m.attachments) or "none"
            raise ToolError(f"message {m.id} has no attachment '{filename}'; attachments: {names}")
        name, kind, data = found[0]
        if save_as:
            target = self._new_file(save_as, (Path(save_as).suffix.lower(),))
            atomic_write(target, data)
            return f"saved attachment {name} ({len(data)} bytes) to {self._rel(target)}"
        if not kind.startswith(TEXT_TYPES):
            return (f"{name} is {kind} ({len(data)} bytes), not text: pass save_as to write it "
                    "into the workspace, then read it with the app for its format")
        text = data.decode("utf-8-sig", errors="replace")
        return truncate(f"{name} ({kind}, {len(data)} bytes)\n{text}", MAX_ATTACHMENT_CHARS,
                        hint="pass save_as to write the whole file, then read it in parts")

    def send(self, to: list[str], subject: str, body: str) -> str:
        """Send a new message (recorded in Mail/sent.mbox).

        Args:
            to: recipient addresses, e.g. ["ines.moreau@client.example"].
            subject: the subject line.
            body: the message text.
        """
        if not to or any("@" not in address for address in to):
            raise ToolError("give at least one recipient address, each with an @")
        return self._append(to, subject, body, None)

    def reply(self, message_id: str, body: str) -> str:
        """Reply to a message's sender, in its thread (recorded in Mail/sent.mbox).

        Args:
            message_id: the message to answer.
            body: the reply text.
        """
        original = self._find(message_id)
        subject = original.subject
        if not subject.lower().startswith("re:"):
            subject = f"RE: {subject}"
        return self._append([original.sender], subject, body, original)

    def _append(self, to: list[str], subject: str, body: str, parent: Message | None) -> str:
        sent = self.root / MAIL_DIR / "sent.mbox"
        sent.parent.mkdir(exist_ok=True)
        existing = _read_mbox(sent, "sent", self._rel(sent)) if sent.exists() else []
        taken = {m.id for m in self._messages(None)} if (self.root / MAIL_DIR).is_dir() else set()
        number = len(existing) + 1
        while f"agent-{number}@{ID_DOMAIN}" in taken:
            number += 1
        message = EmailMessage(policy=policy.default)
        message_id = f"agent-{number}@{ID_DOMAIN}"
        message["Message-ID"] = f"<{message_id}>"
        message["Date"] = format_datetime(dt.datetime.now(dt.UTC).replace(microsecond=0))
        message["From"] = SENDER
        message["To"] = ", ".join(to)
        message["Subject"] = subject
        if parent is not None:
            message["In-Reply-To"] = f"<{parent.id}>"
            message["References"] = " ".join(f"<{r}>" for r in [*parent.references, parent.id])
        message.set_content(body)
        box = mailbox.mbox(sent, create=True)
        box.lock()
        try:
            box.add(message)
            box.flush()
        finally:
            box.unlock()
            box.close()
        names = ", ".join(addr for _, addr in getaddresses(to))
        return (f"sent id={message_id} | to={names} | subject={subject} "
                f"(saved in {self._rel(sent)})")

    def _folder(self, folder: str) -> tuple[Path, str]:
        text = folder.strip()
        rel = text if "/" in text or text.endswith(".mbox") else f"{MAIL_DIR}/{text}.mbox"
        if not (self.root / rel).exists():
            folder_dir = self.root / MAIL_DIR
            found = sorted(p.stem for p in folder_dir.glob("*.mbox")) if folder_dir.is_dir() \
                else []
            where = f"folders: {', '.join(found)}" if found else \
                "no mailboxes in Mail/; look for one with filesystem_find pattern *.mbox"
            raise ToolError(f"no mailbox at {rel}; {where}")
        path = resolve(self.root, rel, kind="file")  # refuses paths and links out of the root
        return path, self._rel(path)

    def _messages(self, folder: str | None) -> list[Message]:
        if folder is not None:
            path, rel = self._folder(folder)
            return _read_mbox(path, Path(rel).stem, rel)
        folder_dir = self.root / MAIL_DIR
        boxes = sorted(folder_dir.glob("*.mbox")) if folder_dir.is_dir() else []
        if not boxes:
            raise ToolError(f"no mailboxes in {MAIL_DIR}/; look for one with filesystem_find "
                            "pattern *.mbox and pass its path as folder")
        messages: list[Message] = []
        for box in boxes:
            path, rel = self._folder(f"{MAIL_DIR}/{box.name}")
            messages += _read_mbox(path, box.stem, rel)
        return messages

    def _find(self, message_id: str, messages: list[Message] | None = None) -> Message:
        wanted = message_id.strip().strip("<>")
        for m in messages if messages is not None else self._messages(None):
            if m.id == wanted:
                return m
        raise ToolError(f"no message with id '{message_id}'; ids look like r1@acme.example "
                        "(see mail_list_messages or mail_search)")
