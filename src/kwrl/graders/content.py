"""Phrase matching and content specs: "does this text say X", lenient in form, strict in words.

Text is compared after normalization (Unicode NFKD without accents, case-folded, every run of
punctuation and whitespace collapsed to one space), and a phrase must match whole words:
`Acme Corp.` matches `ACME corp`, `Société Générale` matches `Societe Generale`, but `Acme` does
not match `Acmeline`. The same rule serves answers and file contents.
"""

from __future__ import annotations

import fnmatch
import re
import unicodedata

from kwrl.graders.numbers import (
    describe_match,
    describe_mentions,
    describe_tolerance,
    find_numbers,
    format_number,
    match_number,
)
from kwrl.graders.params import ContentSpec
from kwrl.graders.snapshot import normalize_path

_NON_WORD = re.compile(r"[\W_]+")


def normalize_text(text: str) -> str:
    """Case-, accent- and punctuation-insensitive form, padded with spaces for whole-word search."""
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " " + _NON_WORD.sub(" ", stripped.casefold()).strip() + " "


def contains_phrase(normalized_text: str, phrase: str) -> bool:
    """Whether `phrase` occurs as whole words in text already passed through `normalize_text`."""
    needle = normalize_text(phrase)
    return needle.strip() != "" and needle in normalized_text


def first_phrase(normalized_text: str, phrases: list[str]) -> str | None:
    return next((p for p in phrases if contains_phrase(normalized_text, p)), None)


def check_content(spec: ContentSpec, text: str, source: str) -> tuple[bool, str]:
    """Whether `text` satisfies `spec`; the reason names what was found or what is missing."""
    normalized = normalize_text(text)
    found: list[str] = []
    missing: list[str] = []
    for group in spec.text:
        phrase = first_phrase(normalized, group)
        if phrase is None:
            missing.append("no mention of " + " or ".join(repr(p) for p in group))
        else:
            found.append(repr(phrase))
    mentions = find_numbers(text) if spec.numbers else []
    for number in spec.numbers:
        n = number
        hit = match_number(mentions, n.value, n.rel_tol, n.abs_tol, n.unit, n.scale)
        if hit is None:
            tolerance = describe_tolerance(n.rel_tol, n.abs_tol * n.scale)
            missing.append(
                f"no number within {tolerance} of {format_number(n.value * n.scale, n.unit)}"
                f" (numbers found: {describe_mentions(mentions)})"
            )
        else:
            found.append(describe_match(hit, number.unit))
    for phrase in spec.none_of:
        if contains_phrase(normalized, phrase):
            missing.append(f"mentions {phrase!r}, which is wrong")
    if missing:
        return False, f"{source}: " + "; ".join(missing)
    if not found:
        return True, f"{source} exists"
    return True, f"{source} mentions " + ", ".join(found)


def path_allowed(path: str, patterns: list[str]) -> bool:
    """Whether `path` is one of `patterns`: equal, inside a named directory, or glob-matching."""
    for pattern in patterns:
        pattern = normalize_path(pattern)
        if path == pattern or path.startswith(pattern + "/"):
            return True
        if fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def excerpt(text: str, limit: int = 80) -> str:
    """A one-line excerpt of `text` for a reason."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")
