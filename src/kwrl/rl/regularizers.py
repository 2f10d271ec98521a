"""Optional regularizers: KL to a reference policy and the policy's entropy, per token.

The recipe uses neither (no KL, no entropy bonus); they are here for the ablations a user of an
RL framework expects. Both return `[B, T]` per-token values, 0 where the loss mask is 0, so they
reduce with the same weights as the policy loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from kwrl.rl.losses import MAX_LOG_RATIO


def _k1(log_r_BT: Tensor) -> Tensor:
    return -log_r_BT


def _k2(log_r_BT: Tensor) -> Tensor:
    return 0.5 * log_r_BT**2


def _k3(log_r_BT: Tensor) -> Tensor:
    return torch.expm1(log_r_BT) - log_r_BT


def _abs(log_r_BT: Tensor) -> Tensor:
    return log_r_BT.abs()


KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "abs": _abs,
}
"""Per-token KL estimators as functions of log r = lp_ref - lp."""


def kl_penalty(
    logprobs_BT: Tensor,
    ref_logprobs_BT: Tensor,
    loss_mask_BT: Tensor,
    estimator: Literal["k1", "k2", "k3", "abs"] = "k3",
) -> Tensor:
    """Estimate KL(pi || pi_ref) per token, with r = pi_ref / pi and log r = lp_ref - lp.

    k1 = lp - lp_ref; k2 = (log r)^2 / 2; k3 = r - 1 - log r (SkyRL's default; >= 0);
    abs = |lp - lp_ref|. The gradient flows through `logprobs_BT`; log r is clamped to
    +-MAX_LOG_RATIO. `[B, T]`, 0 where the mask is 0.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; known: {sorted(KL_ESTIMATORS)}")
    mask_BT = loss_mask_BT.bool()
    zero = logprobs_BT.new_zeros(())
    log_r_BT = torch.where(mask_BT, ref_logprobs_BT.detach() - logprobs_BT, zero)
    kl_BT = KL_ESTIMATORS[estimator](log_r_BT.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return torch.where(mask_BT, kl_BT, zero)


def entropy_from_logits(logits_BTV: Tensor, loss_mask_BT: Tensor | None = None) -> Tensor:
    """H[i, t] = -sum_v p_v log p_v with p = softmax(logits[i, t]). `[B, T]`.

    Vocabulary entries with logit -inf (p = 0) contribute 0, with a finite gradient. Where a
    loss mask is given, H is 0 on its mask-0 positions.
    """
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    p_BTV = logp_BTV.exp()
    entropy_BT = -(p_BTV * torch.where(p_BTV > 0, logp_BTV, logp_BTV.new_zeros(()))).sum(-1)
    if loss_mask_BT is None:
        return entropy_BT
    return torch.where(loss_mask_BT.bool(), entropy_BT, entropy_BT.new_zeros(()))
