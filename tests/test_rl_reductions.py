"""Reductions: hand-computed values, equal weight per prompt group, and micro-batches that add up
to exactly the full batch's loss and gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kwrl.rl import (
    LOSSES,
    REDUCTION_WEIGHTS,
    REDUCTIONS,
    prompt_mean,
    reduction_weights,
    seq_mean_token_sum_norm,
    sequence_mean,
    token_mean,
    weighted_sum,
)

ATOL = 1e-12
NAN = float("nan")


def scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


# three sequences, groups 0, 0, 1; masked positions hold garbage that must not matter
LOSS = torch.tensor(
    [[1.0, 2.0, 3.0, 100.0], [4.0, NAN, -7.0, 0.0], [5.0, 6.0, 9.0, NAN]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
GROUPS = torch.tensor([0, 0, 1])


def test_token_mean_averages_all_trained_tokens() -> None:
    # (1 + 2 + 3 + 4 + 5 + 6) / 6
    torch.testing.assert_close(token_mean(LOSS, MASK), scalar(21 / 6), atol=ATOL, rtol=0)


def test_sequence_mean_averages_the_sequence_means() -> None:
    # means 2, 4, 5.5 -> 11.5 / 3
    expected = scalar(11.5 / 3)
    torch.testing.assert_close(sequence_mean(LOSS, MASK), expected, atol=ATOL, rtol=0)


def test_seq_mean_token_sum_norm_divides_the_token_sum_by_b_times_max_seq_len() -> None:
    # 21 / (3 * 10); without max_seq_len, the padded width T = 4: 21 / 12
    value = seq_mean_token_sum_norm(LOSS, MASK, max_seq_len=10)
    torch.testing.assert_close(value, scalar(0.7), atol=ATOL, rtol=0)
    default = seq_mean_token_sum_norm(LOSS, MASK)
    torch.testing.assert_close(default, scalar(1.75), atol=ATOL, rtol=0)


def test_prompt_mean_averages_token_means_of_the_groups() -> None:
    # group 0: (1 + 2 + 3 + 4) / 4 = 2.5; group 1: (5 + 6) / 2 = 5.5; mean 4
    value = prompt_mean(LOSS, MASK, GROUPS)
    torch.testing.assert_close(value, scalar(4.0), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="group_ids_B"):
        prompt_mean(LOSS, MASK)


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_rows_without_trained_tokens_change_no_reduction(name: str) -> None:
    # an error-masked trial (its own group) and a padding row join the batch
    loss = torch.cat([LOSS, torch.full((2, 4), 50.0, dtype=torch.float64)])
    mask = torch.cat([MASK, torch.zeros(2, 4, dtype=MASK.dtype)])
    groups = torch.cat([GROUPS, torch.tensor([2, 0])])
    before = REDUCTIONS[name](LOSS, MASK, GROUPS, max_seq_len=10)
    after = REDUCTIONS[name](loss, mask, groups, max_seq_len=10)
    torch.testing.assert_close(after, before, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_an_empty_batch_reduces_to_zero_with_zero_gradient(name: str) -> None:
    loss = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    value = REDUCTIONS[name](loss, torch.zeros(2, 3), torch.tensor([0, 1]))
    (grad,) = torch.autograd.grad(value, loss)
    assert value.item() == 0.0 and torch.equal(grad, torch.zeros(2, 3, dtype=torch.float64))


def group_shares(name: str, mask: torch.Tensor, groups: torch.Tensor) -> list[float]:
    """Each group's share of d(reduce(loss))/d(loss) when every token's loss is its own leaf."""
    loss = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(REDUCTIONS[name](loss, mask, groups), loss)
    return [float(grad[groups == g].sum()) for g in groups.unique()]


def test_prompt_mean_gives_every_group_equal_weight_whatever_its_lengths() -> None:
    # group 0: two 1-token sequences; group 1: three 50-token ones; group 2: one 20-token one
    lengths, groups = [1, 1, 50, 50, 50, 20], torch.tensor([0, 0, 1, 1, 1, 2])
    mask = torch.tensor([[1] * n + [0] * (50 - n) for n in lengths])
    for share in group_shares("prompt_mean", mask, groups):
        assert share == pytest.approx(1 / 3, abs=ATOL)
    # token_mean, by contrast, gives each group its share of the 172 tokens
    shares = group_shares("token_mean", mask, groups)
    assert shares == pytest.approx([2 / 172, 150 / 172, 20 / 172], abs=ATOL)


def test_weighted_sum_ignores_whatever_sits_at_weight_zero() -> None:
    weights = torch.tensor([[0.5, 0.0], [0.25, 0.0]], dtype=torch.float64)
    loss = torch.tensor([[2.0, NAN], [4.0, float("inf")]], dtype=torch.float64)
    assert weighted_sum(loss, weights).item() == 2.0


def test_unknown_reductions_and_bad_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown reduction"):
        reduction_weights("sum", MASK, GROUPS)
    with pytest.raises(ValueError, match="max_seq_len"):
        reduction_weights("seq_mean_token_sum_norm", MASK, GROUPS, max_seq_len=0)


# ---- micro-batches -----------------------------------------------------------------------------


def batch(seed: int, rows: int, tokens: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, tokens + 1, (rows,), generator=generator)
    mask = torch.arange(tokens)[None, :] < lengths[:, None]  # right-padded
    return {
        "logprobs": -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 2 - 0.01,
        "rollout": -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 2 - 0.01,
        "adv": torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(-1, tokens),
        "mask": mask,
        "groups": torch.randint(0, 3, (rows,), generator=generator),
    }


def accumulated(data, loss_name: str, reduction: str, parts: list[torch.Tensor]):
    """Loss and gradient accumulated over micro-batches `parts` (row indices) of one batch."""
    weights = reduction_weights(reduction, data["mask"], data["groups"], max_seq_len=32)
    logprobs = data["logprobs"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rows in parts:
        out = LOSSES[loss_name](
            logprobs[rows],
            data["adv"][rows],
            data["mask"][rows],
            old_logprobs_BT=data["rollout"][rows],
            rollout_logprobs_BT=data["rollout"][rows],
        )
        value = weighted_sum(out.loss_BT, weights[rows])
        value.backward()  # gradients accumulate in logprobs.grad, as in a trainer
        total = total + value.detach()
    return total, logprobs.grad


def test_averaging_per_micro_batch_token_means_would_be_wrong() -> None:
    # why full-batch weights exist: rows of 1 and 3 tokens, losses 1 and 2, 2, 2.
    # full token mean (1 + 6) / 4 = 1.75; the mean of the two micro-batch means (1 + 2) / 2 = 1.5
    loss = torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    naive = (token_mean(loss[:1], mask[:1]) + token_mean(loss[1:], mask[1:])) / 2
    weights = reduction_weights("token_mean", mask)
    sliced = weighted_sum(loss[:1], weights[:1]) + weighted_sum(loss[1:], weights[1:])
    assert naive.item() == 1.5 and sliced.item() == 1.75 == token_mean(loss, mask).item()


@pytest.mark.parametrize("reduction", sorted(REDUCTIONS))
def test_micro_batches_of_one_sequence_give_the_full_batch_loss_and_gradient(
    reduction: str,
) -> None:
    data = batch(seed=3, rows=6, tokens=7)
    full_loss, full_grad = accumulated(data, "dppo_binary_tv", reduction, [torch.arange(6)])
    loss, grad = accumulated(data, "dppo_binary_tv", reduction, list(torch.arange(6)[:, None]))
    torch.testing.assert_close(loss, full_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(grad, full_grad, atol=ATOL, rtol=0)
    # and the accumulated value is the reduction itself, applied to the whole batch
    out = LOSSES["dppo_binary_tv"](
        data["logprobs"], data["adv"], data["mask"], rollout_logprobs_BT=data["rollout"]
    )
    direct = REDUCTIONS[reduction](out.loss_BT, data["mask"], data["groups"], max_seq_len=32)
    torch.testing.assert_close(full_loss, direct, atol=ATOL, rtol=0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 8),
    st.integers(1, 10),
    st.sampled_from(sorted(REDUCTION_WEIGHTS)),
    st.sampled_from(sorted(LOSSES)),
    st.data(),
)
def test_any_partition_into_micro_batches_gives_the_full_batch_result(
    seed: int, rows: int, tokens: int, reduction: str, loss_name: str, draw
) -> None:
    data = batch(seed, rows, tokens)
    order = torch.tensor(draw.draw(st.permutations(range(rows))))
    cuts = (
        sorted(draw.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1))) if rows > 1 else []
    )
    parts = [part for part in torch.tensor_split(order, cuts) if part.numel()]
    full_loss, full_grad = accumulated(data, loss_name, reduction, [torch.arange(rows)])
    loss, grad = accumulated(data, loss_name, reduction, parts)
    torch.testing.assert_close(loss, full_loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, full_grad, atol=1e-12, rtol=0)
