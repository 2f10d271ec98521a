"""Templates one domain owns: engagement decisions, deal valuation, contract terms."""

from __future__ import annotations

import random

from kwrl.types import Domain
from kwrl.worlds.compose import slug
from kwrl.worlds.domains import CLAUSES
from kwrl.worlds.templates import (
    Draft,
    World,
    call,
    date_forms,
    fmt,
    millions,
    names,
    number,
    template,
)

CONSULTING, BANKING, LAW = (Domain.CONSULTING,), (Domain.BANKING,), (Domain.LAW,)


@template("steering_decision", tier=2, domains=CONSULTING)
def steering_decision(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    others = [o for o in f.options if o != f.chosen_option]
    wrong = f.options[0] if f.options[0] != f.chosen_option else others[0]
    return Draft(
        f"Which option did {f.company}'s steering committee decide to pursue?",
        (names("c1", f"Names the option chosen: {f.chosen_option}", [f.chosen_option], others),),
        f"The steering committee chose '{f.chosen_option}' on {f.decision_date:%d %B %Y}.",
        f"The committee chose '{wrong}'.",
        plan=(call("chat_search", query="steering committee"),),
    )


@template("savings_target", tier=3, domains=CONSULTING)
def savings_target(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    value = round(f.cost_base * f.savings_target_pct / 100, 1)
    wrong = round(f.cost_base * 0.42 * f.savings_target_pct / 100, 1)
    return Draft(
        f"Using {w.paths.cost_review}, what is {f.company}'s savings target in USD millions?",
        (millions("c1", f"States the target: {fmt(value)}m", value, rel_tol=0.01,
                  reject=(wrong,)),),
        f"The target is {f.savings_target_pct:g}% of ${fmt(f.cost_base)}m, i.e. ${fmt(value)}m.",
        f"The target is ${fmt(wrong)}m.",
        plan=(call("docs_search", path=w.paths.cost_review, query="cost base"),
              call("docs_search", path=w.paths.cost_review, query="savings target")),
    )


@template("peer_multiple", tier=1, domains=BANKING)
def peer_multiple(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    i = rng.randrange(len(f.peers))
    peer, other = f.peers[i], f.peers[(i + 1) % len(f.peers)]
    if abs(peer.multiple - other.multiple) < 0.15:
        return None
    return Draft(
        f"In {w.paths.comps}, at what EV/EBITDA multiple does {peer.name} trade?",
        (number("c1", f"States {peer.multiple:.1f}x", peer.multiple, unit="x", abs_tol=0.05,
                reject=(other.multiple,)),),
        f"{peer.name} trades at {peer.multiple:.1f}x EV/EBITDA.",
        f"{peer.name} trades at {other.multiple:.1f}x EV/EBITDA.",
        plan=(call("sheets_search", path=w.paths.comps, query=peer.name),),
    )


@template("offer_premium", tier=3, domains=BANKING)
def offer_premium(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    premium = round((f.offer_price / f.unaffected_price - 1) * 100, 1)
    return Draft(
        f"What premium does {f.acquirer}'s offer represent over {f.company}'s unaffected share "
        f"price? Give it in percent to one decimal.",
        (number("c1", f"States the premium {premium:.1f}%", premium, unit="%", abs_tol=0.15),),
        f"The offer of ${f.offer_price:.2f} per share is a {premium:.1f}% premium to the "
        f"unaffected price of ${f.unaffected_price:.2f}.",
        f"The premium is ${f.offer_price - f.unaffected_price:.2f} per share.",
        plan=(call("filesystem_find", pattern="*Offer_Letter*"),
              call("pdf_read_pages", path=w.paths.offer_letter)),
    )


@template("implied_enterprise_value", tier=3, domains=BANKING)
def implied_enterprise_value(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    equity = round(f.offer_price * f.shares_outstanding, 1)
    ev = round(equity + f.net_debt, 1)
    return Draft(
        f"What enterprise value does {f.acquirer}'s offer imply for {f.company}? Use the offer "
        f"price, the shares outstanding and net debt; answer in USD millions.",
        (millions("c1", f"States the implied EV {fmt(ev)}m", ev, rel_tol=0.01),
         millions("c2", f"States the implied equity value {fmt(equity)}m", equity, rel_tol=0.01,
                weight=0.5)),
        f"Equity value ${fmt(equity)}m (${f.offer_price:.2f} x {fmt(f.shares_outstanding)}m "
        f"shares) plus net debt ${fmt(f.net_debt)}m gives an enterprise value of ${fmt(ev)}m.",
        f"The implied enterprise value is ${fmt(equity)}m.",
        plan=(call("pdf_search", path=w.paths.offer_letter, query="per share"),
              call("docs_read", path=w.paths.capitalization)),
    )


@template("contract_notice", tier=1, domains=LAW)
def contract_notice(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    c = rng.choice([c for c in f.contracts if c.amended_notice_days is None])
    other = next(o for o in f.contracts if o.key != c.key)
    if other.notice_days == c.notice_days:
        return None
    return Draft(
        f"Under clause {CLAUSES['notice']} of {w.paths.contract(c.key)}, how many days' notice "
        f"is required to terminate for convenience?",
        (number("c1", f"States {c.notice_days} days", c.notice_days,
                reject=(other.notice_days,)),),
        f"{c.notice_days} days' written notice.",
        f"{other.notice_days} days' written notice.",
        plan=(call("docs_search", path=w.paths.contract(c.key), query=CLAUSES["notice"]),),
    )


@template("liability_cap", tier=2, domains=LAW)
def liability_cap(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    c = rng.choice(f.contracts)
    other = next(o for o in f.contracts if o.key != c.key)
    if abs(other.liability_cap - c.liability_cap) < 0.1:
        return None
    return Draft(
        f"What is the liability cap in {f.company}'s {c.kind.lower()} with {c.counterparty}?",
        (millions("c1", f"States the cap {fmt(c.liability_cap)}m", c.liability_cap,
                  reject=(other.liability_cap,)),),
        f"Aggregate liability is capped at ${fmt(c.liability_cap)}m (clause "
        f"{CLAUSES['liability']}).",
        f"Aggregate liability is capped at ${fmt(other.liability_cap)}m.",
        plan=(call("filesystem_find", pattern=f"*{slug(c.counterparty)}*"),
              call("docs_search", path=w.paths.contract(c.key), query="liability")),
    )


@template("contract_expiry", tier=3, domains=LAW)
def contract_expiry(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    c = rng.choice(f.contracts)
    months = c.effective.month - 1 + c.term_months
    expiry = c.effective.replace(year=c.effective.year + months // 12, month=months % 12 + 1)
    return Draft(
        f"On what date does the initial term of {f.company}'s {c.kind.lower()} with "
        f"{c.counterparty} end?",
        (names("c1", f"Gives {expiry:%d %B %Y}", date_forms(expiry)),),
        f"The agreement started on {c.effective:%d %B %Y} for {c.term_months} months, so the "
        f"initial term ends on {expiry:%d %B %Y}.",
        f"The agreement started on {c.effective:%d %B %Y}.",
        plan=(call("filesystem_find", pattern=f"*{slug(c.counterparty)}*"),
              call("docs_search", path=w.paths.contract(c.key), query="commences")),
    )


@template("amended_notice", tier=4, domains=LAW)
def amended_notice(w: World, rng: random.Random) -> Draft | None:
    f = w.facts
    c = next(c for c in f.contracts if c.amended_notice_days is not None)
    return Draft(
        f"We want to terminate the {c.kind.lower()} with {c.counterparty} for convenience. How "
        f"many days' notice do we have to give today? Check whether the contract was amended.",
        (number("c1", f"States {c.amended_notice_days} days", c.amended_notice_days),
         names("c2", "Cites the amendment", ["amendment", "amended"])),
        f"{c.amended_notice_days} days: Amendment No. 1 of {c.amendment_date:%d %B %Y} replaced "
        f"clause {CLAUSES['notice']} (originally {c.notice_days} days).",
        f"{c.notice_days} days under clause {CLAUSES['notice']}.",
        plan=(call("filesystem_find", pattern=f"*{slug(c.counterparty)}*"),
              call("docs_search", path=w.paths.contract(c.key), query=CLAUSES["notice"]),
              call("pdf_read_pages", path=w.paths.amendment(c.key))),
    )
