"""Advantages: group baselines computed by hand, masked trials excluded, groups summing to zero."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kwrl.rl import (
    ADVANTAGES,
    broadcast_to_tokens,
    grpo_advantages,
    maxrl_advantages,
    rloo_advantages,
)

ATOL = 1e-12


def f64(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values)


def test_dr_grpo_subtracts_each_groups_mean_whatever_the_order_of_its_members() -> None:
    # group 7 = rewards 1, 0, .5, .5 (mean .5); group 3 = 1, 1, 0 (mean 2/3); interleaved.
    rewards = f64(1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.5)
    groups = ids(7, 3, 7, 3, 7, 3, 7)
    expected = f64(0.5, 1 / 3, -0.5, 1 / 3, 0.0, -2 / 3, 0.0)
    torch.testing.assert_close(grpo_advantages(rewards, groups), expected, atol=ATOL, rtol=0)


def test_grpo_with_std_divides_by_the_unbiased_group_std() -> None:
    # deviations .5, -.5, 0, 0: sum of squares .5, over n-1 = 3 -> var 1/6, std sqrt(1/6).
    rewards, groups = f64(1.0, 0.0, 0.5, 0.5), ids(0, 0, 0, 0)
    std = math.sqrt(1 / 6)
    expected = f64(0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0)
    advantages = grpo_advantages(rewards, groups, norm_by_std=True)
    torch.testing.assert_close(advantages, expected, atol=ATOL, rtol=0)


def test_a_group_with_one_reward_gets_zero_advantage_with_or_without_std() -> None:
    rewards, groups = f64(1.0, 1.0, 1.0, 0.3), ids(0, 0, 0, 1)
    for norm_by_std in (False, True):
        advantages = grpo_advantages(rewards, groups, norm_by_std=norm_by_std)
        assert torch.equal(advantages, torch.zeros(4, dtype=torch.float64))


def test_masked_trials_get_no_advantage_and_stay_out_of_their_groups_mean() -> None:
    # the error trial's reward is NaN: valid rewards 1, 0, 1 have mean 2/3.
    rewards = f64(1.0, 0.0, float("nan"), 1.0)
    valid = torch.tensor([True, True, False, True])
    expected = f64(1 / 3, -2 / 3, 0.0, 1 / 3)
    for name in ("grpo", "rloo", "maxrl"):
        advantages = ADVANTAGES[name](rewards, ids(0, 0, 0, 0), valid_B=valid)
        assert advantages[2] == 0.0 and not advantages.isnan().any(), name
    advantages = grpo_advantages(rewards, ids(0, 0, 0, 0), valid_B=valid)
    torch.testing.assert_close(advantages, expected, atol=ATOL, rtol=0)


def test_rloo_is_the_reward_minus_the_mean_of_the_others() -> None:
    # group of 4, rewards 1, 0, 0, 1: (R - .5) * 4/3; e.g. first: 1 - (0 + 0 + 1)/3 = 2/3.
    rewards, groups = f64(1.0, 0.0, 0.0, 1.0, 0.7), ids(0, 0, 0, 0, 1)
    expected = f64(2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0)
    torch.testing.assert_close(rloo_advantages(rewards, groups), expected, atol=ATOL, rtol=0)


def test_rloo_counts_only_valid_members() -> None:
    # valid rewards 1, 0, 0 (n = 3, mean 1/3): (1 - 1/3) * 3/2 = 1; (0 - 1/3) * 3/2 = -1/2.
    rewards, valid = f64(1.0, 0.0, 0.0, 1.0), torch.tensor([True, True, True, False])
    expected = f64(1.0, -0.5, -0.5, 0.0)
    advantages = rloo_advantages(rewards, ids(0, 0, 0, 0), valid_B=valid)
    torch.testing.assert_close(advantages, expected, atol=ATOL, rtol=0)


def test_maxrl_divides_by_the_group_mean() -> None:
    # mean .25: (1 - .25)/.25 = 3, (0 - .25)/.25 = -1; an all-zero group gets 0, not NaN.
    rewards, groups = f64(1.0, 0.0, 0.0, 0.0, 0.0, 0.0), ids(0, 0, 0, 0, 1, 1)
    expected = f64(3.0, -1.0, -1.0, -1.0, 0.0, 0.0)
    advantages = maxrl_advantages(rewards, groups, eps=1e-300)  # too small to move 3 or -1
    torch.testing.assert_close(advantages, expected, atol=ATOL, rtol=0)


def test_integer_rewards_give_float_advantages() -> None:
    advantages = grpo_advantages(torch.tensor([1, 0]), ids(0, 0))
    assert advantages.is_floating_point()
    torch.testing.assert_close(advantages, torch.tensor([0.5, -0.5]), atol=1e-7, rtol=0)


def test_broadcast_puts_each_sequences_advantage_on_its_trained_tokens_only() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    expected = torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]], dtype=torch.float64)
    assert torch.equal(broadcast_to_tokens(f64(2.0, -1.0), mask), expected)


@st.composite
def groups_with_rewards(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    size = sum(sizes)
    groups = torch.tensor([g for g, n in enumerate(sizes) for _ in range(n)])
    perm = torch.tensor(draw(st.permutations(range(size))))
    rewards = draw(st.lists(st.floats(0, 1), min_size=size, max_size=size))
    valid = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return torch.tensor(rewards, dtype=torch.float64)[perm], groups[perm], torch.tensor(valid)


def advantages_for(name: str, rewards, groups, valid) -> torch.Tensor:
    if name == "rloo":
        return rloo_advantages(rewards, groups, valid_B=valid)
    return grpo_advantages(rewards, groups, valid_B=valid, norm_by_std=name == "grpo")


@settings(max_examples=60, deadline=None)
@given(groups_with_rewards(), st.sampled_from(["dr_grpo", "grpo", "rloo"]))
def test_valid_advantages_of_every_group_sum_to_zero(case, name: str) -> None:
    rewards, groups, valid = case
    advantages = advantages_for(name, rewards, groups, valid)
    assert torch.all(advantages[~valid] == 0)
    for group in groups.unique():
        assert abs(float(advantages[groups == group].sum())) < 1e-9
    # an invalid trial's reward cannot move anyone's advantage
    scrambled = torch.where(valid, rewards, torch.full_like(rewards, 1e6))
    again = advantages_for(name, scrambled, groups, valid)
    torch.testing.assert_close(again, advantages, atol=1e-12, rtol=0)


def test_the_registry_names_the_estimators() -> None:
    assert ADVANTAGES == {
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "maxrl": maxrl_advantages,
    }
