"""Reductions: per-token losses `[B, T]` to the scalar the optimizer minimises.

Every reduction here is linear in the per-token loss: reduce(loss) = sum_{i,t} w[i,t] * loss[i,t],
with weights w that depend only on the loss mask and the prompt groups of the FULL batch. N valid
tokens, B sequences of L_i tokens, P prompt groups of N_p tokens (SkyRL's table):

| reduction                 | w[i, t] on a mask-1 token | objective                            |
|---------------------------|---------------------------|--------------------------------------|
| `token_mean`              | 1 / N                     | mean over all tokens                 |
| `sequence_mean`           | 1 / (B * L_i)             | mean of sequence means               |
| `seq_mean_token_sum_norm` | 1 / (B * max_seq_len)     | Dr. GRPO: a constant normaliser      |
| `prompt_mean` (recipe)    | 1 / (P * N_p)             | token mean per group, mean of groups |

B and P count only sequences and groups with at least one mask-1 token, so rows that hold no
trained token (error-masked trials, padding rows) change no scale. Tokens a loss's trust region
dropped still count in N, L_i and N_p: the trust region removes gradient, not tokens.

Micro-batches. None of these reductions may be applied per micro-batch and averaged: N, L_i's
B, P and N_p are properties of the whole batch (a per-micro-batch token_mean over-weights the
tokens of short micro-batches; a per-micro-batch prompt_mean over-weights groups split across
micro-batches). Instead, compute the weights once for the full batch and slice them by row:

    weights_BT = reduction_weights("prompt_mean", loss_mask_BT, group_ids_B)   # full batch
    for rows in micro_batches:                        # any partition of the rows
        loss = LOSSES[name](..)                       # per token: row-local
        (weights_BT[rows] * loss.loss_BT).sum().backward()   # gradients accumulate

The per-token losses are row-local and the reduction is a weighted sum, so the accumulated
gradient equals the full-batch gradient exactly (up to float summation order). Weights come back
in float64: counts are integers, and 1/N in float32 would round; cast them to the loss dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kwrl.rl.groups import group_index, group_sum


def _mask64(mask_BT: Tensor) -> Tensor:
    return mask_BT.to(torch.float64)


def _num_sequences(mask_BT: Tensor) -> Tensor:
    """B: rows with at least one mask-1 token (at least 1, so an empty batch divides by 1)."""
    return (mask_BT.sum(dim=1) > 0).sum().clamp(min=1)


def token_mean_weights(
    mask_BT: Tensor, group_ids_B: Tensor | None = None, *, max_seq_len: int | None = None
) -> Tensor:
    """w[i, t] = m[i, t] / N, N = sum of the mask. `[B, T]` float64; ignores groups."""
    m_BT = _mask64(mask_BT)
    return m_BT / m_BT.sum().clamp(min=1)


def sequence_mean_weights(
    mask_BT: Tensor, group_ids_B: Tensor | None = None, *, max_seq_len: int | None = None
) -> Tensor:
    """w[i, t] = m[i, t] / (B * L_i), L_i = mask-1 tokens of row i. `[B, T]` float64."""
    m_BT = _mask64(mask_BT)
    lengths_B = m_BT.sum(dim=1)
    return m_BT / (_num_sequences(m_BT) * lengths_B.clamp(min=1))[:, None]


def seq_mean_token_sum_norm_weights(
    mask_BT: Tensor, group_ids_B: Tensor | None = None, *, max_seq_len: int | None = None
) -> Tensor:
    """w[i, t] = m[i, t] / (B * max_seq_len) (Dr. GRPO). `[B, T]` float64.

    `max_seq_len` should be the configured generation budget, constant across steps; when None
    it falls back to T, the padded width of the (full) batch.
    """
    m_BT = _mask64(mask_BT)
    length = m_BT.shape[1] if max_seq_len is None else max_seq_len
    if length <= 0:
        raise ValueError(f"max_seq_len must be positive, got {length}")
    return m_BT / (_num_sequences(m_BT) * length)


def prompt_mean_weights(
    mask_BT: Tensor, group_ids_B: Tensor | None = None, *, max_seq_len: int | None = None
) -> Tensor:
    """w[i, t] = m[i, t] / (P * N_g(i)), N_g = mask-1 tokens of group g. `[B, T]` float64.

    Each group with tokens weighs exactly 1/P, however many or long its sequences.
    """
    if group_ids_B is None:
        raise ValueError("prompt_mean needs group_ids_B")
    m_BT = _mask64(mask_BT)
    index_B, num_groups = group_index(group_ids_B)
    tokens_G = group_sum(m_BT.sum(dim=1), index_B, num_groups)
    groups = (tokens_G > 0).sum().clamp(min=1)
    return m_BT / (groups * tokens_G[index_B].clamp(min=1))[:, None]


def weighted_sum(loss_BT: Tensor, weights_BT: Tensor) -> Tensor:
    """sum_{i,t} w[i, t] * loss[i, t]; positions of weight 0 contribute exactly 0, even NaN."""
    weights_BT = weights_BT.to(loss_BT.dtype)
    kept_BT = torch.where(weights_BT != 0, loss_BT, loss_BT.new_zeros(()))
    return (kept_BT * weights_BT).sum()


def token_mean(
    loss_BT: Tensor,
    mask_BT: Tensor,
    group_ids_B: Tensor | None = None,
    *,
    max_seq_len: int | None = None,
) -> Tensor:
    """sum_{i,t} m loss / N: the mean over all mask-1 tokens."""
    return weighted_sum(loss_BT, token_mean_weights(mask_BT))


def sequence_mean(
    loss_BT: Tensor,
    mask_BT: Tensor,
    group_ids_B: Tensor | None = None,
    *,
    max_seq_len: int | None = None,
) -> Tensor:
    """(1/B) sum_i (1/L_i) sum_t m loss: the mean of per-sequence token means."""
    return weighted_sum(loss_BT, sequence_mean_weights(mask_BT))


def seq_mean_token_sum_norm(
    loss_BT: Tensor,
    mask_BT: Tensor,
    group_ids_B: Tensor | None = None,
    *,
    max_seq_len: int | None = None,
) -> Tensor:
    """sum_{i,t} m loss / (B * max_seq_len) (Dr. GRPO)."""
    weights_BT = seq_mean_token_sum_norm_weights(mask_BT, max_seq_len=max_seq_len)
    return weighted_sum(loss_BT, weights_BT)


def prompt_mean(
    loss_BT: Tensor,
    mask_BT: Tensor,
    group_ids_B: Tensor | None = None,
    *,
    max_seq_len: int | None = None,
) -> Tensor:
    """(1/P) sum_g (sum of m loss over group g) / N_g: token mean per group, mean over groups."""
    return weighted_sum(loss_BT, prompt_mean_weights(mask_BT, group_ids_B))


WeightsFn = Callable[..., Tensor]
REDUCTION_WEIGHTS: dict[str, WeightsFn] = {
    "token_mean": token_mean_weights,
    "sequence_mean": sequence_mean_weights,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm_weights,
    "prompt_mean": prompt_mean_weights,
}
"""Full-batch weights by name: `fn(mask_BT, group_ids_B, *, max_seq_len=None) -> [B, T]`."""

ReductionFn = Callable[..., Tensor]
REDUCTIONS: dict[str, ReductionFn] = {
    "token_mean": token_mean,
    "sequence_mean": sequence_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
    "prompt_mean": prompt_mean,
}
"""Reductions by name: `fn(loss_BT, mask_BT, group_ids_B, *, max_seq_len=None) -> scalar`."""


def reduction_weights(
    name: str, mask_BT: Tensor, group_ids_B: Tensor | None = None, *, max_seq_len: int | None = None
) -> Tensor:
    """The full-batch weights `[B, T]` of the reduction called `name` (see module docstring)."""
    if name not in REDUCTION_WEIGHTS:
        raise ValueError(f"unknown reduction {name!r}; known: {sorted(REDUCTION_WEIGHTS)}")
    return REDUCTION_WEIGHTS[name](mask_BT, group_ids_B, max_seq_len=max_seq_len)
