"""Advantages from outcome rewards: one scalar per sequence, baselined within its prompt group.

Every sequence of a group answers the same prompt, so the group's mean reward is the baseline.
A `valid_B` mask marks trials that ended in a system error (`TrialStatus.ERROR`): they carry no
reward (theirs may be NaN), get advantage 0 and do not enter their group's statistics, so a
crashed sandbox neither trains the policy nor shifts its siblings' baseline (MISSION lesson 1).
A group left with one valid member has no baseline to compare against: its advantage is 0.

The recipe uses Dr. GRPO (`grpo_advantages` with `norm_by_std=False`, the default): dividing by
the group's std would up-weight nearly-solved and nearly-failed prompts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kwrl.rl.groups import group_index, group_sum


def _valid_mask(rewards_B: Tensor, valid_B: Tensor | None) -> Tensor:
    if valid_B is None:
        return torch.ones_like(rewards_B, dtype=torch.bool)
    return valid_B.bool()


def _float(rewards_B: Tensor) -> Tensor:
    return rewards_B if rewards_B.is_floating_point() else rewards_B.to(torch.get_default_dtype())


def group_moments(
    rewards_B: Tensor, group_ids_B: Tensor, valid_B: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per sequence, over the valid members of its group: (count n_g, mean_g, std_g), each `[B]`.

    std_g is the unbiased (Bessel-corrected) sample std, sqrt(sum (R - mean_g)^2 / (n_g - 1)),
    as `torch.std` and SkyRL use; it is 0 for a group with fewer than two valid members.
    """
    rewards_B, valid_B = _float(rewards_B), _valid_mask(rewards_B, valid_B)
    index_B, num_groups = group_index(group_ids_B)
    zero = rewards_B.new_zeros(())
    count_G = group_sum(valid_B.to(rewards_B.dtype), index_B, num_groups)
    mean_G = group_sum(torch.where(valid_B, rewards_B, zero), index_B, num_groups)
    mean_G = mean_G / count_G.clamp(min=1)
    deviation_B = torch.where(valid_B, rewards_B - mean_G[index_B], zero)
    var_G = group_sum(deviation_B**2, index_B, num_groups) / (count_G - 1).clamp(min=1)
    return count_G[index_B], mean_G[index_B], var_G.sqrt()[index_B]


def grpo_advantages(
    rewards_B: Tensor,
    group_ids_B: Tensor,
    *,
    valid_B: Tensor | None = None,
    norm_by_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """A_i = R_i - mean_g (Dr. GRPO, default), or (R_i - mean_g) / (std_g + eps) with norm_by_std.

    Returns `[B]`; 0 for invalid trials. The valid advantages of a group sum to zero.
    """
    valid = _valid_mask(rewards_B, valid_B)
    _, mean_B, std_B = group_moments(rewards_B, group_ids_B, valid)
    centred_B = _float(rewards_B) - mean_B
    advantages_B = centred_B / (std_B + eps) if norm_by_std else centred_B
    return torch.where(valid, advantages_B, advantages_B.new_zeros(()))


def rloo_advantages(
    rewards_B: Tensor, group_ids_B: Tensor, *, valid_B: Tensor | None = None
) -> Tensor:
    """A_i = (R_i - mean_g) * n/(n-1) = R_i - mean of the other n-1 valid members (leave one out).

    Returns `[B]`; 0 for invalid trials and for groups with one valid member.
    """
    valid = _valid_mask(rewards_B, valid_B)
    count_B, mean_B, _ = group_moments(rewards_B, group_ids_B, valid)
    advantages_B = (_float(rewards_B) - mean_B) * count_B / (count_B - 1).clamp(min=1)
    return torch.where(valid, advantages_B, advantages_B.new_zeros(()))


def maxrl_advantages(
    rewards_B: Tensor, group_ids_B: Tensor, *, valid_B: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    """A_i = (R_i - mean_g) / (mean_g + eps) (MaxRL): rare successes weigh more. `[B]`."""
    valid = _valid_mask(rewards_B, valid_B)
    _, mean_B, _ = group_moments(rewards_B, group_ids_B, valid)
    advantages_B = (_float(rewards_B) - mean_B) / (mean_B + eps)
    return torch.where(valid, advantages_B, advantages_B.new_zeros(()))


def broadcast_to_tokens(advantages_B: Tensor, loss_mask_BT: Tensor) -> Tensor:
    """A_BT[i, t] = A_B[i] * loss_mask_BT[i, t]: the sequence's advantage on each trained token."""
    return advantages_B[:, None] * loss_mask_BT.to(advantages_B.dtype)


AdvantageFn = Callable[..., Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "maxrl": maxrl_advantages,
}
"""Advantage estimators by config name; each is `fn(rewards_B, group_ids_B, *, valid_B=None)`."""
