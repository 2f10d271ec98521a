"""A world's communications: the mailbox, the chat channels and the calendar.

They carry facts that live nowhere else (the steering committee's decision, the amendment's
signature, meeting times) and restate some that do (the draft correction), so that tasks can
require reading across channels and documents.
"""

from __future__ import annotations

import datetime as dt

from kwrl.types import Domain
from kwrl.worlds import docmodel as dm
from kwrl.worlds.facts import WorldFacts, quarter_end


def _addr(person) -> str:
    return f"{person.name} <{person.email}>"


def _host(f: WorldFacts) -> str:
    return f.team[0].email.split("@")[1]


def _domain_thread(f: WorldFacts, start: dt.datetime) -> list[dm.Email]:
    lead, client = f.team[0], f.client[0]
    if f.domain == Domain.CONSULTING:
        subject = "Steering committee outcome"
        body = (f"Dear {client.name.split()[0]},\n\nThank you for today's steering committee. As "
                f"agreed, {f.company} will proceed with option '{f.chosen_option}'. We will come "
                f"back with an implementation plan.\n\nBest regards,\n{lead.name}\n{f.firm}")
        when = dt.datetime.combine(f.decision_date, dt.time(18, 5))
    elif f.domain == Domain.BANKING:
        subject = f"Project update: indicative offer from {f.acquirer}"
        body = (f"Team,\n\n{f.acquirer} has submitted its offer for {f.company}. The offer letter "
                f"is in the Deal folder. Please update the valuation materials.\n\n{lead.name}")
        when = start + dt.timedelta(days=3)
    else:
        c = f.contracts[0]
        subject = f"{c.counterparty}: amendment No. 1 signed"
        body = (f"All,\n\nAmendment No. 1 to the {c.kind} with {c.counterparty} was signed on "
                f"{c.amendment_date:%d %B %Y}. The signed copy is filed with the contract. It "
                f"changes the termination for convenience notice period; the rest of the "
                f"agreement is unchanged.\n\n{lead.name}")
        when = dt.datetime.combine(c.amendment_date, dt.time(16, 40))
    return [dm.Email(f"d1@{_host(f)}", _addr(lead), (_addr(client), _addr(f.team[1])), when,
                     subject, body)]


def _correction_thread(f: WorldFacts) -> list[dm.Email]:
    cfo, manager = f.client[0], f.team[1]
    period = f.draft_period
    sent = dt.datetime.combine(quarter_end(period) + dt.timedelta(days=21), dt.time(9, 30))
    first = dm.Email(
        f"r1@{_host(f)}", _addr(cfo), (_addr(manager),), sent,
        f"{period} quarterly report - draft v1",
        f"Hi {manager.name.split()[0]},\n\nAttached for your review is draft v1 of the {period} "
        f"quarterly report. Figures are preliminary.\n\nRegards,\n{cfo.name}")
    csv = "segment,revenue_musd\n" + "".join(
        f"{s},{f.revenue[s][period]}\n" for s in f.segments)
    second = dm.Email(
        f"r2@{_host(f)}", _addr(cfo), (_addr(manager),), sent + dt.timedelta(days=9),
        f"RE: {period} quarterly report - draft v1",
        f"Hi {manager.name.split()[0]},\n\nPlease disregard draft v1: segment revenue was "
        f"restated after the audit review. The final {period} report is now in the Reports "
        f"folder and supersedes the draft. Final segment revenue attached as CSV.\n\n{cfo.name}",
        in_reply_to=f"r1@{_host(f)}",
        attachments=(dm.Attachment(f"final_revenue_{period.replace(' ', '_')}.csv",
                                   csv.encode(), "text/csv"),))
    return [first, second]


def _noise_emails(f: WorldFacts, start: dt.datetime) -> list[dm.Email]:
    subjects = ("Expense policy reminder", "Office closure on Friday", "Updated org chart",
                "Travel booking for next week", "Lunch and learn: Excel tips")
    out = []
    for i, subject in enumerate(subjects):
        sender = f.people[(i + 2) % len(f.people)]
        out.append(dm.Email(
            f"n{i}@{_host(f)}", _addr(sender), (_addr(f.team[2]),),
            start + dt.timedelta(days=7 * i, hours=i), subject,
            f"Hello,\n\n{subject}. No action needed unless you have questions.\n\n{sender.name}"))
    return out


def mailbox(f: WorldFacts, distractors: bool = True) -> tuple[dm.Email, ...]:
    start = dt.datetime(2025, 6, 2, 9, 0)
    emails = _domain_thread(f, start) + _noise_emails(f, start)
    if distractors:
        emails += _correction_thread(f)
    return tuple(sorted(emails, key=lambda e: e.date))


def chat(f: WorldFacts) -> tuple[dm.ChatChannel, ...]:
    team = f.team
    t0 = dt.datetime(2025, 10, 6, 9, 15)
    lines = [
        (team[0], f"Kick-off for {f.company} is confirmed. Files are in the shared workspace."),
        (team[1], f"Reminder: the {f.draft_period} draft report is superseded; use the final."),
        (team[2], "Budget vs actual workbook still needs the Q4 2025 actuals."),
    ]
    if f.domain == Domain.CONSULTING:
        lines.append((team[1], f"Decision from the steering committee on "
                               f"{f.decision_date:%d %B %Y}: go with '{f.chosen_option}'."))
    elif f.domain == Domain.BANKING:
        lines.append((team[1], f"{f.acquirer} offer is ${f.offer_price:.2f} per share; "
                               f"see the offer letter."))
    else:
        c = f.contracts[0]
        lines.append((team[1], f"{c.counterparty} amendment is signed; check the new notice "
                               f"period before advising on termination."))
    work = dm.ChatChannel(slug_channel(f.company), tuple(
        dm.ChatMessage(p.name, t0 + dt.timedelta(hours=3 * i), text)
        for i, (p, text) in enumerate(lines)), topic=f"Work on {f.company}")
    social = dm.ChatChannel("random", (
        dm.ChatMessage(team[2].name, t0, "Coffee machine on floor 4 is fixed."),
        dm.ChatMessage(team[0].name, t0 + dt.timedelta(days=1), "Team dinner on Thursday?"),
    ), topic="Anything goes")
    return (work, social)


def slug_channel(name: str) -> str:
    return "-".join(name.lower().split())


def calendar(f: WorldFacts) -> tuple[dm.CalendarEvent, ...]:
    emails = tuple(p.email for p in f.people[:4])
    events = [
        dm.CalendarEvent(f"e{i}@{_host(f)}", f"{title}: {f.company}", start,
                         start + dt.timedelta(hours=1), location, f"{title} with the client.",
                         emails)
        for i, (title, start, location) in enumerate(f.events)
    ]
    events.append(dm.CalendarEvent(f"weekly@{_host(f)}", "Team weekly", dt.datetime(2026, 1, 5, 9),
                                   dt.datetime(2026, 1, 5, 9, 30), "Video call", "", emails[:3]))
    return tuple(events)
