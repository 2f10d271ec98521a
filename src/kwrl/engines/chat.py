"""`OpenAIChatEngine`: evaluate an API model through chat completions. Not an Engine; never trains.

An API model (OpenAI, or any OpenAI-compatible endpoint, `kwrl serve` included) takes messages and
returns a message: the provider renders the template and parses tool calls, so the tokens it
sampled are unknown and nothing it returns can go on a TITO tape. It therefore gets its own,
smaller interface, `ChatEngine.chat(messages, tools) -> ChatReply`, at the message level, which an
evaluation harness can drive; the `Engine` protocol (token ids in and out) is for policies that
train. A tool call whose arguments are not a JSON object is reported in `ChatReply.errors` and left
out of the message, so a harness can tell the model instead of running half a call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from kwrl.engines.base import EngineError
from kwrl.types import Message, ToolCall


@dataclass(frozen=True)
class ChatReply:
    message: Message
    """Role `assistant`: text content and the parsed tool calls."""
    finish_reason: str
    """As the provider said it: `stop`, `length`, `tool_calls`, `content_filter`, ..."""
    errors: tuple[str, ...] = ()
    """Tool calls that could not be parsed (left out of `message`)."""
    usage: Mapping[str, int] | None = None


class ChatEngine(Protocol):
    async def chat(self, messages: Sequence[Message],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> ChatReply:
        """The model's next assistant message; raise EngineError when the provider fails."""
        ...


class OpenAIChatEngine:
    """ChatEngine over `POST {base_url}/chat/completions` (base_url ends in `/v1`)."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 600.0, max_tokens: int = 1024, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None,
                 extra_body: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.sampling: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature,
                                         "top_p": top_p, **({"seed": seed} if seed is not None
                                                            else {}), **(extra_body or {})}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s,
                                         headers=headers)

    async def chat(self, messages: Sequence[Message],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> ChatReply:
        body: dict[str, Any] = {"model": self.model,
                                "messages": [openai_message(m) for m in messages], **self.sampling}
        if tools:
            body["tools"] = [dict(t) for t in tools]
        try:
            response = await self._client.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"chat completions: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise EngineError(f"chat completions: HTTP {response.status_code}: "
                              f"{response.text[:500]}")
        try:
            payload = response.json()
            return parse_chat_reply(payload)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"chat completions: malformed response: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def openai_message(message: Message) -> dict[str, Any]:
    """A kwrl Message in OpenAI's wire format (tool-call arguments as a JSON string)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": json.dumps(dict(c.arguments))}}
            for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def parse_chat_reply(payload: Mapping[str, Any]) -> ChatReply:
    choice = payload["choices"][0]
    raw = choice["message"]
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, call in enumerate(raw.get("tool_calls") or []):
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {k + 1} ({function.get('name')}): arguments are not JSON: "
                          f"{exc.msg}")
            continue
        if not isinstance(arguments, dict):
            errors.append(f"tool call {k + 1} ({function.get('name')}): arguments must be an "
                          "object")
            continue
        calls.append(ToolCall(str(call.get("id") or f"call_{k}"), str(function.get("name")),
                              arguments))
    message = Message("assistant", raw.get("content") or "", tool_calls=tuple(calls))
    return ChatReply(message, str(choice.get("finish_reason")), tuple(errors),
                     payload.get("usage"))
