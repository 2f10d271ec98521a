"""Policy-update metrics as plain floats, over mask-1 tokens only.

The one the recipe watches is `logprob_mismatch`: the mean |lp_trainer - lp_rollout| over trained
tokens, which should stay below 0.03 (it caught a vLLM offload + in-flight update bug). A mean,
min or max over no tokens is NaN, not 0, so an empty batch cannot pass for a healthy one.
"""

from __future__ import annotations

from torch import Tensor

from kwrl.rl.losses import PolicyLoss

MAX_LOGPROB_MISMATCH = 0.03
"""The recipe's health check: mean |lp_trainer - lp_rollout| must stay below this."""


def masked_mean(values_BT: Tensor, mask_BT: Tensor) -> float:
    """Mean of `values_BT` over mask-1 positions; NaN when there are none."""
    mask_BT = mask_BT.bool()
    count = int(mask_BT.sum())
    if count == 0:
        return float("nan")
    return float(values_BT.detach()[mask_BT].double().sum() / count)


def logprob_mismatch(
    logprobs_BT: Tensor, rollout_logprobs_BT: Tensor, loss_mask_BT: Tensor
) -> float:
    """Mean |lp - lp_roll| over mask-1 tokens (trainer vs sampler); NaN when there are none."""
    return masked_mean((logprobs_BT.detach() - rollout_logprobs_BT.detach()).abs(), loss_mask_BT)


def policy_metrics(
    loss: PolicyLoss,
    loss_mask_BT: Tensor,
    *,
    logprobs_BT: Tensor | None = None,
    rollout_logprobs_BT: Tensor | None = None,
    entropy_BT: Tensor | None = None,
) -> dict[str, float]:
    """Summary of one policy loss over the mask-1 tokens of a batch.

    Keys: `tokens`; `masked_fraction` (share whose gradient the trust region dropped; DPPO's
    `clip_ratio`); `clipped_fraction` (share the trust region acted on at all, CISPO's clipped
    tokens included); `ratio_mean/min/max`; and, when given, `logprob_mismatch`, `entropy_mean`.
    """
    mask_BT = loss_mask_BT.bool()
    ratio_T = loss.ratio_BT.detach()[mask_BT]
    empty = ratio_T.numel() == 0
    metrics = {
        "tokens": float(ratio_T.numel()),
        "masked_fraction": masked_mean((mask_BT & ~loss.kept_BT).double(), mask_BT),
        "clipped_fraction": masked_mean(loss.clipped_BT.double(), mask_BT),
        "ratio_mean": masked_mean(loss.ratio_BT, mask_BT),
        "ratio_min": float("nan") if empty else float(ratio_T.min()),
        "ratio_max": float("nan") if empty else float(ratio_T.max()),
    }
    if logprobs_BT is not None and rollout_logprobs_BT is not None:
        metrics["logprob_mismatch"] = logprob_mismatch(logprobs_BT, rollout_logprobs_BT, mask_BT)
    if entropy_BT is not None:
        metrics["entropy_mean"] = masked_mean(entropy_BT, mask_BT)
    return metrics
