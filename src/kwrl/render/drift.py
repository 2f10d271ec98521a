"""Drift: how far a tape is from a from-scratch render of the same conversation.

The tape is what was trained on; a re-render is what a decode-and-retokenize pipeline would have
trained on instead. They differ when the template rewrites history (dropping earlier `<think>`
blocks, the newline after `<|im_end|>`), when the model's tool-call JSON is spaced or ordered
differently from `json.dumps` of the parsed arguments, or when the model sampled a non-canonical
tokenization of its own text (BPE is not a bijection). Counting that difference per trajectory
shows how off-policy a re-rendering pipeline would be, and proves our own template does not
drift. The tape is never changed by this check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from kwrl.render.renderer import Renderer, ToolSchema
from kwrl.render.tape import Tape
from kwrl.types import Message


@dataclass(frozen=True)
class DriftReport:
    """Tape vs render, token by token."""

    drift_tokens: int
    """Tokens that are not in a common run of both (each edit counts its longer side)."""
    first_mismatch: int | None
    """Index of the first differing token (None when identical)."""
    tape_length: int
    render_length: int
    tape_context: str
    """The tape decoded around the first mismatch ('' when identical)."""
    render_context: str
    """The render decoded around the first mismatch."""

    @property
    def ok(self) -> bool:
        return self.drift_tokens == 0

    def __str__(self) -> str:
        if self.ok:
            return f"no drift ({self.tape_length} tokens)"
        return (f"{self.drift_tokens} drifted tokens, first at {self.first_mismatch}: "
                f"tape {self.tape_context!r} vs render {self.render_context!r}")


def drift(
    tape: Tape, renderer: Renderer, messages: Sequence[Message],
    tools: Sequence[ToolSchema] | None = None, context: int = 8,
) -> DriftReport:
    """Render `messages` (assistant turns as parsed) from scratch and compare with `tape`.

    A conversation ending in an assistant turn is rendered without a generation prompt and cut
    after its last stop token when the tape ends with one (the template's `\\n` after the final
    `<|im_end|>` was never sampled); otherwise with the generation prompt, as the tape has it.
    """
    taped = list(tape.token_ids)
    stops = renderer.stop_token_ids
    ends_with_assistant = bool(messages) and messages[-1].role == "assistant"
    rendered = renderer.render(messages, tools, add_generation_prompt=not ends_with_assistant)
    if ends_with_assistant and taped and taped[-1] in stops:
        last_stop = max((i for i, t in enumerate(rendered) if t in stops), default=None)
        if last_stop is not None:
            rendered = rendered[: last_stop + 1]
    return compare(taped, rendered, renderer, context)


def compare(
    taped: Sequence[int], rendered: Sequence[int], renderer: Renderer, context: int = 8
) -> DriftReport:
    """The DriftReport of two id lists."""
    opcodes = SequenceMatcher(None, taped, rendered, autojunk=False).get_opcodes()
    drifted = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in opcodes if tag != "equal")
    first = next((i for i, (a, b) in enumerate(zip(taped, rendered, strict=False)) if a != b),
                 None)
    if first is None and len(taped) != len(rendered):
        first = min(len(taped), len(rendered))
    if first is None:
        return DriftReport(0, None, len(taped), len(rendered), "", "")
    lo = max(0, first - context)
    return DriftReport(
        drift_tokens=drifted,
        first_mismatch=first,
        tape_length=len(taped),
        render_length=len(rendered),
        tape_context=renderer.decode(taped[lo: first + context]),
        render_context=renderer.decode(rendered[lo: first + context]),
    )
