"""Prompt groups as dense indices: the one piece of bookkeeping advantages and reductions share.

Group ids are arbitrary integers (a task index, a hash); `torch.unique` maps them to 0..G-1 so
per-group sums are a single `index_add_`, with no Python loop over groups.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_index(group_ids_B: Tensor) -> tuple[Tensor, int]:
    """Map group ids `[B]` to dense indices `[B]` in 0..G-1; return them and G."""
    unique_G, index_B = torch.unique(group_ids_B, return_inverse=True)
    return index_B, unique_G.numel()


def group_sum(values_B: Tensor, index_B: Tensor, num_groups: int) -> Tensor:
    """Per-group sums `[G]`: sum_G[g] = sum of values_B[i] over i with index_B[i] == g."""
    return values_B.new_zeros(num_groups).index_add_(0, index_B, values_B)
