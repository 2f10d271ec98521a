"""Cut large tool outputs head and tail, with a note on how to read the rest.

An agent's context is the scarce resource: a tool that returns a 400 KB sheet wastes it and, on
small models, drowns the answer. The recipe kwrl reproduces kept the first 28,000 and last 14,000
of 42,000 characters; the default here is the same two-to-one split of a smaller budget.
"""

from __future__ import annotations

DEFAULT_LIMIT = 12_000


def truncate(text: str, limit: int = DEFAULT_LIMIT, hint: str = "") -> str:
    """`text` if it fits in `limit` characters, else its head and tail around a marker.

    `hint` tells the agent how to get the part that was cut, e.g. "read_range with a smaller
    range" or "read with offset"; it is appended to the marker.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    how = f" {hint}" if hint else ""
    marker = f"\n[... {cut:,} characters cut of {len(text):,}.{how} ...]\n"
    return text[:head] + marker + text[len(text) - tail:]
