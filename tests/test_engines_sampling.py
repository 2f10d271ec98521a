"""Sampling math: the reported logprob is that of the distribution actually sampled from."""

from __future__ import annotations

import math

import torch

from kwrl.engines.sampling import processed_logprobs, request_uniforms, sample, top_p_filter

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0]])


def test_top_p_keeps_the_smallest_nucleus_whose_mass_reaches_p() -> None:
    # probabilities: 0.644, 0.237, 0.087, 0.032 -> 0.644 + 0.237 = 0.881 >= 0.8
    filtered = top_p_filter(LOGITS, torch.tensor([0.8]))
    assert filtered[0, :2].tolist() == [2.0, 1.0]
    assert filtered[0, 2:].tolist() == [float("-inf"), float("-inf")]
    # p just above the top token's mass keeps two tokens; p below it keeps one
    assert torch.isinf(top_p_filter(LOGITS, torch.tensor([0.6]))[0, 1:]).all()


def test_top_p_one_leaves_every_logit_alone_even_beside_a_filtered_row() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -200.0], [2.0, 1.0, 0.0, -1.0]])
    filtered = top_p_filter(logits, torch.tensor([1.0, 0.5]))
    assert torch.equal(filtered[0], logits[0])  # a zero-probability token is kept at p = 1
    assert filtered[1].isinf().sum() == 3


def test_processed_logprobs_match_a_hand_computation_for_temperature_and_top_p() -> None:
    temperature, top_p = 0.5, 0.9
    scaled = [x / temperature for x in LOGITS[0].tolist()]  # 4, 2, 0, -2
    probs = [math.exp(x) for x in scaled]
    total = sum(probs)
    # 0.867 < 0.9 <= 0.867 + 0.117: the nucleus is the top two tokens, renormalised
    kept = [math.log(p / (probs[0] + probs[1])) for p in probs[:2]]
    assert probs[0] / total < top_p <= (probs[0] + probs[1]) / total
    got = processed_logprobs(LOGITS, torch.tensor([temperature]), torch.tensor([top_p]))[0]
    assert torch.allclose(got[:2], torch.tensor(kept), atol=1e-6)
    assert got[2:].isinf().all()


def test_temperature_one_and_top_p_one_give_the_models_own_log_softmax() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    got = processed_logprobs(logits, torch.ones(3), torch.ones(3))
    assert torch.equal(got, torch.log_softmax(logits, dim=-1))


def test_greedy_rows_take_the_argmax_with_their_temperature_one_logprob() -> None:
    logprobs = processed_logprobs(LOGITS, torch.tensor([0.0]), torch.tensor([1.0]))
    token, logprob = sample(logprobs, torch.tensor([0.999]), torch.tensor([True]))
    assert token.tolist() == [0]
    assert logprob.item() == torch.log_softmax(LOGITS, -1)[0, 0].item()


def test_inverse_cdf_sampling_follows_the_distribution_and_never_picks_filtered_tokens() -> None:
    logprobs = processed_logprobs(LOGITS.expand(20_000, 4), torch.ones(20_000),
                                  torch.full((20_000,), 0.8))
    tokens, chosen = sample(logprobs, request_uniforms(7, 20_000))
    counts = torch.bincount(tokens, minlength=4).double() / 20_000
    expected = logprobs[0].exp().double()
    assert counts[2:].sum() == 0
    assert (counts - expected).abs().max() < 0.015  # ~5 standard errors
    assert torch.equal(chosen, logprobs[0][tokens])


def test_a_requests_uniforms_depend_on_its_seed_alone() -> None:
    assert torch.equal(request_uniforms(3, 10), request_uniforms(3, 10))
    assert torch.equal(request_uniforms(3, 10)[:4], request_uniforms(3, 4))
    assert not torch.equal(request_uniforms(3, 10), request_uniforms(4, 10))
