"""Compose a world's documents from its facts: which files exist and what each one says.

`compose_world` returns a mapping from workspace-relative path to a document model; rendering to
bytes is the writers' job. Paths are stable functions of the facts (`paths` below), so task
templates can name files without re-deriving them. Every world gets the shared financial core
(workbook, quarterly reports, board decks, mail, chat, calendar) plus its domain's documents, the
deliverable templates that tier-4 tasks edit, and noise files up to the requested count.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from kwrl.types import Domain
from kwrl.worlds import docmodel as dm
from kwrl.worlds.facts import PERIODS, WorldFacts, quarter_end

DocModel = dm.Document | dm.Workbook | dm.Deck | dm.Table | tuple
"""A tuple is a mailbox (Email...), chat (ChatChannel...) or calendar (CalendarEvent...)."""

TBD = "[to be completed]"


def slug(text: str) -> str:
    return "_".join(text.replace("&", "and").replace(",", "").split())


def money(value: float) -> str:
    return f"${value:,.1f}m"


@dataclass(frozen=True)
class Paths:
    """Where each fact-bearing file of a world lives."""

    facts: WorldFacts

    @property
    def financials(self) -> str:
        return f"Finance/{slug(self.facts.company)}_Financials_FY2024-FY2025.xlsx"

    def report(self, period: str) -> str:
        return f"Reports/Quarterly_Report_{slug(period)}.pdf"

    @property
    def draft_report(self) -> str:
        return f"Reports/Quarterly_Report_{slug(self.facts.draft_period)}_DRAFT_v1.pdf"

    def board_deck(self, period: str) -> str:
        return f"Board/Board_Update_{slug(period)}.pptx"

    def csv(self, year: int) -> str:
        return f"Data/segment_revenue_{year}.csv"

    mailbox = "Mail/inbox.mbox"
    chat = "Chat/channels.json"
    calendar = "Calendar/calendar.ics"
    budget = "Finance/Budget_vs_Actual_2025.xlsx"

    @property
    def segment_summary(self) -> str:
        return f"Memos/Segment_Summary_{slug(self.facts.draft_period)}.docx"

    board_periods = ("Q4 2024", "Q2 2025", "Q4 2025")
    update_deck_period = "Q4 2025"

    @property
    def steering_deck(self) -> str:
        return f"Engagement/Steering_Committee_{self.facts.decision_date:%Y-%m-%d}.pptx"

    cost_review = "Engagement/Cost_Review.docx"
    comps = "Deal/Comparable_Companies.xlsx"
    capitalization = "Deal/Capitalization_Table.docx"

    @property
    def offer_letter(self) -> str:
        return f"Deal/Offer_Letter_{slug(self.facts.acquirer)}.pdf"

    def contract(self, key: str) -> str:
        c = next(c for c in self.facts.contracts if c.key == key)
        return f"Contracts/{slug(c.counterparty)}_{slug(c.kind)}.docx"

    def amendment(self, key: str) -> str:
        c = next(c for c in self.facts.contracts if c.key == key)
        return f"Contracts/{slug(c.counterparty)}_Amendment_No1.pdf"

    register = "Matters/Contract_Register.xlsx"


def _segment_sheet(f: WorldFacts, name: str, table: dict) -> dm.Sheet:
    header = ("Segment", *PERIODS)
    rows: list[tuple] = [header]
    for seg in f.segments:
        rows.append((seg, *(table[seg][p] for p in PERIODS)))
    last = len(f.segments) + 1
    total = ["Total"]
    for j, period in enumerate(PERIODS):
        col = chr(ord("B") + j)
        cached = round(sum(table[s][period] for s in f.segments), 1)
        total.append(dm.Formula(f"=SUM({col}2:{col}{last})", cached))
    rows.append(tuple(total))
    return dm.Sheet(name, tuple(rows))


def financials_workbook(f: WorldFacts) -> dm.Workbook:
    margin_rows: list[tuple] = [("Segment", *PERIODS)]
    for i, seg in enumerate(f.segments, start=2):
        cells = [seg]
        for j, p in enumerate(PERIODS):
            col = chr(ord("B") + j)
            cached = round(f.ebitda[seg][p] / f.revenue[seg][p], 4)
            cells.append(dm.Formula(f"=ROUND(EBITDA!{col}{i}/Revenue!{col}{i},4)", cached))
        margin_rows.append(tuple(cells))
    notes = dm.Sheet("Notes", (
        ("Source", f"{f.company} management accounts"),
        ("Units", "USD millions"),
        ("Status", "Final, reconciled to the quarterly reports"),
    ))
    return dm.Workbook((
        _segment_sheet(f, "Revenue", f.revenue),
        _segment_sheet(f, "EBITDA", f.ebitda),
        dm.Sheet("Margin", tuple(margin_rows)),
        notes,
    ), author=f.team[2].name)


def segment_table(f: WorldFacts, period: str, revenue: dict[str, float] | None = None) -> dm.Table:
    revenue = revenue or {s: f.revenue[s][period] for s in f.segments}
    rows = tuple((s, revenue[s], f.ebitda[s][period]) for s in f.segments)
    total = (
        "Total", round(sum(revenue.values()), 1), f.total("ebitda", period))
    return dm.Table(("Segment", "Revenue ($m)", "EBITDA ($m)"), (*rows, total),
                    caption=f"Segment results, {period}")


def quarterly_report(f: WorldFacts, period: str, draft: bool = False) -> dm.Document:
    revenue = dict(f.draft_revenue) if draft else {s: f.revenue[s][period] for s in f.segments}
    title = f"{f.company}: Quarterly Report {period}" + (" (DRAFT v1, superseded)" if draft else "")
    status = ("Draft for internal review. Figures are preliminary and subject to change."
              if draft else "Final. Figures reconciled with the management accounts.")
    intro = (f"This report summarises the trading performance of {f.company} for the quarter "
             f"ended {quarter_end(period):%d %B %Y}. Total revenue for the quarter was "
             f"{money(round(sum(revenue.values()), 1))} across {len(f.segments)} segments.")
    commentary = [
        dm.Paragraph(f"{seg}: revenue of {money(revenue[seg])} and EBITDA of "
                     f"{money(f.ebitda[seg][period])}.", "bullet")
        for seg in f.segments
    ]
    outlook = (
        dm.Paragraph("Outlook", "heading1"),
        dm.Paragraph("Management expects trading to remain in line with the plan; pricing "
                     "actions and cost discipline continue to support margins."),
    )
    head = (dm.Paragraph(status), dm.Paragraph("Overview", "heading1"), dm.Paragraph(intro))
    table = segment_table(f, period, revenue)
    # Odd quarters use two columns with the figures only in a table that lands in the right
    # column, beside prose: the layout whose naive text extraction interleaves rows and prose.
    two_column = int(period[1]) % 2 == 1
    if two_column:
        blocks = (*head, *_market_context(f, period), *outlook, dm.ColumnBreak(), table)
    else:
        blocks = (*head, table, dm.Paragraph("Segment commentary", "heading1"), *commentary,
                  *outlook)
    return dm.Document(
        title=title,
        blocks=blocks,
        author=f.client[0].name,
        date=quarter_end(period) + dt.timedelta(days=30),
        columns=2 if two_column else 1,
    )


def _market_context(f: WorldFacts, period: str) -> tuple[dm.Paragraph, ...]:
    """Prose long enough that the segment table lands in the right column of a two-column page:
    the layout in which naive text extraction interleaves table rows with prose."""
    segs = ", ".join(f.segments)
    return (
        dm.Paragraph("Market context", "heading1"),
        dm.Paragraph(f"Demand across {segs} was shaped by customer budgets, input costs and the "
                     f"timing of large orders during {period}. Management continued to prioritise "
                     "pricing discipline over volume, and inventory levels were kept close to "
                     "plan throughout the quarter."),
        dm.Paragraph("Competitive intensity was broadly unchanged. Several competitors announced "
                     "price increases, while new entrants focused on niche products. The company "
                     "kept its investment programme on schedule and expects no change to the "
                     "capital expenditure guidance given at the start of the year."),
        dm.Paragraph("Working capital remained under close review. Receivable days improved "
                     "slightly, helped by tighter collection processes, while payables were in "
                     "line with contractual terms agreed with the main suppliers."),
    )


def board_deck(f: WorldFacts, period: str, total_revenue: str | None = None) -> dm.Deck:
    """`total_revenue` overrides the Key figures line (a placeholder, or a task's edit)."""
    year_periods = [p for p in PERIODS if p.endswith(period[-4:])]
    total_rev = total_revenue or money(f.total("revenue", period))
    chart = dm.Chart(
        title="Revenue by segment ($m)",
        categories=tuple(year_periods),
        series=tuple((s, tuple(f.revenue[s][p] for p in year_periods)) for s in f.segments),
    )
    return dm.Deck(
        title=f"{f.company} Board Update {period}",
        slides=(
            dm.Slide(f"{f.company} Board Update {period}", (f"Prepared by {f.firm}",)),
            dm.Slide("Key figures", (
                f"Total revenue {period}: {total_rev}",
                f"Total EBITDA {period}: {money(f.total('ebitda', period))}",
                f"Segments reported: {len(f.segments)}",
            )),
            dm.Slide("Segment results", table=segment_table(f, period)),
            dm.Slide("Revenue trend", chart=chart),
            dm.Slide("Next steps", ("Confirm budget for next year", "Review segment priorities")),
        ),
        author=f.team[1].name,
    )


def budget_workbook(f: WorldFacts, q4_actuals: dict[str, float] | None = None) -> dm.Workbook:
    """Budget vs actual for 2025 with the Q4 actuals blank until a tier-4 task fills them."""
    q4_actuals = q4_actuals or {}
    periods = [p for p in PERIODS if p.endswith("2025")]
    rows: list[tuple] = [("Segment", "Period", "Budget ($m)", "Actual ($m)")]
    for seg in f.segments:
        for p in periods:
            budget = round(f.revenue[seg][p] * 1.04, 1)
            actual = q4_actuals.get(seg) if p == "Q4 2025" else f.revenue[seg][p]
            rows.append((seg, p, budget, actual))
    return dm.Workbook((dm.Sheet("Actuals", tuple(rows)),
                        dm.Sheet("Instructions", (("Actuals come from the final quarterly "
                                                   "reports; leave budget untouched.",),))),
                       author=f.team[2].name)


def budget_cell(f: WorldFacts, segment: str) -> str:
    """The Actuals cell that holds `segment`'s Q4 2025 actual."""
    row = 2 + f.segments.index(segment) * 4 + 3
    return f"D{row}"


def segment_summary(f: WorldFacts, ebitda: dict[str, float] | None = None) -> dm.Document:
    """A memo whose table's EBITDA column is blank until a tier-4 task fills it."""
    period = f.draft_period
    ebitda = ebitda or {}
    rows = tuple((s, f.revenue[s][period], ebitda.get(s, "")) for s in f.segments)
    return dm.Document(
        title=f"Segment summary {period}",
        blocks=(
            dm.Paragraph(f"To: {f.client[0].name}. From: {f.team[1].name}."),
            dm.Paragraph(f"The table below summarises {f.company}'s segments for {period}. "
                         "EBITDA figures to be completed from the final quarterly report."),
            dm.Table(("Segment", "Revenue ($m)", "EBITDA ($m)"), rows),
        ),
        author=f.team[1].name,
        date=quarter_end(period) + dt.timedelta(days=40),
    )


def _csv_table(f: WorldFacts, year: int) -> dm.Table:
    periods = [p for p in PERIODS if p.endswith(str(year))]
    return dm.Table(("segment", *periods), tuple((s, *(f.revenue[s][p] for p in periods))
                                                 for s in f.segments))


def compose_world(f: WorldFacts, n_files: int = 60, distractors: bool = True
                  ) -> dict[str, DocModel]:
    """Every file of the world, keyed by workspace-relative path.

    `distractors=False` leaves out the superseded draft report, its correction thread and the
    research notes on the look-alike company: an easier world, for a curriculum.
    """
    from kwrl.worlds import domains, noise, threads

    paths = Paths(f)
    files: dict[str, DocModel] = {paths.financials: financials_workbook(f)}
    for period in PERIODS:
        files[paths.report(period)] = quarterly_report(f, period)
    if distractors:
        files[paths.draft_report] = quarterly_report(f, f.draft_period, draft=True)
    for period in paths.board_periods:
        placeholder = TBD if period == paths.update_deck_period else None
        files[paths.board_deck(period)] = board_deck(f, period, placeholder)
    for year in (2024, 2025):
        files[paths.csv(year)] = _csv_table(f, year)
    files[paths.budget] = budget_workbook(f)
    files[paths.segment_summary] = segment_summary(f)
    files[paths.mailbox] = threads.mailbox(f, distractors)
    files[paths.chat] = threads.chat(f)
    files[paths.calendar] = threads.calendar(f)
    files.update(domains.domain_files(f, paths))
    rng = random.Random(f.seed ^ 0x5EED)
    files.update(noise.noise_files(f, rng, max(0, n_files - len(files)), distractors))
    return files


__all__ = ["Paths", "compose_world", "Domain", "money", "slug", "TBD"]
