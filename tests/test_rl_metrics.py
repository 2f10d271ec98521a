"""Metrics: plain floats over trained tokens, NaN where there is nothing to measure."""

from __future__ import annotations

import math

import pytest
import torch

from kwrl.rl import MAX_LOGPROB_MISMATCH, dppo_binary_tv_loss, logprob_mismatch, policy_metrics

ATOL = 1e-12


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_logprob_mismatch_is_the_mean_absolute_difference_over_trained_tokens() -> None:
    # |(-1) - (-1.02)| = .02, |(-2) - (-1.96)| = .04; the masked 5.0 gap is ignored
    lp, rollout = rows([-1.0, -2.0, 0.0]), rows([-1.02, -1.96, -5.0])
    mismatch = logprob_mismatch(lp, rollout, torch.tensor([[1, 1, 0]]))
    assert mismatch == pytest.approx(0.03, abs=ATOL) and MAX_LOGPROB_MISMATCH == 0.03


def test_policy_metrics_summarise_a_dppo_update() -> None:
    # p .9 q .7 A+1: dropped (r 9/7); p .8 q .7 A+1: kept (r 8/7); third token masked
    p, q = rows([0.9, 0.8, 0.5]), rows([0.7, 0.7, 0.5])
    mask = torch.tensor([[1, 1, 0]])
    loss = dppo_binary_tv_loss(p.log(), rows([1.0, 1.0, 1.0]), mask, rollout_logprobs_BT=q.log())
    entropy = rows([1.0, 3.0, 100.0])
    metrics = policy_metrics(
        loss, mask, logprobs_BT=p.log(), rollout_logprobs_BT=q.log(), entropy_BT=entropy
    )
    expected = {
        "tokens": 2.0,
        "masked_fraction": 0.5,
        "clipped_fraction": 0.5,
        "ratio_mean": (9 / 7 + 8 / 7) / 2,
        "ratio_min": 8 / 7,
        "ratio_max": 9 / 7,
        "logprob_mismatch": (math.log(9 / 7) + math.log(8 / 7)) / 2,
        "entropy_mean": 2.0,
    }
    assert metrics == pytest.approx(expected, abs=1e-12)
    assert all(type(value) is float for value in metrics.values())


def test_metrics_of_an_empty_batch_are_nan_not_zero() -> None:
    mask = torch.zeros(1, 2)
    loss = dppo_binary_tv_loss(
        rows([-1.0, -1.0]), rows([1.0, 1.0]), mask, rollout_logprobs_BT=rows([-1.0, -1.0])
    )
    metrics = policy_metrics(loss, mask)
    assert metrics["tokens"] == 0.0
    assert all(math.isnan(metrics[key]) for key in ("masked_fraction", "ratio_mean", "ratio_max"))
