"""Which rows of a decode batch share a prompt prefix, and where their shared keys live.

The bookkeeping of `StaticQwen3Decoder`'s shared-prefix (cascade) attention (see
`kwrl.engines.decoders`): `prefix_groups` chooses the groups when a batch starts,
`SharedPrefixes` holds each group's prefix cache and follows the batch as rows finish, and
`PrefixCall` says which queries read which prefixes in one attention call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import torch

MIN_SHARED_PREFIX = 32
"""Prompt tokens that rows must have in common before they are stored and attended once for
all of them: fewer save too little cache traffic to pay for a second attention call per layer."""

MIN_SAVED_SHARE = 0.25
"""The share of a batch's prompt tokens that sharing must save before a batch takes the shared
path, whose step has ~20 more tensor ops: measured (tiny model, prompts of 576-768 tokens), one
pair of identical prompts among 16 or 64 rows decoded 5-10% slower shared, a quarter of the
rows in pairs about as fast (16 rows) or 7% faster (64 rows)."""

@dataclass(frozen=True)
class PrefixGroups:
    """Which rows of a batch share a prompt prefix, and how long it is."""

    group_B: list[int]
    """The group of each row (0 .. G-1), numbered largest first."""
    prefix_G: list[int]
    """Prompt tokens that every row of the group has in common, stored once for the group. Less
    than each row's prompt, so that every row keeps its last prompt token (whose logits start
    its completion); a group of one holds all of its row's prompt but the last token."""


def prefix_groups(prompts: list[list[int]], min_shared: int = MIN_SHARED_PREFIX,
                  min_saved: float = MIN_SAVED_SHARE) -> PrefixGroups | None:
    """Rows grouped to store the fewest prompt tokens, or None when that saves less than
    `min_saved` of them (rows share a prefix only if it has `min_shared` tokens or more), or when
    a prompt has a single token (and so no prefix of its own to store).

    Sorted prompts put each shared prefix in a run of neighbours, and a run's common prefix is
    the least common prefix of its adjacent pairs; the runs are chosen by dynamic programming
    to maximise the tokens saved, sum over groups of (rows - 1) * prefix. Grouping a few
    identical prompts apart from others that share only a system prompt with them can save more
    than one group of all of them, and the search finds that.
    """
    if len(prompts) < 2 or min(map(len, prompts)) < 2:
        return None
    order = sorted(range(len(prompts)), key=lambda b: prompts[b])
    common = [_common_length(prompts[a], prompts[b])
              for a, b in zip(order, order[1:], strict=False)]
    # best[j]: (most tokens saved by grouping order[:j], where its last group starts, and that
    # group's shared prefix)
    best = [(0, 0, 0)]
    for stop in range(1, len(order) + 1):
        shared = len(prompts[order[stop - 1]]) - 1
        best.append((best[stop - 1][0], stop - 1, shared))  # order[stop - 1] alone
        for first in range(stop - 2, -1, -1):  # order[first:stop] together
            shared = min(shared, common[first], len(prompts[order[first]]) - 1)
            if shared < min_shared:
                break  # it only shrinks as the group grows
            saved = best[first][0] + (stop - first - 1) * shared
            if saved > best[stop][0]:
                best[stop] = (saved, first, shared)
    if best[-1][0] == 0 or best[-1][0] < min_saved * sum(map(len, prompts)):
        return None
    runs, stop = [], len(order)  # (rows, shared prefix) of each group
    while stop > 0:
        _, first, shared = best[stop]
        runs.append((order[first:stop], shared))
        stop = first
    runs.sort(key=lambda run: -len(run[0]))
    group_B = [0] * len(prompts)
    for group, (rows, _) in enumerate(runs):
        for row in rows:
            group_B[row] = group
    return PrefixGroups(group_B, [shared for _, shared in runs])


