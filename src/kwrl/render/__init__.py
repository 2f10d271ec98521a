"""Chat template <-> tokens: the first prompt, observations, tool-call parsing, the token tape.

- `ChatTemplateRenderer`: drives a tokenizer's own (Qwen3-style) chat template; observations are
  appended with the fixed-base technique, never by re-rendering history.
- `parse_assistant_text` / `ParsedAssistant` / `ParseError`: tool calls out of sampled text;
  malformed calls are values with a message for the model.
- `Tape`: the append-only TITO record (ids, loss mask, logprobs, policy versions, turns).
- `drift`: compare a tape with a from-scratch render and say where they differ.
"""

from kwrl.render.drift import DriftReport, compare, drift
from kwrl.render.parse import ParsedAssistant, ParseError, parse_assistant_text
from kwrl.render.renderer import (
    BASE_CONVERSATION,
    ChatTemplateRenderer,
    Renderer,
    TemplateError,
    message_dict,
    observation_messages,
)
from kwrl.render.tape import Tape

__all__ = [
    "BASE_CONVERSATION",
    "ChatTemplateRenderer",
    "DriftReport",
    "ParseError",
    "ParsedAssistant",
    "Renderer",
    "Tape",
    "TemplateError",
    "compare",
    "drift",
    "message_dict",
    "observation_messages",
    "parse_assistant_text",
]
