"""Numbers in free text: lenient in format, strict in value, blind to dates."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwrl.graders.numbers import answer_contains_number, find_numbers


def values(text: str) -> list[float]:
    return [m.value for m in find_numbers(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.5m", 4_500_000),
        ("4.5M", 4_500_000),
        ("4.5 million", 4_500_000),
        ("$4.5M", 4_500_000),
        ("4,500,000", 4_500_000),
        ("USD 4,500,000", 4_500_000),
        ("€4.5mn", 4_500_000),
        ("4.5bn", 4_500_000_000),
        ("4.5 billion", 4_500_000_000),
        ("12k", 12_000),
        ("12 thousand", 12_000),
        ("(1,234)", -1234),
        ("-1,234", -1234),
        ("\u22121,234", -1234),
        ("($4.5m)", -4_500_000),
        ("12.5%", 12.5),
        ("3.2x", 3.2),
        ("4.5e6", 4_500_000),
        ("1,234.56", 1234.56),
    ],
)
def test_each_written_format_parses_to_its_value(text: str, expected: float) -> None:
    assert values(f"The figure was {text}.") == [pytest.approx(expected)]


@pytest.mark.parametrize(
    "text",
    [
        "Signed on 2025-03-14 at 10:30.",
        "Due 14/03/2025 or 03.14.2025.",
        "Dated March 14, 2025 and 14 March 2025, reviewed Mar 2025.",
        "Results for Q3 2025, FY2024, FY 2024/25, H1 25 and 3Q25.",
        "See invoice INV-2025-0042, version v1.2.3, the 25th entry.",
    ],
)
def test_dates_periods_and_identifiers_are_not_numbers(text: str) -> None:
    assert values(text) == []


def test_a_date_cannot_make_a_wrong_answer_pass() -> None:
    met, _ = answer_contains_number("Revenue was reported on 2025-03-14 for Q3 2025.", 14)
    assert not met
    met, _ = answer_contains_number("Revenue was reported on 2025-03-14 for Q3 2025.", 2025)
    assert not met


def test_a_single_letter_scale_must_be_attached() -> None:
    assert values("We closed 3 M&A deals and 2 more.") == [3, 2]
    assert values("It cost 3 mn and 4m.") == [3_000_000, 4_000_000]


def test_a_range_keeps_its_lower_end_only() -> None:
    assert values("between 10-12 weeks") == [10]


def test_met_reason_shows_the_mention_and_its_value() -> None:
    met, reason = answer_contains_number("Revenue was 4.5m.", 4_500_000)
    assert met
    assert reason == "answer states 4.5m (=4,500,000), expected 4,500,000 ±0.5%"


def test_unmet_reason_lists_the_numbers_found() -> None:
    met, reason = answer_contains_number("Revenue was 4.2m.", 4_500_000)
    assert not met
    assert reason == "no number within ±0.5% of 4,500,000 in the answer; numbers found: 4.2m"


def test_no_numbers_at_all_is_said_so() -> None:
    met, reason = answer_contains_number("I could not find it.", 7)
    assert not met and reason.endswith("numbers found: none")


def test_tolerance_is_relative_by_default_and_absolute_when_given() -> None:
    assert answer_contains_number("4,520,000", 4_500_000)[0]  # 0.44% off
    assert not answer_contains_number("4,530,000", 4_500_000)[0]  # 0.67% off
    assert answer_contains_number("10.4", 10.0, rel_tol=0.0, abs_tol=0.5)[0]
    assert not answer_contains_number("10.6", 10.0, rel_tol=0.0, abs_tol=0.5)[0]


def test_the_sign_is_part_of_the_value() -> None:
    assert answer_contains_number("a loss of (1,234)", -1234)[0]
    assert not answer_contains_number("a loss of (1,234)", 1234)[0]


def test_percent_accepts_percent_words_and_bare_numbers_but_not_fractions() -> None:
    for text in ("12.5%", "12.5 %", "12.5 percent", "12.5 per cent", "12.5pp", "1250bps", "12.5"):
        assert answer_contains_number(f"Margin: {text}", 12.5, unit="%")[0], text
    assert not answer_contains_number("Margin: 0.125", 12.5, unit="%")[0]
    assert not answer_contains_number("Margin: $12.5", 12.5, unit="%")[0]


def test_a_percentage_is_not_a_plain_number() -> None:
    met, reason = answer_contains_number("Growth was 12.5%", 12.5)
    assert not met
    assert "12.5%" in reason


def test_multiples_accept_x_times_and_bare_numbers() -> None:
    for text in ("3.2x", "3.2×", "3.2 times", "3.2"):
        assert answer_contains_number(f"EV/EBITDA of {text}", 3.2, unit="x")[0], text
    assert not answer_contains_number("EV/EBITDA of 3.2%", 3.2, unit="x")[0]


def test_percent_reason_writes_the_unit() -> None:
    _, reason = answer_contains_number("Margin 12.5 percent", 12.5, unit="%")
    assert reason == "answer states 12.5 percent (=12.5%), expected 12.5% ±0.5%"


SCALED_STYLES = [
    ("{m}k", 1e3),
    ("{m} thousand", 1e3),
    ("{m}m", 1e6),
    ("{m}M", 1e6),
    ("{m} million", 1e6),
    ("${m}M", 1e6),
    ("€{m}mn", 1e6),
    ("USD {m}m", 1e6),
    ("{m}bn", 1e9),
    ("{m} billion", 1e9),
]


@settings(max_examples=300, deadline=None)
@given(
    cents=st.integers(min_value=100, max_value=99_999),
    style=st.sampled_from(SCALED_STYLES),
    negative=st.booleans(),
)
def test_scaled_formats_round_trip(cents: int, style: tuple[str, float], negative: bool) -> None:
    template, scale = style
    mantissa = f"{cents / 100:.2f}"
    text = template.format(m=mantissa)
    if negative:
        text = f"({text})"
    expected = (-1 if negative else 1) * float(mantissa) * scale
    met, reason = answer_contains_number(f"Net figure: {text} for 2024.", expected, rel_tol=1e-9)
    assert met, reason


@settings(max_examples=300, deadline=None)
@given(
    amount=st.integers(min_value=0, max_value=10**12),
    style=st.sampled_from(["{:,}", "USD {:,}", "${:,}", "-{:,}", "({:,})", "{}"]),
)
def test_integer_formats_round_trip(amount: int, style: str) -> None:
    text = style.format(amount)
    sign = -1 if text.startswith(("-", "(")) else 1
    assert values(f"Total: {text}.") == [sign * amount]


@settings(max_examples=200, deadline=None)
@given(
    tenths=st.integers(min_value=0, max_value=10_000),
    style=st.sampled_from(["{}%", "{} percent", "{}x", "{} times"]),
)
def test_ratio_formats_round_trip(tenths: int, style: str) -> None:
    value = tenths / 10
    unit = "%" if "%" in style or "percent" in style else "x"
    met, reason = answer_contains_number(style.format(value), value, rel_tol=1e-9, unit=unit)
    assert met, reason


@settings(max_examples=200, deadline=None)
@given(
    day=st.dates(min_value=dt.date(1990, 1, 1), max_value=dt.date(2040, 12, 31)),
    style=st.sampled_from(["%Y-%m-%d", "%d/%m/%Y", "%B %d, %Y", "%d %B %Y", "%b %Y", "FY%Y"]),
)
def test_no_date_format_yields_a_number(day: dt.date, style: str) -> None:
    assert values(f"as of {day.strftime(style)} the figure") == []


def test_a_value_in_millions_is_stated_in_full_or_as_the_bare_figure() -> None:
    for text in ("$27.8m", "27,800,000", "USD 27.8 million", "27.8"):
        met, reason = answer_contains_number(f"Revenue: {text}", 27.8, scale=1e6)
        assert met, text
    _, reason = answer_contains_number("Revenue: 27.8", 27.8, scale=1e6)
    assert reason == "answer states 27.8 (=27,800,000), expected 27,800,000 ±0.5%"
    for wrong in ("27.8bn", "27.8k", "27,800", "28.9"):
        met, reason = answer_contains_number(f"Revenue: {wrong}", 27.8, scale=1e6)
        assert not met, wrong
    assert reason == "no number within ±0.5% of 27,800,000 in the answer; numbers found: 28.9"