def _common_length(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((k for k, (x, y) in pairs if x != y), min(len(a), len(b)))


class PrefixCall(NamedTuple):
    """One attention call over the shared prefixes [first, stop), for the M queries that read
    them: query m, KV head k at [group_M_1[m] - first, k, rank_M_1[m]] in the grid
    [stop - first, K, width * H/K, D]."""

    first: int
    stop: int
    rows_M: torch.Tensor | None
    """Which of the N queries these are (None: all of them, in order)."""
    group_M_1: torch.Tensor
    rank_M_1: torch.Tensor
    """The query's place among its group's queries."""
    width: int
    """Queries per group in the grid: the most any group has (the others pad with zeros)."""


def prefix_calls(group_N: list[int], groups: int, shared: int, device: torch.device
                  ) -> list[PrefixCall]:
    """The calls that attend N queries (of groups group_N) over `groups` prefixes, of which
    [0, shared) are read by several rows and the rest by one: one call for each kind, so that
    a group of one pads no query slots to the width of a large group (a query slot costs as
    much compute as a real query)."""
    calls = []
    for first, stop in ((0, shared), (shared, groups)):
        rows = [n for n, group in enumerate(group_N) if first <= group < stop]
        if not rows:
            continue
        count, rank_M = [0] * groups, []
        for n in rows:
            rank_M.append(count[group_N[n]])
            count[group_N[n]] += 1
        rows_M = None if len(rows) == len(group_N) else torch.tensor(rows, device=device)
        calls.append(PrefixCall(
            first, stop, rows_M,
            torch.tensor([group_N[n] - first for n in rows], device=device).unsqueeze(1),
            torch.tensor(rank_M, device=device).unsqueeze(1), max(count)))
    return calls


class SharedPrefixes:
    """A batch's shared prompt prefixes, each prefilled and stored once for its group of rows.

    The cache is laid out as the rows' own (left-aligned: column = position), with a bias that
    masks the columns beyond each group's prefix. A row's prompt suffix and new tokens live in
    the rows' cache at columns counted from the end of its group's prefix. Groups are numbered
    largest first, so that the groups of several rows, [0, shared), precede those of one.
    """

    def __init__(self, cache_L_G_2K_P_D: torch.Tensor, prefix_G: list[int], group_B: list[int]
                 ) -> None:
        device = cache_L_G_2K_P_D.device
        self.cache_L_G_2K_P_D = cache_L_G_2K_P_D
        columns_P = torch.arange(cache_L_G_2K_P_D.shape[3], device=device)
        length_G_1 = torch.tensor(prefix_G, device=device).unsqueeze(1)
        self.bias_G_1_1_P = torch.zeros((len(prefix_G), 1, 1, len(columns_P)),
                                        dtype=cache_L_G_2K_P_D.dtype, device=device)
        self.bias_G_1_1_P.masked_fill_((columns_P >= length_G_1)[:, None, None], float("-inf"))
        self._regroup(group_B)

    def calls(self, group_N: list[int]) -> list[PrefixCall]:
        return prefix_calls(group_N, len(self.bias_G_1_1_P), self.shared,
                             self.bias_G_1_1_P.device)

    def keep(self, rows: list[int]) -> None:
        """Keep these rows; drop the prefixes that no kept row reads, renumber the rest largest
        first."""
        group_B = [self.group_B[row] for row in rows]
        sizes = Counter(group_B)
        order_G = sorted(sizes, key=lambda group: (-sizes[group], group))
        if order_G != list(range(len(self.bias_G_1_1_P))):
            index_G = torch.tensor(order_G, device=self.bias_G_1_1_P.device)
            self.cache_L_G_2K_P_D = self.cache_L_G_2K_P_D.index_select(1, index_G)
            self.bias_G_1_1_P = self.bias_G_1_1_P.index_select(0, index_G)
            renumber = {group: k for k, group in enumerate(order_G)}
            group_B = [renumber[group] for group in group_B]
        self._regroup(group_B)

    def _regroup(self, group_B: list[int]) -> None:
        self.group_B = group_B
        self.shared = sum(1 for size in Counter(group_B).values() if size > 1)
        self.row_calls = self.calls(group_B)
