"""The hidden fact table of a world: every document is rendered from it.

A world is one simulated company seen from a consulting engagement, a bank's deal team or a law
firm's matter. Its facts are drawn from a seeded `random.Random`, so the same (split, seed, index)
gives the same world, and documents agree with each other because they are views of one table.
Contradictions are deliberate and recorded here too: a superseded draft of one quarterly report
(`draft_revenue`) and, in law worlds, an amendment that changes a contract's notice period.

Money is in USD millions with one decimal: short numbers to copy, exact to compare.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from dataclasses import asdict, dataclass, field
from functools import cache

from kwrl.types import Domain

PERIODS: tuple[str, ...] = tuple(f"Q{q} {y}" for y in (2024, 2025) for q in (1, 2, 3, 4))
QUARTER_END = {1: (3, 31), 2: (6, 30), 3: (9, 30), 4: (12, 31)}

_STEMS = (
    "Norvale", "Brightwater", "Castellan", "Delmore", "Everlane", "Fairhaven", "Granite Peak",
    "Halcyon", "Ironbridge", "Juniper", "Kestrel", "Larkspur", "Meridian", "Northgate", "Oakridge",
    "Pinecrest", "Quillon", "Redfern", "Silverline", "Thornbury", "Umberly", "Valemont", "Westmark",
    "Yarrow", "Zephyr", "Ashcombe", "Bellhaven", "Corvina", "Driftwood", "Elmstead",
    "Foxglove", "Glenrock", "Harrowgate", "Islay", "Jasperwood", "Kingsmere", "Lindenhall",
    "Marchbank", "Nettlefield", "Orchard Bay", "Penhallow", "Quarrystone", "Ravensworth",
    "Saltmarsh", "Tidewater", "Underhill", "Vantorre", "Whitcombe", "Wrenfield", "Amberlea",
    "Blackthorn", "Coldharbour", "Dunmore", "Eastwick", "Farrowdale", "Goldcrest", "Hawksmoor",
    "Ivybridge", "Kilbride", "Lochmere",
)
_SUFFIXES = ("Systems", "Holdings", "Industries", "Group", "Partners", "Technologies", "Logistics")
_LOOKALIKE = {"Systems": "Systemics", "Holdings": "Holding", "Industries": "Industrial",
              "Group": "Groupe", "Partners": "Partnership", "Technologies": "Technology",
              "Logistics": "Logistix"}
_FIRST = ("Alice", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas",
          "Kira", "Liam", "Maya", "Nikhil", "Olivia", "Pavel", "Rosa", "Samir", "Tara", "Victor")
_LAST = ("Alvarez", "Brennan", "Chen", "Dubois", "Eriksen", "Fischer", "Garcia", "Hoffman", "Ito",
         "Jensen", "Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Patel", "Quinn", "Rossi",
         "Schmidt", "Tanaka")
_SEGMENTS = {
    Domain.CONSULTING: ("Retail", "Wholesale", "Online", "Services", "Private Label"),
    Domain.BANKING: ("Industrial", "Aerospace", "Energy", "Software", "Aftermarket"),
    Domain.LAW: ("Licensing", "Hardware", "Support", "Cloud", "Consulting"),
}
_OPTIONS = ("Regional consolidation", "Direct-to-consumer expansion", "Divest the wholesale arm",
            "Nearshore manufacturing", "Pricing reset", "Platform partnership")
_GOVERNING_LAW = ("England and Wales", "New York", "Delaware", "Singapore", "Ireland")
_CONTRACT_KINDS = ("Master Services Agreement", "Supply Agreement", "License Agreement",
                   "Distribution Agreement")


@dataclass(frozen=True)
class Person:
    name: str
    role: str
    email: str
    internal: bool
    """True for the world's own team (consultants, bankers, lawyers), False for client side."""


@dataclass(frozen=True)
class Contract:
    """A law world's agreement; clause numbers are where each term sits in the DOCX."""

    key: str
    """Short stable id, e.g. `k2`, used in file names."""
    kind: str
    counterparty: str
    effective: dt.date
    term_months: int
    notice_days: int
    """Notice for termination for convenience, before any amendment."""
    liability_cap: float
    """USD millions."""
    annual_fees: float
    payment_days: int
    governing_law: str
    amended_notice_days: int | None = None
    """Set when an amendment (a separate PDF) changes the notice period."""
    amendment_date: dt.date | None = None


@dataclass(frozen=True)
class Peer:
    name: str
    enterprise_value: float
    ebitda: float

    @property
    def multiple(self) -> float:
        return round(self.enterprise_value / self.ebitda, 1)


