"""Numbers as professionals write them, found in free text and compared with a tolerance.

An answer may state the same figure as `4.5m`, `$4.5M`, `4.5 million`, `USD 4,500,000` or
`€4.5mn`; accounting writes negatives as `(1,234)`; ratios come as `12.5%` or `3.2x`. The grader
must be lenient in format and strict in value, so every mention is reduced to a `NumberMention`
(value after scaling, unit, the text as written) and compared numerically.

Decisions a reader should know:
- Dates and period labels are masked before scanning (`2025-03-14`, `14/03/2025`, `March 14, 2025`,
  `Q3 2025`, `FY2024`, `H1 25`, `10:30`), so the day, quarter or fiscal year in a sentence cannot
  match an expected figure. A bare year (`in 2025`) is still a number: it cannot be told apart
  from the figure 2025.
- Numbers glued into identifiers (`INV-2025-0042`, `FY24`, `v1.2.3`, `25th`) are not numbers;
  the price is that the upper end of a range written `10-12` is skipped too.
- A single-letter scale must be attached (`4.5m`, `3k`); with a space only words count
  (`4.5 mn`, `4.5 million`), so `3 M&A deals` stays 3.
- Percent (`unit="%"`): the expected value is in percent (12.5 means 12.5%). Accepted mentions:
  `12.5%`, `12.5 percent`, `12.5 per cent`, `12.5 pct`, `12.5pp`, `1250bps` and a bare `12.5`.
  The fraction `0.125` is *not* accepted: a bare 0.125 reads as 0.125%, and accepting both
  readings would let one of two wrong answers pass. A mention written as a percentage never
  matches a plain expected value (12.5% is not the count 12.5), nor does a currency amount match
  a percentage.
- Multiples (`unit="x"`): `3.2x`, `3.2×`, `3.2 times` and a bare `3.2` are accepted.
- The sign is part of the value: `(1,234)` and `-1,234` are -1234 and do not match +1234.
- Match rule: |found - expected| <= max(abs_tol, rel_tol * |expected|), nothing cleverer.
- `scale` (e.g. 1e6) says the expected value is in those units, as the world's tables print it:
  the full figure (`27.8m`, `27,800,000`) states it, and so does the bare figure (`27.8`); a
  mention with another scale word (`27.8bn`, `27.8k`) does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Literal

Unit = Literal["", "%", "x"]

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_DATE_PATTERNS = (
    r"\b\d{4}-\d{1,2}-\d{1,2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",
    r"\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b",
    r"\b\d{4}/\d{1,2}/\d{1,2}\b",
    rf"\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b",
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b",
    rf"\b{_MONTH},?\s+\d{{4}}\b",
    r"\b(?:Q[1-4]|H[12]|FY|CY)\s*(?:FY\s*)?'?\d{2,4}(?:[/-]\d{2,4})?\b",
    r"\b[1-4]Q\s*'?\d{2,4}\b|\b[12]H\s*'?\d{2,4}\b",
    r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\.?)?",
)
_DATES = re.compile("|".join(f"(?:{p})" for p in _DATE_PATTERNS), re.IGNORECASE)

_NUMBER = re.compile(
    r"""
    (?<![\w.])(?<!\w-)                           # not the tail of a word, code or number
    (?P<open>\(\s*)?
    (?P<sign1>[-\u2212])?
    (?P<cur>(?:US\$|USD|EUR|GBP|CHF|JPY|CAD|AUD|[$€£¥])\s?)?
    (?P<sign2>[-\u2212])?
    (?P<digits>\d{1,3}(?:[,\u00a0\u202f]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)
    (?P<exp>e[-+]?\d{1,3})?
    (?:(?P<scale_word>\s?(?:thousand|millions?|billions?|trillions?|mio|mn|mm|bn|tn))
       |(?P<scale_letter>[kmb]))?
    (?:\s?(?P<pct>%|percent|per\s?cent|pct|pp|percentage\s+points?|bps|basis\s+points?)
       |(?P<times>[x×]|\s?times))?
    (?P<close>\s*\))?
    (?![\w&]|\.\d)
    """,
    re.VERBOSE | re.IGNORECASE,
)

_SCALES = {
    "k": 1e3, "thousand": 1e3,
    "m": 1e6, "mm": 1e6, "mn": 1e6, "mio": 1e6, "million": 1e6, "millions": 1e6,
    "b": 1e9, "bn": 1e9, "billion": 1e9, "billions": 1e9,
    "tn": 1e12, "trillion": 1e12, "trillions": 1e12,
}  # fmt: skip


@dataclass(frozen=True)
class NumberMention:
    """One number as written in a text."""

    value: float
    """After scale and sign: `4.5m` -> 4_500_000.0, `(12)` -> -12.0, `12.5%` -> 12.5."""
    unit: Unit
    """`%` for percentages (value in percent), `x` for multiples, `` otherwise."""
    text: str
    """The mention as written, e.g. `$4.5M`."""
    currency: str = ""
    """The currency marker written before it (`$`, `USD`...), if any."""
    scaled: bool = False
    """Written with a scale word or letter (`4.5m`, `4.5 million`)."""


def find_numbers(text: str) -> list[NumberMention]:
    """Every number mentioned in `text`, in order, skipping dates and period labels."""
    masked = _DATES.sub(lambda m: " " * len(m.group()), text)
    mentions = []
    for match in _NUMBER.finditer(masked):
        mention = _mention(match)
        if mention is not None:
            mentions.append(mention)
    return mentions


def _mention(match: re.Match[str]) -> NumberMention | None:
    digits = re.sub(r"[,\u00a0\u202f]", "", match["digits"])
    try:
        number = Decimal(digits + (match["exp"] or ""))
    except InvalidOperation:
        return None
    scale_text = (match["scale_word"] or match["scale_letter"] or "").strip().lower()
    if scale_text:
        number *= Decimal(str(_SCALES[scale_text]))
    unit: Unit = ""
    pct = (match["pct"] or "").lower()
    if pct:
        unit = "%"
        if pct.startswith(("bps", "basis")):
            number /= 100
    elif match["times"]:
        unit = "x"
    negative = bool(match["sign1"] or match["sign2"] or (match["open"] and match["close"]))
    written = match.group().strip()
    if match["open"] and not match["close"]:
        written = written[1:].strip()
    return NumberMention(
        value=float(-number if negative else number),
        unit=unit,
        text=written,
        currency=(match["cur"] or "").strip(),
        scaled=bool(scale_text),
    )


def within(found: float, expected: float, rel_tol: float, abs_tol: float) -> bool:
    """The one tolerance rule: |found - expected| <= max(abs_tol, rel_tol * |expected|)."""
    return abs(found - expected) <= max(abs_tol, rel_tol * abs(expected))


def unit_compatible(mention: NumberMention, unit: Unit) -> bool:
    """Whether a mention may stand for an expected value of `unit` (see module notes)."""
    if unit == "%":
        return mention.unit in ("%", "") and not mention.currency
    if unit == "x":
        return mention.unit in ("x", "") and not mention.currency
    return mention.unit != "%"


def match_number(
    mentions: list[NumberMention],
    value: float,
    rel_tol: float,
    abs_tol: float,
    unit: Unit,
    scale: float = 1.0,
) -> NumberMention | None:
    """The first mention stating `value` (in units of `scale`) within tolerance, or None.

    With `scale` 1e6 and value 27.8, `27.8m` and `27,800,000` state it, and so does a bare `27.8`
    (the figure as a table in millions shows it); the returned mention then carries 27,800,000.
    """
    for mention in mentions:
        if not unit_compatible(mention, unit):
            continue
        if within(mention.value, value * scale, rel_tol, abs_tol * scale):
            return mention
        if scale != 1.0 and not mention.scaled and within(mention.value, value, rel_tol, abs_tol):
            return replace(mention, value=mention.value * scale)
    return None


def format_number(value: float, unit: str = "") -> str:
    """`4500000.0` -> `4,500,000`; `12.5, "%"` -> `12.5%`: for reasons a person reads."""
    text = f"{value:,.10g}"
    return f"{text}{unit}"


def describe_tolerance(rel_tol: float, abs_tol: float) -> str:
    rel = f"±{format_number(rel_tol * 100)}%"
    if abs_tol and rel_tol:
        return f"±max({format_number(rel_tol * 100)}%, {format_number(abs_tol)})"
    if abs_tol:
        return f"±{format_number(abs_tol)}"
    return rel if rel_tol else "exactly"


def describe_mentions(mentions: list[NumberMention], limit: int = 8) -> str:
    if not mentions:
        return "none"
    shown = ", ".join(m.text for m in mentions[:limit])
    return shown + (f" and {len(mentions) - limit} more" if len(mentions) > limit else "")


def describe_match(mention: NumberMention, unit: Unit) -> str:
    """`4.5m (=4,500,000)`, or just `4,500,000` when that is how it was written."""
    normalized = format_number(mention.value, unit)
    return mention.text if mention.text == normalized else f"{mention.text} (={normalized})"


def answer_contains_number(
    text: str,
    value: float,
    rel_tol: float = 0.005,
    abs_tol: float = 0.0,
    unit: Unit = "",
    scale: float = 1.0,
    source: str = "the answer",
) -> tuple[bool, str]:
    """Whether `text` states `value` (within tolerance), with a reason a person can read."""
    mentions = find_numbers(text)
    tolerance = describe_tolerance(rel_tol, abs_tol * scale)
    target = format_number(value * scale, unit)
    found = match_number(mentions, value, rel_tol, abs_tol, unit, scale)
    if found is not None:
        states = "answer states" if source == "the answer" else f"{source} states"
        return True, f"{states} {describe_match(found, unit)}, expected {target} {tolerance}"
    return False, (
        f"no number within {tolerance} of {target} in {source}; "
        f"numbers found: {describe_mentions(mentions)}"
    )
