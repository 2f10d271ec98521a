"""Off-policy correction: importance ratios, TIS and masks, applied in REFERENCE's order."""

from __future__ import annotations

import math

import torch

from kwrl.rl import (
    log_importance_ratio,
    off_policy_correction,
    sequence_outlier_keep,
    sequence_ratio_keep,
    sequence_tis_weights,
    token_band_keep,
    token_tis_weights,
)

ATOL = 1e-12


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def log_rho(*ratios: list[float]) -> torch.Tensor:
    """log rho for rows of ratios, as lp_old - lp_roll with lp_roll = log .5."""
    old = torch.log(0.5 * rows(*ratios))
    return log_importance_ratio(old, torch.full_like(old, math.log(0.5)), torch.ones_like(old))


# ---- importance ratios, TIS and masks ----------------------------------------------------------


def test_the_log_ratio_is_old_minus_rollout_and_zero_where_masked() -> None:
    old, rollout = rows([-1.0, -2.0, -0.5]), rows([-1.5, -1.0, float("nan")])
    mask = torch.tensor([[1, 1, 0]])
    expected = rows([0.5, -1.0, 0.0])
    assert torch.equal(log_importance_ratio(old, rollout, mask), expected)


def test_token_tis_truncates_each_ratio_at_the_cap() -> None:
    weights = token_tis_weights(log_rho([0.5, 1.0, 3.0, 3.0]), torch.tensor([[1, 1, 1, 0]]))
    torch.testing.assert_close(weights, rows([0.5, 1.0, 2.0, 0.0]), atol=ATOL, rtol=0)


def test_sequence_tis_truncates_the_product_of_a_sequences_ratios() -> None:
    # [2, 2] -> 4; [3, 3] -> 9, capped at 5; [3, masked 100] -> 3
    weights = sequence_tis_weights(
        log_rho([2.0, 2.0], [3.0, 3.0], [3.0, 100.0]), torch.tensor([[1, 1], [1, 1], [1, 0]])
    )
    torch.testing.assert_close(weights, torch.tensor([4.0, 5.0, 3.0]).double(), atol=1e-12, rtol=0)


def test_the_token_band_keeps_ratios_inside_it() -> None:
    keep = token_band_keep(log_rho([0.49, 0.51, 1.0, 1.99, 2.01]), torch.ones(1, 5), 0.5, 2.0)
    assert keep.tolist() == [[False, True, True, True, False]]


def test_a_sequence_with_one_outlier_token_is_dropped_whole() -> None:
    keep = sequence_outlier_keep(log_rho([1.0, 5e-5], [200.0, 1.0], [1e-3, 50.0]), torch.ones(3, 2))
    assert keep.tolist() == [False, False, True]


def test_sequence_masks_bound_the_geometric_mean_or_the_product() -> None:
    mask = torch.ones(3, 2)
    # geometric means: sqrt(1.005^2) = 1.005 in; sqrt(1.1 * .9) = .99499 in; 1.1 out
    geometric = log_rho([1.005, 1.005], [1.1, 0.9], [1.1, 1.1])
    assert sequence_ratio_keep(geometric, mask, "geometric", 0.99, 1.01).tolist() == [
        True,
        True,
        False,
    ]
    # products: 1.8 in [.5, 2]; 2.25 out; .25 out
    product = log_rho([1.5, 1.2], [1.5, 1.5], [0.5, 0.5])
    assert sequence_ratio_keep(product, mask, "product", 0.5, 2.0).tolist() == [True, False, False]


def test_with_nothing_enabled_the_correction_changes_nothing() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = off_policy_correction(torch.zeros(2, 3), torch.full((2, 3), -3.0), mask)
    assert torch.equal(out.keep_BT, mask.bool()) and torch.equal(out.weight_BT, mask.float())


def test_corrections_apply_in_order_each_seeing_what_the_last_kept() -> None:
    # row 0 holds an outlier (rho 1e-5): dropped whole. Row 1: rho 3 leaves the band [.5, 2],
    # so sequence TIS multiplies only 1.5 * 1.2 = 1.8. Row 2: product 1.9 * 1.9 = 3.61 > 2:
    # TIS weighs it, then the product mask [.5, 2] drops it.
    ratios = log_rho([1e-5, 1.0, 1.0], [1.5, 3.0, 1.2], [1.9, 1.9, 1.0])
    old = ratios + math.log(0.5)
    rollout = torch.full_like(old, math.log(0.5))
    out = off_policy_correction(
        old,
        rollout,
        torch.ones(3, 3),
        outlier_bounds=(1e-4, 100.0),
        token_bounds=(0.5, 2.0),
        tis="sequence",
        sequence_mask="product",
    )
    assert out.keep_BT.tolist() == [[False] * 3, [True, False, True], [False] * 3]
    expected = rows([0.0, 0.0, 0.0], [1.8, 0.0, 1.8], [0.0, 0.0, 0.0])
    torch.testing.assert_close(out.weight_BT, expected, atol=1e-12, rtol=0)


def test_token_tis_in_the_combined_correction() -> None:
    ratios = log_rho([0.5, 3.0])
    out = off_policy_correction(ratios, torch.zeros_like(ratios), torch.ones(1, 2), tis="token")
    torch.testing.assert_close(out.weight_BT, rows([0.5, 2.0]), atol=ATOL, rtol=0)