@dataclass(frozen=True)
class WorldFacts:
    world_id: str
    domain: Domain
    seed: int
    company: str
    lookalike: str
    """A near-duplicate name of the company that appears in unrelated documents."""
    firm: str
    """The consultancy, bank or law firm whose team works on this world."""
    people: tuple[Person, ...]
    segments: tuple[str, ...]
    revenue: dict[str, dict[str, float]]
    """segment -> period -> USD millions."""
    ebitda: dict[str, dict[str, float]]
    draft_period: str
    """The quarter whose report also exists as a superseded draft."""
    draft_revenue: dict[str, float]
    """segment -> the draft's (wrong) revenue for `draft_period`."""
    options: tuple[str, ...] = ()
    chosen_option: str = ""
    decision_date: dt.date | None = None
    cost_base: float = 0.0
    savings_target_pct: float = 0.0
    acquirer: str = ""
    offer_price: float = 0.0
    """USD per share."""
    unaffected_price: float = 0.0
    shares_outstanding: float = 0.0
    """Millions of shares."""
    net_debt: float = 0.0
    peers: tuple[Peer, ...] = ()
    contracts: tuple[Contract, ...] = ()
    events: tuple[tuple[str, dt.datetime, str], ...] = field(default_factory=tuple)
    """(summary, start, location) of calendar events that tasks ask about."""

    def to_json(self) -> dict:
        return asdict(self)

    def total(self, metric: str, period: str) -> float:
        table = self.revenue if metric == "revenue" else self.ebitda
        return round(sum(table[s][period] for s in self.segments), 1)

    @property
    def team(self) -> tuple[Person, ...]:
        return tuple(p for p in self.people if p.internal)

    @property
    def client(self) -> tuple[Person, ...]:
        return tuple(p for p in self.people if not p.internal)


