"""Mail, chat and calendar on a generated world: listings with copyable ids, searches that
return the matching line, threads, and writes that the grader's extractors read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kwrl.graders.extract import IcsContent, MailContent, extract
from kwrl.tools import ToolError
from kwrl.tools.apps import Calendar, Chat, Mail
from kwrl.worlds.facts import WorldFacts
from kwrl.worlds.threads import slug_channel

World = tuple[WorldFacts, Path]


def host(facts: WorldFacts) -> str:
    return facts.team[0].email.split("@")[1]


def test_list_messages_gives_ids_newest_first(world: World) -> None:
    facts, root = world
    lines = Mail(root).list_messages().splitlines()
    assert lines[0] == "Mail/inbox.mbox: 8 messages, newest first"
    dates = [line.split(" | ")[1] for line in lines[1:]]
    assert all(d.startswith("date=") for d in dates) and dates == sorted(dates, reverse=True)
    r2 = next(line for line in lines if line.startswith(f"id=r2@{host(facts)} | "))
    assert r2.endswith(f"| subject=RE: {facts.draft_period} quarterly report - draft v1 | "
                       "attachments=1")
    assert Mail(root).list_messages(limit=3).splitlines()[-1] == "[5 older not shown; raise limit]"


def test_search_returns_the_message_and_its_best_matching_line(world: World) -> None:
    facts, root = world
    hits = Mail(root).search("disregard draft").splitlines()
    assert hits[0] == "1 match for 'disregard draft' in the mailboxes in Mail/"
    assert hits[1].startswith(f"id=r2@{host(facts)} |")
    assert hits[1].endswith("| line: Please disregard draft v1: segment revenue was restated "
                            "after the audit review. The final "
                            f"{facts.draft_period} report is now in the Reports folder and "
                            "supersedes the draft. Final segment revenue attached as CSV.")
    assert Mail(root).search("zzz").startswith("no matches for 'zzz'")


def test_read_thread_and_attachment(world: World) -> None:
    facts, root = world
    mail = Mail(root)
    read = mail.read(f"<r2@{host(facts)}>")
    assert f"in_reply_to=r1@{host(facts)}" in read
    name = f"final_revenue_{facts.draft_period.replace(' ', '_')}.csv"
    assert f"attachment={name} (text/csv" in read
    thread = mail.thread(f"r2@{host(facts)}")
    assert thread.index(f"--- 1/2 id=r1@{host(facts)}") < thread.index("--- 2/2 id=r2@")
    segment = facts.segments[0]
    text = mail.attachment(f"r2@{host(facts)}", name)
    assert f"{segment},{facts.revenue[segment][facts.draft_period]}" in text.splitlines()


def test_attachment_save_as_writes_into_the_workspace(world: World, workspace: Path) -> None:
    facts = world[0]
    name = f"final_revenue_{facts.draft_period.replace(' ', '_')}.csv"
    report = Mail(workspace).attachment(f"r2@{host(facts)}", name, save_as="Data/final.csv")
    assert report.startswith(f"saved attachment {name} (")
    assert (workspace / "Data" / "final.csv").read_text().startswith("segment,revenue_musd")
    with pytest.raises(ToolError, match="already exists"):
        Mail(workspace).attachment(f"r2@{host(facts)}", name, save_as="Data/final.csv")


def test_reply_and_send_are_recorded_in_the_sent_folder(world: World, workspace: Path) -> None:
    facts = world[0]
    mail = Mail(workspace)
    reply = mail.reply(f"r2@{host(facts)}", "Thanks, we will use the final figures.")
    assert reply.startswith(f"sent id=agent-1@kwrl.local | to={facts.client[0].email}")
    mail.send(["someone@example.com"], "Status", "All done.")
    sent = extract(workspace / "Mail" / "sent.mbox")
    assert isinstance(sent, MailContent)
    assert [m.message_id for m in sent.messages] == ["agent-1@kwrl.local", "agent-2@kwrl.local"]
    assert sent.messages[0].subject.startswith("RE: ")
    assert sent.messages[1].body == "All done."
    assert "--- 3/3 id=agent-1@kwrl.local" in mail.thread(f"r1@{host(facts)}")
    assert "Mail/sent.mbox: 2 messages" in mail.list_messages("sent")


def test_mail_errors_say_where_to_look(world: World, tmp_path: Path) -> None:
    facts, root = world
    with pytest.raises(ToolError, match="no message with id 'nope@x'.*mail_list_messages"):
        Mail(root).read("nope@x")
    with pytest.raises(ToolError, match="no attachment 'x.pdf'; attachments: final_revenue"):
        Mail(root).attachment(f"r2@{host(facts)}", "x.pdf")
    with pytest.raises(ToolError, match="no mailbox at Mail/archive.mbox; folders: inbox"):
        Mail(root).list_messages("archive")
    with pytest.raises(ToolError, match="recipient"):
        Mail(root).send([], "x", "y")
    with pytest.raises(ToolError, match="filesystem_find pattern \\*.mbox"):
        Mail(tmp_path).search("x")
    (tmp_path / "Mail").mkdir()
    (tmp_path / "Mail" / "inbox.mbox").write_text("garbage without separators\n")
    with pytest.raises(ToolError, match="Mail/inbox.mbox is not an mbox mailbox"):
        Mail(tmp_path).list_messages()


def test_chat_lists_reads_searches_and_posts(world: World, workspace: Path) -> None:
    facts = world[0]
    chat = Chat(workspace)
    channel = slug_channel(facts.company)
    assert f"channel={channel} | topic=Work on {facts.company} | messages=4" in \
        chat.list_channels()
    last = chat.read(f"#{channel}", limit=1).splitlines()
    assert last[0] == f"#{channel}: 4 messages, showing the last 1"
    assert last[1].startswith("2025-10-06 18:15 UTC | ")
    hits = chat.search("superseded").splitlines()
    assert hits[1].startswith(f"#{channel} | 2025-10-06 12:15 UTC | {facts.team[1].name}: ")
    assert chat.post("random", "Q4 actuals are in.").startswith("posted to #random: ")
    export = extract(workspace / "Chat" / "channels.json")
    messages = export.value["channels"][1]["messages"]  # type: ignore[union-attr]
    assert (messages[-1]["user"], messages[-1]["text"]) == ("agent", "Q4 actuals are in.")
    assert chat.read("random").splitlines()[-1].endswith("| agent: Q4 actuals are in.")
    with pytest.raises(ToolError, match=f"no channel 'general'.*channels: {channel}, random"):
        chat.read("general")


def test_chat_export_that_is_not_json_is_a_tool_error(workspace: Path) -> None:
    (workspace / "Chat" / "channels.json").write_text("{not json")
    with pytest.raises(ToolError, match="Chat/channels.json cannot be read as JSON"):
        Chat(workspace).list_channels()
    (workspace / "Chat" / "channels.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ToolError, match="is not a chat export"):
        Chat(workspace).list_channels()


def test_calendar_lists_by_period_searches_and_creates(world: World, workspace: Path) -> None:
    facts = world[0]
    calendar = Calendar(workspace)
    title, start, location = facts.events[0]
    day = start.date().isoformat()
    listed = calendar.list_events(day, day).splitlines()
    assert listed[0] == f"Calendar/calendar.ics: 1 event from {day} to {day} (times UTC)"
    assert listed[1].startswith(f"start={start:%Y-%m-%d %H:%M} UTC | ")
    assert f"summary={title}: {facts.company} | location={location}" in listed[1]
    assert calendar.search(title).splitlines()[1] == listed[1]
    created = calendar.create_event("Budget review", "2026-03-02T14:00", "2026-03-02T15:00",
                                    "Room 1", [facts.team[0].email])
    assert created.startswith("created in Calendar/calendar.ics: start=2026-03-02 14:00 UTC |")
    content = extract(workspace / "Calendar" / "calendar.ics")
    assert isinstance(content, IcsContent)
    new = [e for e in content.events if e.summary == "Budget review"]
    assert new and new[0].uid == "agent-1@kwrl.local"
    assert new[0].attendees == (facts.team[0].email,)
    assert "Budget review" in calendar.list_events("2026-03-02", "2026-03-02")


def test_calendar_errors_are_actionable(world: World, tmp_path: Path) -> None:
    root = world[1]
    with pytest.raises(ToolError, match="end .* must be after start"):
        Calendar(root).create_event("x", "2026-03-02T14:00", "2026-03-02T13:00")
    with pytest.raises(ToolError, match="'next week' is not an ISO date"):
        Calendar(root).list_events("next week")
    with pytest.raises(ToolError, match="no calendar at Calendar/calendar.ics; .*\\*.ics"):
        Calendar(tmp_path).list_events()
    assert Calendar(root).list_events("1990-01-01", "1990-01-02").startswith("no events in ")
