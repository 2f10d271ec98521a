"""Off-policy correction between the trainer and the sampler (REFERENCE section 2).

The sampler (vLLM, our engine) and the trainer compute slightly different probabilities for the
same tokens (kernels, precision, in-flight weight updates), and in async RL the sampler may also
be a few policy versions behind. With rho_t = exp(lp_old - lp_roll) (lp_old: the trainer's
pre-update forward; both constants), the options apply in REFERENCE's order, each stage seeing
the tokens the earlier stages kept:

1. outliers: drop a sequence if any rho_t < 1e-4 or > 100;
2. token mask (IcePop): drop tokens with rho_t outside [low, high], e.g. [0.5, 2];
3. truncated IS (TIS): weight each token by min(rho_t, 2), or each sequence by min(prod rho, 5);
4. sequence mask: keep a sequence if its geometric mean rho is in [0.99, 1.01], or its product in
   [0.5, 2].

All are off by default (the recipe sets none: DPPO and rollout_is already anchor on lp_roll).
The result is a detached weight to multiply the per-token loss by and a keep mask to multiply the
loss mask by *before* computing reduction weights, so dropped tokens leave the denominators.
Everything is row-local, so it commutes with micro-batching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from kwrl.rl.losses import MAX_LOG_RATIO


@dataclass(frozen=True)
class OffPolicyCorrection:
    """What the correction decided, per token."""

    weight_BT: Tensor
    """[B, T] detached importance weight for the per-token loss; 0 where not kept."""
    keep_BT: Tensor
    """[B, T] bool: loss-mask tokens that stay in the loss (multiply the loss mask by it)."""


def log_importance_ratio(
    old_logprobs_BT: Tensor, rollout_logprobs_BT: Tensor, loss_mask_BT: Tensor
) -> Tensor:
    """log rho_t = lp_old - lp_roll, detached, clamped to +-MAX_LOG_RATIO; 0 where masked."""
    log_rho_BT = (old_logprobs_BT - rollout_logprobs_BT).detach()
    log_rho_BT = log_rho_BT.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.where(loss_mask_BT.bool(), log_rho_BT, log_rho_BT.new_zeros(()))


def token_tis_weights(log_rho_BT: Tensor, loss_mask_BT: Tensor, cap: float = 2.0) -> Tensor:
    """Token TIS: w_t = min(rho_t, cap) on mask-1 tokens, 0 elsewhere. `[B, T]`."""
    weight_BT = log_rho_BT.exp().clamp(max=cap)
    return torch.where(loss_mask_BT.bool(), weight_BT, weight_BT.new_zeros(()))


def sequence_tis_weights(log_rho_BT: Tensor, loss_mask_BT: Tensor, cap: float = 5.0) -> Tensor:
    """Sequence TIS: w_i = min(prod_t rho_t, cap) over the row's mask-1 tokens. `[B]`.

    Computed as exp(min(sum_t log rho_t, log cap)), so a long product cannot overflow.
    """
    mask_BT = loss_mask_BT.bool()
    log_product_B = torch.where(mask_BT, log_rho_BT, log_rho_BT.new_zeros(())).sum(dim=1)
    return log_product_B.clamp(max=math.log(cap)).exp()


def token_band_keep(
    log_rho_BT: Tensor, loss_mask_BT: Tensor, low: float = 0.5, high: float = 2.0
) -> Tensor:
    """IcePop token mask: keep mask-1 tokens with low <= rho_t <= high. `[B, T]` bool."""
    rho_BT = log_rho_BT.exp()
    return loss_mask_BT.bool() & (rho_BT >= low) & (rho_BT <= high)


def sequence_outlier_keep(
    log_rho_BT: Tensor, loss_mask_BT: Tensor, low: float = 1e-4, high: float = 100.0
) -> Tensor:
    """Keep a sequence unless some mask-1 token has rho_t < low or rho_t > high. `[B]` bool."""
    rho_BT = log_rho_BT.exp()
    outlier_BT = loss_mask_BT.bool() & ((rho_BT < low) | (rho_BT > high))
    return ~outlier_BT.any(dim=1)


def sequence_ratio_keep(
    log_rho_BT: Tensor,
    loss_mask_BT: Tensor,
    kind: Literal["geometric", "product"],
    low: float,
    high: float,
) -> Tensor:
    """Keep a sequence if its ratio is in [low, high]. `[B]` bool.

    geometric: exp(mean_t log rho_t), e.g. [0.99, 1.01]; product: exp(sum_t log rho_t), e.g.
    [0.5, 2]. A row without mask-1 tokens has ratio 1.
    """
    mask_BT = loss_mask_BT.bool()
    log_sum_B = torch.where(mask_BT, log_rho_BT, log_rho_BT.new_zeros(())).sum(dim=1)
    if kind == "geometric":
        log_sum_B = log_sum_B / mask_BT.sum(dim=1).clamp(min=1)
    elif kind != "product":
        raise ValueError(f"sequence mask kind must be 'geometric' or 'product', got {kind!r}")
    ratio_B = log_sum_B.exp()
    return (ratio_B >= low) & (ratio_B <= high)


def off_policy_correction(
    old_logprobs_BT: Tensor,
    rollout_logprobs_BT: Tensor,
    loss_mask_BT: Tensor,
    *,
    outlier_bounds: tuple[float, float] | None = None,
    token_bounds: tuple[float, float] | None = None,
    tis: Literal["token", "sequence"] | None = None,
    tis_cap: float | None = None,
    sequence_mask: Literal["geometric", "product"] | None = None,
    sequence_bounds: tuple[float, float] | None = None,
) -> OffPolicyCorrection:
    """Apply the enabled corrections in REFERENCE's order (see module docstring).

    `tis_cap` defaults to 2 (token) or 5 (sequence); `sequence_bounds` to (0.99, 1.01)
    (geometric) or (0.5, 2) (product). With everything None: weight = mask, keep = mask.
    """
    log_rho_BT = log_importance_ratio(old_logprobs_BT, rollout_logprobs_BT, loss_mask_BT)
    keep_BT = loss_mask_BT.bool()
    if outlier_bounds is not None:
        keep_BT = keep_BT & sequence_outlier_keep(log_rho_BT, keep_BT, *outlier_bounds)[:, None]
    if token_bounds is not None:
        keep_BT = token_band_keep(log_rho_BT, keep_BT, *token_bounds)
    weight_BT = keep_BT.to(log_rho_BT.dtype)
    if tis == "token":
        weight_BT = token_tis_weights(log_rho_BT, keep_BT, tis_cap or 2.0)
    elif tis == "sequence":
        weight_BT = weight_BT * sequence_tis_weights(log_rho_BT, keep_BT, tis_cap or 5.0)[:, None]
    elif tis is not None:
        raise ValueError(f"tis must be 'token', 'sequence' or None, got {tis!r}")
    if sequence_mask is not None:
        default = (0.99, 1.01) if sequence_mask == "geometric" else (0.5, 2.0)
        low, high = sequence_bounds or default
        kept_B = sequence_ratio_keep(log_rho_BT, keep_BT, sequence_mask, low, high)
        keep_BT = keep_BT & kept_B[:, None]
        weight_BT = torch.where(keep_BT, weight_BT, weight_BT.new_zeros(()))
    return OffPolicyCorrection(weight_BT=weight_BT, keep_BT=keep_BT)
