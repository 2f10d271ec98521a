"""Copy augmentation and answer drills: demonstrations whose figures can only be copied.

A tiny policy fine-tuned on oracle demonstrations learns the tool-call format, which file to
open and the shape of an answer within minutes, but it fills the answer's figures from its prior
(`$20.2m`, `22 January 2026`) instead of copying them from the tool result: the world generator
draws plausible values, and a 0.66M-parameter model lowers its loss faster by learning their
distribution than by forming the attention circuit that retrieves them (issue 4).

`randomize_copied_numbers` takes a demonstration tape and, for every number in its final answer
that also appears earlier on the tape (in a tool result), draws a fresh number of the same shape
(digits, separators, leading digit non-zero) and substitutes it everywhere on the tape (years
excepted). The tape
stays a consistent episode (the tool result and the answer agree) but its figures are new each
time it is drawn, so the only way to predict them is to copy them. Figures the answer computes
(a sum, a reformatted date) are left alone.

`answer_drill` cuts a demonstration down to the part that needs the copy: the question, the last
tool call, its result and the final answer (loss on the answer only). Drills are a quarter of a
tape's length, so a step sees four times as many copies; a 0.66M-parameter model trained on
drills forms the retrieval circuit after ~20k of them, where whole tapes had not formed it after
a comparable compute (measured in the README). `kwrl.train.sft` trains on drills first, then on
whole tapes.

Both work on token ids, without re-tokenizing (a drill is slices of the tape). The augmentation
needs a tokenizer that writes every digit as its own token and never merges a digit with anything
else (the tiny tokenizer does: Qwen's split regex isolates digits); `digit_token_ids` checks
this and raises ValueError otherwise.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

NUMBER_SEPARATORS = (".", ",")
MIN_DIGITS = 2
"""Numbers with fewer digits are left alone: a single digit ("Q2", "page 1") is structure, not a
figure to copy, and substituting it would rewrite unrelated text."""
YEAR_PREFIXES = ("19", "20")
"""Four-digit numbers starting so are years and are left alone: every world is set in a few
recent years, and a policy that learnt years as random digits writes `Q2 3025` into file names."""


def digit_token_ids(tokenizer: Any) -> tuple[dict[int, str], set[int]]:
    """The ids of the ten digits (id -> digit) and of the number separators, for a tokenizer that
    encodes every digit as a single token.

    Raises ValueError when it does not (a number like `2026` must encode as four digit tokens).
    """
    digits = {}
    for digit in "0123456789":
        ids = tokenizer.encode(digit, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"digit {digit!r} is not a single token: {ids}")
        digits[ids[0]] = digit
    sample = "1234567890.0,5"
    if tokenizer.encode(sample, add_special_tokens=False) != [
        tokenizer.encode(c, add_special_tokens=False)[0] for c in sample
    ]:
        raise ValueError("the tokenizer merges digits with other characters: "
                         "copy augmentation needs one token per digit")
    separators = {tokenizer.encode(s, add_special_tokens=False)[0] for s in NUMBER_SEPARATORS}
    return digits, separators


def number_spans(token_ids: Sequence[int], digits: dict[int, str], separators: AbstractSet[int]
                 ) -> list[tuple[int, int]]:
    """[start, end) of each number on the tape: digits, with single separators between digits."""
    spans = []
    i, n = 0, len(token_ids)
    while i < n:
        if token_ids[i] not in digits:
            i += 1
            continue
        start = i
        while i < n and (token_ids[i] in digits or (
                token_ids[i] in separators and i + 1 < n and token_ids[i + 1] in digits
                and token_ids[i - 1] in digits)):
            i += 1
        spans.append((start, i))
    return spans


def final_turn_start(loss_mask: Sequence[int]) -> int:
    """Where the last run of policy tokens (the final answer turn) begins."""
    end = len(loss_mask)
    while end > 0 and not loss_mask[end - 1]:
        end -= 1
    start = end
    while start > 0 and loss_mask[start - 1]:
        start -= 1
    return start


def randomize_copied_numbers(token_ids: Sequence[int], loss_mask: Sequence[int],
                             digits: dict[int, str], separators: AbstractSet[int],
                             rng: random.Random) -> tuple[int, ...]:
    """`token_ids` with every copied answer figure replaced, consistently, by a fresh random one.

    A figure is copied when the same token sequence appears on the tape before the final answer
    turn. The replacement keeps its shape (length, separator positions, a non-zero first digit
    stays non-zero) so the episode reads the same; the loss mask is unchanged.
    """
    ids = list(token_ids)
    answer_from = final_turn_start(loss_mask)
    spans = number_spans(ids, digits, separators)
    earlier = {tuple(ids[a:b]) for a, b in spans if b <= answer_from}
    by_digit = {d: i for i, d in digits.items()}
    replacements: dict[tuple[int, ...], tuple[int, ...]] = {}
    for a, b in spans:
        figure = tuple(ids[a:b])
        if a < answer_from or figure in replacements or figure not in earlier:
            continue
        text = "".join(digits.get(t, ".") for t in figure)
        if sum(c.isdigit() for c in text) < MIN_DIGITS or (
                len(text) == 4 and text.isdigit() and text.startswith(YEAR_PREFIXES)):
            continue
        replacements[figure] = tuple(
            t if t in separators else by_digit[str(rng.randrange(1 if k == 0 and digits[t] != "0"
                                                                   else 0, 10))]
            for k, t in enumerate(figure))
    if not replacements:
        return tuple(ids)
    for a, b in spans:
        new = replacements.get(tuple(ids[a:b]))
        if new is not None:
            ids[a:b] = new
    return tuple(ids)


def answer_drill(token_ids: Sequence[int], loss_mask: Sequence[int], turn_start_id: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The tape cut to its question turn, last call, last tool result and final answer, with the
    loss on the final answer only; None for a tape with no tool call before its answer.

    Turns are split at `turn_start_id` (`<|im_start|>`): turn 0 is the system prompt, turn 1 the
    question, then assistant and tool turns alternate, and the last turn is the answer.
    """
    starts = [i for i, t in enumerate(token_ids) if t == turn_start_id]
    if len(starts) < 5:
        return None
    bounds = list(zip(starts, [*starts[1:], len(token_ids)], strict=True))
    ids: list[int] = []
    mask: list[int] = []
    for k, (a, b) in enumerate([bounds[1], *bounds[-3:]]):
        ids += token_ids[a:b]
        mask += loss_mask[a:b] if k == 3 else [0] * (b - a)
    return tuple(ids), tuple(mask)


@dataclass(frozen=True)
class CopyAugment:
    """`randomize_copied_numbers` with a tokenizer's digit ids, applied with probability `p`."""

    digits: dict[int, str]
    separators: frozenset[int]
    p: float = 1.0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, p: float = 1.0) -> CopyAugment:
        digits, separators = digit_token_ids(tokenizer)
        return cls(digits, frozenset(separators), p)

    def __call__(self, token_ids: Sequence[int], loss_mask: Sequence[int],
                 rng: random.Random) -> tuple[int, ...]:
        if self.p < 1.0 and rng.random() >= self.p:
            return tuple(token_ids)
        return randomize_copied_numbers(token_ids, loss_mask, self.digits, self.separators, rng)
