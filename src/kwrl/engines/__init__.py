"""Engines: token ids in, token ids + logprobs out (see `base.Engine`).

- `LocalEngine` (`local`): in-process torch, batched KV-cached decoding on a worker thread.
- `HttpEngine` (`http`): the same protocol against `kwrl serve` or a real vLLM server.
- `server`: `kwrl serve`, a LocalEngine behind vLLM's OpenAI-compatible HTTP dialect.
- `OpenAIChatEngine` (`chat`): API models at the message level, for evaluation only (not TITO).

Only the contract is imported eagerly; the implementations load on first use, so that code which
needs `Engine` and `SamplingParams` does not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kwrl.engines.base import Completion, Engine, EngineError, SamplingParams

if TYPE_CHECKING:
    from kwrl.engines.chat import ChatEngine, ChatReply, OpenAIChatEngine
    from kwrl.engines.http import HttpEngine
    from kwrl.engines.local import EngineStats, LocalEngine

_LAZY = {
    "ChatEngine": "chat", "ChatReply": "chat", "OpenAIChatEngine": "chat",
    "HttpEngine": "http", "EngineStats": "local", "LocalEngine": "local",
}  # fmt: skip

__all__ = [
    "ChatEngine",
    "ChatReply",
    "Completion",
    "Engine",
    "EngineError",
    "EngineStats",
    "HttpEngine",
    "LocalEngine",
    "OpenAIChatEngine",
    "SamplingParams",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"kwrl.engines.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'kwrl.engines' has no attribute {name!r}")
