"""The chat app: the world's chat export (`Chat/channels.json`), read and posted to.

The export is `{"channels": [{"name", "topic", "messages": [{"user", "ts", "text"}]}]}`, as the
world writer produces it. Messages print one per line, `2025-10-06 09:15 UTC | Ines Moreau: text`,
oldest first, so the latest message is the last line. Posting appends to the channel and
rewrites the file atomically in the writer's layout (sorted keys, two-space indent), so a
snapshot diff shows only the new message.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from kwrl.tools.apps.base import App, atomic_write, hit_list, matches, plural, terms, utc_text
from kwrl.tools.errors import ToolError
from kwrl.tools.paths import resolve
from kwrl.tools.truncate import truncate

CHAT_FILE = "Chat/channels.json"


def _line(message: dict[str, Any]) -> str:
    when = str(message.get("ts", ""))
    try:
        when = utc_text(dt.datetime.fromisoformat(when))
    except ValueError:
        pass  # an unparseable timestamp is shown as written
    return f"{when} | {message.get('user', '?')}: {message.get('text', '')}"


class Chat(App):
    """Team chat: list channels, read and search messages, post."""

    name = "chat"

    def list_channels(self, path: str = CHAT_FILE) -> str:
        """List the chat channels with their topic and message count.

        Args:
            path: the chat export (default Chat/channels.json).
        """
        channels, rel = self._load(path)
        if not channels:
            return f"{rel} has no channels"
        lines = [f"{rel}: {plural(len(channels), 'channel')}"]
        for channel in channels:
            messages = channel.get("messages", [])
            last = _line(messages[-1]).split(" | ")[0] if messages else "never"
            lines.append(f"channel={channel.get('name')} | topic={channel.get('topic', '')} | "
                         f"messages={len(messages)} | last={last}")
        return truncate("\n".join(lines), hint="use chat_read on one channel")

    def read(self, channel: str, limit: int = 50, path: str = CHAT_FILE) -> str:
        """Read the latest `limit` messages of a channel, oldest first.

        Args:
            channel: channel name (see chat_list_channels).
            limit: how many of the most recent messages to show.
            path: the chat export (default Chat/channels.json).
        """
        channels, rel = self._load(path)
        found = self._channel(channels, channel, rel)
        messages = found.get("messages", [])
        if not messages:
            return f"#{found['name']} has no messages"
        shown = messages[-max(1, limit):]
        count = plural(len(messages), "message")
        head = f"#{found['name']}: {count}, showing the last {len(shown)}"
        return truncate("\n".join([head, *(_line(m) for m in shown)]),
                        hint="use a smaller limit, or chat_search")

    def search(self, query: str, channel: str | None = None, path: str = CHAT_FILE) -> str:
        """Find messages containing all words of `query` (in the text or the user's name).

        Args:
            query: words that must all appear in one message.
            channel: only this channel (default: all).
            path: the chat export (default Chat/channels.json).
        """
        words = terms(query)
        channels, rel = self._load(path)
        chosen = [self._channel(channels, channel, rel)] if channel else channels
        hits = [f"#{c['name']} | {_line(m)}" for c in chosen for m in c.get("messages", [])
                if matches(words, f"{m.get('user', '')} {m.get('text', '')}")]
        where = f"#{chosen[0]['name']}" if channel else rel
        return truncate(hit_list(hits, query, where), hint="use more words or a channel")

    def post(self, channel: str, text: str, user: str = "agent", path: str = CHAT_FILE) -> str:
        """Post a message to a channel (saved to the chat export).

        Args:
            channel: channel name.
            text: the message.
            user: the name it is posted under.
            path: the chat export (default Chat/channels.json).
        """
        if not text.strip():
            raise ToolError("the message is empty; give the text to post")
        file, rel, export = self._export(path)
        found = self._channel(export["channels"], channel, rel)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        message = {"user": user, "ts": now.isoformat(), "text": text}
        found.setdefault("messages", []).append(message)
        data = json.dumps(export, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        atomic_write(file, data.encode("utf-8"))
        return f"posted to #{found['name']}: {_line(message)}"

    def _export(self, path: str) -> tuple[Path, str, dict[str, Any]]:
        if not (self.root / path).exists():
            raise ToolError(f"no chat export at {path}; look for one with filesystem_find "
                            "pattern *.json and pass it as path")
        file = resolve(self.root, path, kind="file")
        try:
            export = json.loads(file.read_bytes().decode("utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ToolError(f"{path} cannot be read as JSON ({exc}); the file may be corrupt"
                            ) from exc
        if not isinstance(export, dict) or not isinstance(export.get("channels"), list):
            raise ToolError(f"{path} is not a chat export (expected a 'channels' list); read it "
                            "with filesystem_read")
        return file, self._rel(file), export

    def _load(self, path: str) -> tuple[list[dict[str, Any]], str]:
        _, rel, export = self._export(path)
        return [c for c in export["channels"] if isinstance(c, dict)], rel

    def _channel(self, channels: list[dict[str, Any]], name: str, rel: str) -> dict[str, Any]:
        wanted = name.strip().lstrip("#").lower()
        for channel in channels:
            if str(channel.get("name", "")).lower() == wanted:
                return channel
        names = ", ".join(str(c.get("name")) for c in channels)
        raise ToolError(f"no channel '{name}' in {rel}; channels: {names}")