def world_seed(split: str, seed: int, index: int) -> int:
    """A per-world seed that differs between splits, so train and test never draw the same world."""
    digest = hashlib.sha256(f"{split}:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


_ONSETS = ("Al", "Ash", "Br", "C", "D", "El", "F", "G", "Gr", "H", "K", "L", "M", "N", "Or",
           "P", "R", "S", "St", "T", "Th", "Tr", "V", "W")
_NUCLEI = ("a", "ae", "e", "ei", "i", "o", "ou", "u", "y")
_CODAS = ("brook", "dale", "dmore", "ford", "gate", "lgrave", "lins", "mere", "mont", "nby",
          "ndale", "rin", "rwick", "ssel", "ston", "thorn", "vale", "wood", "xley")


@cache
def name_stems(split: str) -> tuple[str, ...]:
    """Company name stems a split may use.

    The test split draws from a third of the curated stems that no other split uses, so no
    company name, and no prompt naming it, is shared between train and test. Every other split
    draws from the other two thirds plus ~3.9k syllable-built stems ("Taford", "Elinmere"): a
    policy that sees only 40 names memorises them and invents them on held-out tasks; with
    thousands it has to copy the name it was given, which is what transfers to unseen companies.
    """
    if split == "test":
        return _STEMS[0::3]
    built = {o + n + c for o in _ONSETS for n in _NUCLEI for c in _CODAS}
    return _STEMS[1::3] + _STEMS[2::3] + tuple(sorted(built - set(_STEMS)))


def _company(rng: random.Random, taken: set[str], stems: tuple[str, ...]) -> tuple[str, str]:
    while True:
        stem, suffix = rng.choice(stems), rng.choice(_SUFFIXES)
        if stem not in taken:
            taken.add(stem)
            return f"{stem} {suffix}", f"{stem} {_LOOKALIKE[suffix]}"


def _people(rng: random.Random, domain: Domain, firm_domain: str, client_domain: str) -> tuple:
    roles = {
        Domain.CONSULTING: ("Engagement Partner", "Engagement Manager", "Associate"),
        Domain.BANKING: ("Managing Director", "Vice President", "Analyst"),
        Domain.LAW: ("Partner", "Senior Associate", "Paralegal"),
    }[domain]
    client_roles = ("Chief Financial Officer", "Head of Strategy", "General Counsel")
    names = rng.sample([f"{f} {last}" for f in _FIRST for last in _LAST], 6)
    people = []
    for i, name in enumerate(names):
        internal = i < 3
        role = roles[i] if internal else client_roles[i - 3]
        first, last = name.lower().split()
        host = firm_domain if internal else client_domain
        people.append(Person(name, role, f"{first}.{last}@{host}", internal))
    return tuple(people)


def _financials(rng: random.Random, segments: tuple[str, ...]) -> tuple[dict, dict]:
    revenue: dict[str, dict[str, float]] = {}
    ebitda: dict[str, dict[str, float]] = {}
    for seg in segments:
        level = rng.uniform(20, 160)
        margin = rng.uniform(0.08, 0.3)
        revenue[seg], ebitda[seg] = {}, {}
        for period in PERIODS:
            level *= rng.uniform(0.94, 1.09)
            rev = round(level, 1)
            revenue[seg][period] = rev
            ebitda[seg][period] = round(rev * (margin + rng.uniform(-0.03, 0.03)), 1)
    return revenue, ebitda


def _draft(rng: random.Random, revenue: dict, period: str) -> dict[str, float]:
    draft = {}
    for seg, by_period in revenue.items():
        factor = rng.choice((-1, 1)) * rng.uniform(0.03, 0.12)
        draft[seg] = round(by_period[period] * (1 + factor), 1)
    return draft


def _contracts(rng: random.Random, counterparties: list[str]) -> tuple[Contract, ...]:
    contracts = []
    for i, party in enumerate(counterparties):
        fees = round(rng.uniform(1.5, 30), 1)
        notice = rng.choice((30, 45, 60, 90, 120))
        amended = i == 0
        contracts.append(Contract(
            key=f"k{i + 1}",
            kind=_CONTRACT_KINDS[i % len(_CONTRACT_KINDS)],
            counterparty=party,
            effective=dt.date(2023, rng.randint(1, 12), rng.randint(1, 28)),
            term_months=rng.choice((24, 36, 48, 60)),
            notice_days=notice,
            liability_cap=round(fees * rng.choice((1.0, 1.5, 2.0)), 1),
            annual_fees=fees,
            payment_days=rng.choice((30, 45, 60)),
            governing_law=rng.choice(_GOVERNING_LAW),
            amended_notice_days=rng.choice([d for d in (30, 60, 90, 180) if d != notice])
            if amended else None,
            amendment_date=(dt.date(2025, rng.randint(1, 9), rng.randint(1, 28))
                            if amended else None),
        ))
    return tuple(contracts)


def _events(rng: random.Random, domain: Domain) -> tuple:
    titles = {
        Domain.CONSULTING: ("Steering committee", "Client workshop", "Final readout"),
        Domain.BANKING: ("Management presentation", "Board meeting", "Signing call"),
        Domain.LAW: ("Court hearing", "Mediation session", "Contract review call"),
    }[domain]
    places = ("Room 4.01", "Client HQ", "Video call", "Room 2.12")
    return tuple(
        (t, dt.datetime(2026, rng.randint(1, 6), rng.randint(1, 28), rng.choice((9, 10, 14, 15))),
         rng.choice(places))
        for t in titles
    )


def make_world(split: str, seed: int, index: int, domain: Domain) -> WorldFacts:
    """Draw one world's facts; deterministic in (split, seed, index, domain)."""
    wseed = world_seed(split, seed, index)
    rng = random.Random(wseed)
    taken: set[str] = set()
    stems = name_stems(split)
    company, lookalike = _company(rng, taken, stems)
    firm = _company(rng, taken, stems)[0].split()[0] + {
        Domain.CONSULTING: " Advisory", Domain.BANKING: " Capital", Domain.LAW: " LLP"}[domain]
    people = _people(rng, domain, f"{firm.split()[0].lower()}.example",
                     f"{company.split()[0].lower()}.example")
    segments = tuple(rng.sample(_SEGMENTS[domain], rng.choice((3, 4))))
    revenue, ebitda = _financials(rng, segments)
    draft_period = rng.choice(PERIODS[4:])
    extra: dict = {}
    if domain == Domain.CONSULTING:
        options = tuple(rng.sample(_OPTIONS, 3))
        extra = dict(options=options, chosen_option=rng.choice(options),
                     decision_date=dt.date(2025, rng.randint(9, 11), rng.randint(1, 28)),
                     cost_base=round(rng.uniform(200, 900), 1),
                     savings_target_pct=float(rng.choice((5, 7.5, 10, 12.5, 15))))
    elif domain == Domain.BANKING:
        unaffected = round(rng.uniform(12, 80), 2)
        extra = dict(acquirer=_company(rng, taken, stems)[0], unaffected_price=unaffected,
                     offer_price=round(unaffected * rng.uniform(1.2, 1.45), 2),
                     shares_outstanding=round(rng.uniform(40, 300), 1),
                     net_debt=round(rng.uniform(50, 600), 1),
                     peers=tuple(Peer(_company(rng, taken, stems)[0],
                                      round(rng.uniform(800, 9000), 1),
                                      round(rng.uniform(60, 700), 1)) for _ in range(5)))
    else:
        parties = [_company(rng, taken, stems)[0] for _ in range(3)]
        extra = dict(contracts=_contracts(rng, parties))
    world_id = f"{split}-{domain.value[:4]}-{index:03d}-{wseed % 0xFFFFFF:06x}"
    return WorldFacts(
        world_id=world_id, domain=domain, seed=wseed, company=company, lookalike=lookalike,
        firm=firm, people=people, segments=segments, revenue=revenue, ebitda=ebitda,
        draft_period=draft_period, draft_revenue=_draft(rng, revenue, draft_period),
        events=_events(rng, domain), **extra,
    )


def quarter_end(period: str) -> dt.date:
    q, year = int(period[1]), int(period[3:])
    month, day = QUARTER_END[q]
    return dt.date(year, month, day)
