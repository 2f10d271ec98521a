"""Regularizers: KL estimators to a reference policy and entropy from logits, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from kwrl.rl import entropy_from_logits, kl_penalty

ATOL = 1e-12


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_kl_estimators_match_their_formulas() -> None:
    # lp = log .5, lp_ref = log .25: log r = log(.25/.5) = -ln 2, r = .5
    # k1 = ln 2; k2 = (ln 2)^2 / 2; k3 = .5 - 1 + ln 2; abs = ln 2; masked token: 0
    lp, ref, mask = rows([math.log(0.5)] * 2), rows([math.log(0.25)] * 2), torch.tensor([[1, 0]])
    ln2 = math.log(2.0)
    expected = {"k1": ln2, "k2": ln2**2 / 2, "k3": ln2 - 0.5, "abs": ln2}
    for estimator, value in expected.items():
        kl = kl_penalty(lp, ref, mask, estimator=estimator)
        torch.testing.assert_close(kl, rows([value, 0.0]), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(lp, ref, mask, estimator="k4")


def test_the_k3_gradient_is_one_minus_r() -> None:
    # d/dlp (r - 1 - log r) with log r = lp_ref - lp: -r + 1 = .5
    lp = rows([math.log(0.5)]).requires_grad_(True)
    (grad,) = torch.autograd.grad(
        kl_penalty(lp, rows([math.log(0.25)]), torch.ones(1, 1)).sum(), lp
    )
    torch.testing.assert_close(grad, rows([0.5]), atol=ATOL, rtol=0)


def test_entropy_from_logits() -> None:
    # uniform over 4: ln 4; logits (0, ln 3) -> p (.25, .75): -(.25 ln .25 + .75 ln .75);
    # one finite logit among -inf: 0, with a finite gradient
    inf = float("inf")
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -inf, -inf], [1.0, -inf, -inf, -inf]]],
        dtype=torch.float64,
        requires_grad=True,
    )
    entropy = entropy_from_logits(logits)
    expected = rows([math.log(4.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0])
    torch.testing.assert_close(entropy, expected, atol=ATOL, rtol=0)
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(grad).all()
    masked = entropy_from_logits(logits, torch.tensor([[1, 0, 1]]))
    torch.testing.assert_close(masked, expected * rows([1.0, 0.0, 1.0]), atol=ATOL, rtol=0)
