"""Task templates: each turns a world's facts into an instruction, a rubric and an oracle.

A template is a function `(world, rng) -> Draft | None` registered with its tier and the domains
it applies to. The rubric uses only programmatic criteria whose parameters are the contract in
`kwrl.graders.criteria`. Every draft also carries a plausible wrong answer (the distractor quarter,
the superseded draft, the recommended-but-rejected option) so that tests can show the rubric
rejects it.

Tiers: 1 lookup in a named file; 2 find the file, then look up; 3 multi-hop with arithmetic;
4 deliverables (edit a spreadsheet, fill a DOCX table, update a slide, write a memo, reconcile).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kwrl.types import Criterion, CriterionKind, Domain
from kwrl.worlds.compose import Paths
from kwrl.worlds.facts import WorldFacts
from kwrl.worlds.taskdir import PlannedCall


@dataclass(frozen=True)
class World:
    """What a template sees: the facts, where files live, and their document models."""

    facts: WorldFacts
    paths: Paths
    files: Mapping[str, object]
    distractors: bool = True
    """Whether the world holds the superseded draft and look-alike research notes."""


@dataclass(frozen=True)
class Draft:
    instruction: str
    rubric: tuple[Criterion, ...]
    answer: str
    distractor_answer: str
    files: Mapping[str, object] = field(default_factory=dict)
    """Path -> document model of every file the oracle writes."""
    distractor_files: Mapping[str, object] = field(default_factory=dict)
    plan: tuple[PlannedCall, ...] = ()
    """The MCP tool calls that find the answer and make the edits (see `call`)."""


@dataclass(frozen=True)
class Template:
    name: str
    tier: int
    domains: tuple[Domain, ...]
    build: Callable[[World, random.Random], Draft | None]
    needs_distractors: bool = False
    """The task is about the superseded draft, so it exists only in worlds that have one."""


TEMPLATES: list[Template] = []
MILLION = 1e6
ALL_DOMAINS = tuple(Domain)


def template(name: str, tier: int, domains: tuple[Domain, ...] = ALL_DOMAINS,
             needs_distractors: bool = False):
    def register(fn: Callable[[World, random.Random], Draft | None]):
        TEMPLATES.append(Template(name, tier, domains, fn, needs_distractors))
        return fn

    return register


def templates_for(domain: Domain, tier: int | None = None, distractors: bool = True
                  ) -> list[Template]:
    return [t for t in TEMPLATES
            if domain in t.domains and (tier is None or t.tier == tier)
            and (distractors or not t.needs_distractors)]


# Criterion builders: one place that knows each kind's parameters.

def number(cid: str, description: str, value: float, unit: str = "", rel_tol: float = 0.005,
           abs_tol: float = 0.0, weight: float = 1.0, scale: float = 1.0,
           reject: tuple[float, ...] = ()) -> Criterion:
    """`reject`: distractor values whose mention fails the criterion (no hedged answers)."""
    params: dict = {"value": value, "rel_tol": rel_tol, "abs_tol": abs_tol, "unit": unit}
    if scale != 1.0:
        params["scale"] = scale
    # A distractor inside twice the tolerance cannot be told apart from the answer: not rejected.
    margin = 2 * max(abs_tol, rel_tol * abs(value))
    reject = tuple(r for r in reject if abs(r - value) > margin)
    if reject:
        params["reject"] = list(reject)
    return Criterion(cid, CriterionKind.ANSWER_NUMBER, description, weight, params)


def millions(cid: str, description: str, value: float, rel_tol: float = 0.005,
             abs_tol: float = 0.0, weight: float = 1.0, reject: tuple[float, ...] = ()
             ) -> Criterion:
    """A money figure in USD millions: `27.8`, `$27.8m` and `27,800,000` all state it."""
    return number(cid, description, value, "", rel_tol, abs_tol, weight, MILLION, reject)


def names(cid: str, description: str, any_of: list[str], none_of: list[str] | None = None,
          weight: float = 1.0) -> Criterion:
    params: dict = {"any_of": any_of, "none_of": none_of or []}
    return Criterion(cid, CriterionKind.ANSWER_TEXT, description, weight, params)


def content(text: list[list[str]] | None = None, numbers: list[float] | None = None,
            rel_tol: float = 0.005, scale: float = MILLION) -> dict:
    """A content spec; `numbers` are money figures in USD millions unless `scale` says not."""
    numbers_spec = [{"value": v, "rel_tol": rel_tol, "scale": scale} for v in numbers or []]
    return {"text": text or [], "numbers": numbers_spec}


def cell(cid: str, description: str, path: str, sheet: str, ref: str, value: float) -> Criterion:
    params = {"path": path, "sheet": sheet, "cell": ref, "value": value, "rel_tol": 0.005}
    return Criterion(cid, CriterionKind.FILE_CELL, description, 1.0, params)


def table_cell(cid: str, description: str, path: str, row: int, col: int,
               value: float) -> Criterion:
    params = {"path": path, "table": 0, "row": row, "col": col, **content(numbers=[value])}
    return Criterion(cid, CriterionKind.FILE_TABLE_CELL, description, 1.0, params)


def slide_shape(cid: str, description: str, path: str, slide: int, shape: str,
                spec: dict) -> Criterion:
    params = {"path": path, "slide": slide, "shape": shape, **spec}
    return Criterion(cid, CriterionKind.FILE_SLIDE_SHAPE, description, 1.0, params)


def created(cid: str, description: str, path: str, file_type: str, spec: dict) -> Criterion:
    params = {"path": path, "file_type": file_type, **spec}
    return Criterion(cid, CriterionKind.FILE_CREATED, description, 1.0, params)


def unchanged(cid: str, allowed: list[str]) -> Criterion:
    return Criterion(cid, CriterionKind.FILES_UNCHANGED,
                     "No other file in the workspace was created, modified or deleted.",
                     0.5, {"allowed": allowed})


def call(tool: str, **arguments: object) -> PlannedCall:
    """A planned call on the combined endpoint, e.g. `call("pdf_search", path=..., query=...)`."""
    return PlannedCall(tool, arguments)


def date_forms(day: dt.date) -> list[str]:
    """The spellings of a date a professional might write."""
    forms = [day.isoformat(), f"{day.day} {day:%B %Y}", f"{day:%d %B %Y}",
             f"{day:%B} {day.day}, {day.year}", f"{day:%B %d, %Y}", f"{day.day} {day:%b %Y}",
             f"{day:%b} {day.day}, {day.year}"]
    return list(dict.fromkeys(forms))


def fmt(value: float) -> str:
    return f"{value:,.1f}"


# Importing the template modules registers them.
from kwrl.worlds.templates import common, domain_specific  # noqa: E402,F401
