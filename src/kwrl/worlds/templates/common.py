"""Templates every domain shares: they read the company's financial core."""

from __future__ import annotations

import random

from kwrl.worlds import compose
from kwrl.worlds.facts import PERIODS, quarter_end
from kwrl.worlds.templates import (
    Draft,
    World,
    call,
    cell,
    content,
    created,
    date_forms,
    fmt,
    millions,
    names,
    number,
    slide_shape,
    table_cell,
    template,
    unchanged,
)


def distinct(a: float, b: float, rel: float = 0.01) -> bool:
    """True when a wrong value would fail a criterion expecting the right one."""
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-9)


def _other_period(rng: random.Random, period: str) -> str:
    """An adjacent quarter: the figure a careless reader copies by mistake."""
    i = PERIODS.index(period)
    earlier = i == len(PERIODS) - 1 or (i > 0 and rng.random() < 0.5)
    return PERIODS[i - 1] if earlier else PERIODS[i + 1]


@template("report_segment_revenue", tier=1)
def report_segment_revenue(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg, period = rng.choice(f.segments), rng.choice(PERIODS)
    wrong = f.revenue[seg][_other_period(rng, period)]
    value = f.revenue[seg][period]
    if not distinct(value, wrong):
        return None
    return Draft(
        f"Please check {w.paths.report(period)}: what revenue did the {seg} segment of "
        f"{f.company} report for {period}? Give the figure in USD millions.",
        (millions("c1", f"States {seg} revenue for {period}: {fmt(value)}m", value,
                  reject=(wrong,)),),
        f"{seg} revenue in {period} was ${fmt(value)}m.",
        f"{seg} revenue in {period} was ${fmt(wrong)}m.",
        plan=(call("pdf_search", path=w.paths.report(period), query=seg),),
    )


@template("workbook_total_ebitda", tier=1)
def workbook_total_ebitda(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    period = rng.choice(PERIODS)
    value, wrong = f.total("ebitda", period), f.total("revenue", period)
    return Draft(
        f"In {w.paths.financials}, what is {f.company}'s total EBITDA for {period} "
        f"(all segments)? Answer in USD millions.",
        (millions("c1", f"States total EBITDA for {period}: {fmt(value)}m", value,
                  reject=(wrong,)),),
        f"Total EBITDA for {period} was ${fmt(value)}m.",
        f"Total EBITDA for {period} was ${fmt(wrong)}m.",
        plan=(call("sheets_search", path=w.paths.financials, query="Total", sheet="EBITDA"),),
    )


@template("find_segment_ebitda", tier=2)
def find_segment_ebitda(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg, period = rng.choice(f.segments), rng.choice(PERIODS)
    value = f.ebitda[seg][period]
    wrong = f.ebitda[seg][_other_period(rng, period)]
    if not distinct(value, wrong):
        return None
    return Draft(
        f"What EBITDA did {f.company}'s {seg} segment generate in {period}? I need the figure "
        f"in USD millions for a client call.",
        (millions("c1", f"States {seg} EBITDA for {period}: {fmt(value)}m", value,
                  reject=(wrong,)),),
        f"{seg} EBITDA in {period}: ${fmt(value)}m.",
        f"{seg} EBITDA in {period}: ${fmt(wrong)}m.",
        plan=(call("filesystem_find", pattern=f"*{compose.slug(period)}*"),
              call("pdf_search", path=w.paths.report(period), query=seg)),
    )


@template("find_final_revenue", tier=2)
def find_final_revenue(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg, period = rng.choice(f.segments), f.draft_period
    value, wrong = f.revenue[seg][period], f.draft_revenue[seg]
    return Draft(
        f"What was the final reported revenue of the {seg} segment of {f.company} for "
        f"{period}? Make sure you use final figures, in USD millions.",
        (millions("c1", f"States the final {seg} revenue for {period}: {fmt(value)}m "
                      f"(not the draft's {fmt(wrong)}m)", value, reject=(wrong,)),),
        f"Final {seg} revenue for {period} was ${fmt(value)}m.",
        f"{seg} revenue for {period} was ${fmt(wrong)}m.",
        plan=(call("filesystem_find", pattern=f"*{compose.slug(period)}*"),
              call("pdf_search", path=w.paths.report(period), query=seg)),
    )


@template("calendar_date", tier=2)
def calendar_date(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    i = rng.randrange(len(f.events))
    title, start, _ = f.events[i]
    other = f.events[(i + 1) % len(f.events)][1]
    if other.date() == start.date():
        return None
    return Draft(
        f"On which date is the {title.lower()} for {f.company} scheduled?",
        (names("c1", f"Gives the date {start:%d %B %Y}", date_forms(start.date())),),
        f"The {title.lower()} is scheduled for {start:%d %B %Y} at {start:%H:%M}.",
        f"The {title.lower()} is scheduled for {other:%d %B %Y}.",
        plan=(call("calendar_search", query=title),),
    )


@template("segment_growth", tier=3)
def segment_growth(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg = rng.choice(f.segments)
    i = rng.randrange(1, len(PERIODS))
    p0, p1 = PERIODS[i - 1], PERIODS[i]
    a, b = f.revenue[seg][p0], f.revenue[seg][p1]
    growth = round((b / a - 1) * 100, 1)
    wrong = round((a / b - 1) * 100, 1)
    if abs(growth - wrong) < 0.3:
        return None
    return Draft(
        f"By how much did revenue of {f.company}'s {seg} segment change from {p0} to {p1}, in "
        f"percent? Use the quarterly reports and round to one decimal.",
        (number("c1", f"States the change: {growth:+.1f}%", growth, unit="%", abs_tol=0.15,
                reject=(wrong,)),
         millions("c2", f"States {p1} revenue: {fmt(b)}m", b, weight=0.5),
         millions("c3", f"States {p0} revenue: {fmt(a)}m", a, weight=0.5)),
        f"{seg} revenue went from ${fmt(a)}m in {p0} to ${fmt(b)}m in {p1}, a change of "
        f"{growth:+.1f}%.",
        f"{seg} revenue changed by {wrong:+.1f}%.",
        plan=(call("pdf_search", path=w.paths.report(p0), query=seg),
              call("pdf_search", path=w.paths.report(p1), query=seg)),
    )


@template("fiscal_year_revenue", tier=3)
def fiscal_year_revenue(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg, year = rng.choice(f.segments), rng.choice((2024, 2025))
    quarters = [p for p in PERIODS if p.endswith(str(year))]
    value = round(sum(f.revenue[seg][p] for p in quarters), 1)
    wrong_year = [p for p in PERIODS if not p.endswith(str(year))]
    wrong = round(sum(f.revenue[seg][p] for p in wrong_year), 1)
    return Draft(
        f"What was the full-year {year} revenue of {f.company}'s {seg} segment (sum of the four "
        f"quarters), in USD millions?",
        (millions("c1", f"States FY{year} {seg} revenue: {fmt(value)}m", value,
                  reject=(wrong,)),),
        f"{seg} revenue for FY{year} was ${fmt(value)}m.",
        f"{seg} revenue for FY{year} was ${fmt(wrong)}m.",
        plan=(call("sheets_search", path=w.paths.financials, query=seg, sheet="Revenue"),),
    )


@template("segment_margin", tier=3)
def segment_margin(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    seg, period = rng.choice(f.segments), rng.choice(PERIODS)
    margin = round(f.ebitda[seg][period] / f.revenue[seg][period] * 100, 1)
    other = _other_period(rng, period)
    wrong = round(f.ebitda[seg][other] / f.revenue[seg][other] * 100, 1)
    if abs(margin - wrong) < 0.3:
        return None
    return Draft(
        f"What was the EBITDA margin of {f.company}'s {seg} segment in {period}? Give it in "
        f"percent to one decimal.",
        (number("c1", f"States the margin: {margin:.1f}%", margin, unit="%", abs_tol=0.15,
                reject=(wrong,)),),
        f"{seg} EBITDA margin in {period}: {margin:.1f}% (EBITDA ${fmt(f.ebitda[seg][period])}m "
        f"on revenue ${fmt(f.revenue[seg][period])}m).",
        f"{seg} EBITDA margin in {period}: {wrong:.1f}%.",
        plan=(call("pdf_search", path=w.paths.report(period), query=seg),),
    )


@template("budget_fill_actual", tier=4)
def budget_fill_actual(w: World, rng: random.Random) -> Draft | None:
    f, path = w.facts, w.paths.budget
    seg = rng.choice(f.segments)
    value, wrong = f.revenue[seg]["Q4 2025"], f.revenue[seg]["Q3 2025"]
    if not distinct(value, wrong):
        return None
    ref = compose.budget_cell(f, seg)
    return Draft(
        f"In {path}, sheet Actuals, fill in {f.company}'s {seg} actual revenue for Q4 2025 (USD "
        f"millions) from the final Q4 2025 quarterly report. Leave everything else as it is.",
        (cell("c1", f"{path} Actuals!{ref} holds {fmt(value)}", path, "Actuals", ref, value),
         unchanged("c2", [path])),
        f"Filled Actuals!{ref} with {fmt(value)}.",
        f"Filled Actuals!{ref} with {fmt(wrong)}.",
        files={path: compose.budget_workbook(f, {seg: value})},
        distractor_files={path: compose.budget_workbook(f, {seg: wrong})},
        plan=(call("pdf_search", path=w.paths.report("Q4 2025"), query=seg),
              call("sheets_search", path=path, query=f"{seg} Q4 2025", sheet="Actuals"),
              call("sheets_edit_cells", path=path, sheet="Actuals", updates={ref: value})),
    )


@template("summary_table_fill", tier=4)
def summary_table_fill(w: World, rng: random.Random) -> Draft | None:
    f, path, period = w.facts, w.paths.segment_summary, w.facts.draft_period
    right = {s: f.ebitda[s][period] for s in f.segments}
    other = _other_period(rng, period)
    wrong = {s: f.ebitda[s][other] for s in f.segments}
    rubric = tuple(
        table_cell(f"c{i + 1}", f"EBITDA of {s} in the table: {fmt(right[s])}", path, i + 1, 2,
                   right[s])
        for i, s in enumerate(f.segments)
    ) + (unchanged(f"c{len(f.segments) + 1}", [path]),)
    return Draft(
        f"Complete the EBITDA column of the table in {path} with each {f.company} segment's "
        f"{period} EBITDA (USD millions) from the final quarterly report.",
        rubric,
        "Completed the EBITDA column: " + "; ".join(f"{s} {fmt(v)}" for s, v in right.items()),
        "Completed the EBITDA column.",
        files={path: compose.segment_summary(f, right)},
        distractor_files={path: compose.segment_summary(f, wrong)},
        plan=(call("pdf_tables", path=w.paths.report(period)),
              call("docs_read", path=path),
              *(call("docs_fill_table_cell", path=path, table=0, row=i + 1, col=2,
                     text=str(right[s])) for i, s in enumerate(f.segments))),
    )


@template("board_slide_update", tier=4)
def board_slide_update(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    period = w.paths.update_deck_period
    path = w.paths.board_deck(period)
    # The plausible mistake: copying the EBITDA line just below (always far from revenue).
    value, wrong = f.total("revenue", period), f.total("ebitda", period)
    text = compose.money(value)
    return Draft(
        f"The 'Key figures' slide of {path} still shows a placeholder for total revenue. Update "
        f"that line with {f.company}'s total revenue for {period}.",
        (slide_shape("c1", f"Key figures slide states total revenue {fmt(value)}m", path, 2,
                     "Body", content([[f"Total revenue {period}"]], [value])),
         slide_shape("c2", "The placeholder is gone", path, 2, "Body",
                     {"text": [], "numbers": [], "none_of": [compose.TBD]}),
         unchanged("c3", [path])),
        f"Updated the Key figures slide: total revenue {period} {text}.",
        "Updated the Key figures slide.",
        files={path: compose.board_deck(f, period, text)},
        distractor_files={path: compose.board_deck(f, period, compose.money(wrong))},
        plan=(call("pdf_search", path=w.paths.report(period), query="Total"),
              call("slides_read_slide", path=path, slide=2),
              call("slides_edit_shape", path=path, slide=2, shape="Body", text="\n".join((
                  f"Total revenue {period}: {text}",
                  f"Total EBITDA {period}: {compose.money(f.total('ebitda', period))}",
                  f"Segments reported: {len(f.segments)}")))),
    )


@template("memo_top_segment", tier=4)
def memo_top_segment(w: World, rng: random.Random) -> Draft | None:
    from kwrl.worlds import docmodel as dm

    f = w.facts
    period = rng.choice(PERIODS)
    ranked = sorted(f.segments, key=lambda s: -f.revenue[s][period])
    top, second = ranked[0], ranked[1]
    path = f"Deliverables/Top_Segment_{compose.slug(period)}.md"

    def lines(seg: str) -> list[str]:
        return [f"To: {f.client[0].name}",
                f"In {period}, {f.company}'s largest segment by revenue was {seg}, with revenue "
                f"of ${fmt(f.revenue[seg][period])}m."]

    def memo(seg: str) -> dm.Document:
        return dm.Document(f"Top segment {period}", tuple(dm.Paragraph(t) for t in lines(seg)),
                           author=f.team[1].name, date=quarter_end(period))

    return Draft(
        f"Write a short memo to {f.client[0].name} as a markdown file at {path} stating which "
        f"segment of {f.company} had the highest revenue in {period} and what that revenue was "
        f"(USD millions).",
        (created("c1", f"{path} names {top}", path, "md",
                 content([[top]]) | {"none_of": [second]}),
         created("c2", f"{path} states {fmt(f.revenue[top][period])}m", path, "md",
                 content(None, [f.revenue[top][period]])),
         unchanged("c3", [path])),
        f"Wrote {path}: {top} was the largest segment in {period}.",
        f"Wrote {path}: {second} was the largest segment in {period}.",
        files={path: memo(top)},
        distractor_files={path: memo(second)},
        plan=(call("pdf_tables", path=w.paths.report(period)),
              call("docs_create", path=path, title=f"Top segment {period}",
                   paragraphs=lines(top))),
    )


@template("reconcile_draft", tier=4, needs_distractors=True)
def reconcile_draft(w: World, rng: random.Random) -> Draft | None:
    f, period = w.facts, w.facts.draft_period
    seg = rng.choice(f.segments)
    final, draft = f.revenue[seg][period], f.draft_revenue[seg]
    gap = round(abs(final - draft), 1)
    return Draft(
        f"Two versions of {f.company}'s {period} quarterly report disagree on {seg} revenue. "
        f"Which figure is the correct one, and how large is the difference between the two "
        f"versions (USD millions)?",
        (millions("c1", f"States the correct (final) figure {fmt(final)}m", final),
         millions("c2", f"States the difference {fmt(gap)}m", gap, rel_tol=0.02, abs_tol=0.05),
         names("c3", "Says the final report supersedes the draft", ["final"])),
        f"The final report's ${fmt(final)}m is correct; the superseded draft v1 showed "
        f"${fmt(draft)}m, a difference of ${fmt(gap)}m.",
        f"The draft's ${fmt(draft)}m is correct.",
        plan=(call("filesystem_find", pattern=f"*Quarterly_Report_{compose.slug(period)}*"),
              call("pdf_search", path=w.paths.report(period), query=seg),
              call("pdf_search", path=w.paths.draft_report, query=seg)),
    )
