"""The documents only one domain has: engagement decks, deal materials, contracts.

Each function renders one kind of domain document from the facts; `domain_files` picks the set
for a world. Clause numbers in contracts are fixed (`CLAUSES`) so tasks can cite them.
"""

from __future__ import annotations

import datetime as dt

from kwrl.types import Domain
from kwrl.worlds import docmodel as dm
from kwrl.worlds.facts import Contract, WorldFacts

CLAUSES = {"term": "2.1", "fees": "3.1", "payment": "3.2", "liability": "7.1",
           "notice": "12.2", "law": "15.1"}


def steering_deck(f: WorldFacts) -> dm.Deck:
    recommended = f.options[0]
    rows = tuple((opt, ["High", "Medium", "Low"][i], ["12-18", "6-12", "18-24"][i])
                 for i, opt in enumerate(f.options))
    return dm.Deck(f"Steering committee {f.decision_date:%d %B %Y}", (
        dm.Slide(f"{f.company}: steering committee", (f"{f.firm}", f"{f.decision_date:%d %B %Y}")),
        dm.Slide("Options assessed", table=dm.Table(("Option", "Value at stake", "Months"), rows)),
        dm.Slide("Our recommendation", (f"Recommended: {recommended}",
                                        "Decision to be taken by the committee")),
    ), author=f.team[0].name)


def cost_review(f: WorldFacts) -> dm.Document:
    shares = (0.42, 0.27, 0.19)
    cats = ("Personnel", "Procurement", "Facilities")
    amounts = [round(f.cost_base * s, 1) for s in shares]
    amounts.append(round(f.cost_base - sum(amounts), 1))
    rows = tuple(zip((*cats, "Other"), amounts, strict=True))
    return dm.Document(f"{f.company}: cost review", (
        dm.Paragraph("Baseline", "heading1"),
        dm.Paragraph(f"The addressable cost base is ${f.cost_base:,.1f}m (FY2025)."),
        dm.Table(("Category", "Cost ($m)"), rows),
        dm.Paragraph("Target", "heading1"),
        dm.Paragraph(f"Management has set a savings target of {f.savings_target_pct:g}% of the "
                     "addressable cost base, to be delivered over two years."),
    ), author=f.team[1].name, date=dt.date(2025, 10, 14))


def comps_workbook(f: WorldFacts) -> dm.Workbook:
    rows: list[tuple] = [("Company", "EV ($m)", "EBITDA LTM ($m)", "EV/EBITDA (x)")]
    for i, p in enumerate(f.peers, start=2):
        rows.append((p.name, p.enterprise_value, p.ebitda,
                     dm.Formula(f"=ROUND(B{i}/C{i},1)", p.multiple)))
    return dm.Workbook((dm.Sheet("Comps", tuple(rows)),
                        dm.Sheet("Sources", (("Market data as of 30 September 2025",),))),
                       author=f.team[2].name)


def offer_letter(f: WorldFacts) -> dm.Document:
    return dm.Document(f"Indicative offer for {f.company}", (
        dm.Paragraph(f"To the Board of Directors of {f.company}"),
        dm.Paragraph(f"{f.acquirer} is pleased to submit this non-binding indicative offer to "
                     f"acquire all of the issued share capital of {f.company} at a price of "
                     f"${f.offer_price:.2f} in cash per share."),
        dm.Paragraph(f"The offer compares with an unaffected share price of "
                     f"${f.unaffected_price:.2f}."),
        dm.Paragraph("The offer is subject to due diligence, financing and board approval."),
    ), author=f.acquirer, date=dt.date(2025, 6, 5))


def capitalization(f: WorldFacts) -> dm.Document:
    return dm.Document(f"{f.company}: capitalisation table", (
        dm.Paragraph("As of 30 June 2025, from the company's filings."),
        dm.Table(("Item", "Value"), (
            ("Shares outstanding (m)", f.shares_outstanding),
            ("Net debt ($m)", f.net_debt),
            ("Unaffected share price ($)", f.unaffected_price),
        )),
    ), author=f.team[2].name, date=dt.date(2025, 7, 1))


def contract_doc(f: WorldFacts, c: Contract) -> dm.Document:
    n = CLAUSES
    clauses = [
        ("1. Parties", f"This {c.kind} is made between {f.company} and {c.counterparty}."),
        ("2. Term", f"{n['term']} This agreement commences on {c.effective:%d %B %Y} and "
                    f"continues for {c.term_months} months."),
        ("3. Fees", f"{n['fees']} {f.company} shall pay annual fees of ${c.annual_fees:,.1f}m. "
                    f"{n['payment']} Invoices are payable within {c.payment_days} days."),
        ("7. Liability", f"{n['liability']} Each party's aggregate liability is capped at "
                         f"${c.liability_cap:,.1f}m."),
        ("12. Termination", f"12.1 Either party may terminate for material breach. "
                            f"{n['notice']} Either party may terminate for convenience on "
                            f"{c.notice_days} days' written notice."),
        ("15. Governing law", f"{n['law']} This agreement is governed by the laws of "
                              f"{c.governing_law}."),
    ]
    blocks: list[dm.Block] = []
    for heading, text in clauses:
        blocks.append(dm.Paragraph(heading, "heading2"))
        blocks.append(dm.Paragraph(text, "numbered"))
    return dm.Document(f"{c.kind}: {f.company} and {c.counterparty}", tuple(blocks),
                       author=f.team[0].name, date=c.effective)


def amendment_doc(f: WorldFacts, c: Contract) -> dm.Document:
    return dm.Document(f"Amendment No. 1 to the {c.kind}", (
        dm.Paragraph(f"Between {f.company} and {c.counterparty}, dated "
                     f"{c.amendment_date:%d %B %Y}."),
        dm.Paragraph(f"Clause {CLAUSES['notice']} is deleted and replaced with: Either party may "
                     f"terminate for convenience on {c.amended_notice_days} days' written notice."),
        dm.Paragraph("All other terms of the agreement remain in full force and effect."),
    ), author=f.team[0].name, date=c.amendment_date)


def register_workbook(f: WorldFacts) -> dm.Workbook:
    rows: list[tuple] = [("Counterparty", "Agreement", "Effective", "Term (months)", "Law")]
    for c in f.contracts:
        rows.append((c.counterparty, c.kind, c.effective.isoformat(), c.term_months,
                     c.governing_law))
    return dm.Workbook((dm.Sheet("Register", tuple(rows)),), author=f.team[2].name)


def domain_files(f: WorldFacts, paths) -> dict[str, object]:
    if f.domain == Domain.CONSULTING:
        return {paths.steering_deck: steering_deck(f), paths.cost_review: cost_review(f)}
    if f.domain == Domain.BANKING:
        return {paths.comps: comps_workbook(f), paths.offer_letter: offer_letter(f),
                paths.capitalization: capitalization(f)}
    files: dict[str, object] = {paths.register: register_workbook(f)}
    for c in f.contracts:
        files[paths.contract(c.key)] = contract_doc(f, c)
        if c.amended_notice_days is not None:
            files[paths.amendment(c.key)] = amendment_doc(f, c)
    return files
