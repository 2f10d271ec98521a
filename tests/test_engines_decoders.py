"""The static decoder's shared-prefix path: grouping, the attention kernel it relies on, and
greedy continuations against a plain forward pass (identical prompts, a shared system prompt,
different lengths, rows dropped mid-batch, shared and unshared rows mixed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_engines_local import with_norm_weights
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from kwrl.engines.decoders import (
    PREFILL_TOKENS,
    StaticQwen3Decoder,
)
from kwrl.engines.prefixes import PrefixGroups, prefix_groups
from kwrl.models import build_model, build_tokenizer
from kwrl.models.corpus import sample_corpus

TOLERANCE = 1e-4
"""Decoder logprobs against a plain forward pass (measured: ~1e-6 in fp32)."""


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(sample_corpus())


def test_rows_are_grouped_to_store_the_fewest_prompt_tokens() -> None:
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9, 9]
    # identical prompts: one group, which leaves each row its last prompt token
    assert prefix_groups([a, a, a], min_shared=3) == PrefixGroups([0, 0, 0], [5])
    # a and b share 3 tokens: grouping all three saves 2 * 3, the two a's alone 1 * 5
    assert prefix_groups([a, b, a], min_shared=3) == PrefixGroups([0, 0, 0], [3])
    # a third a: the three a's alone save 2 * 5 = 10, all four together 3 * 3 = 9; b alone
    # keeps all of its prompt but the last token in the prefix cache
    assert prefix_groups([a, b, a, a], min_shared=3) == PrefixGroups([0, 1, 0, 0], [5, 6])
    # groups are numbered largest first
    c = [7, 7, 7, 7, 7]
    assert prefix_groups([c, a, a], min_shared=3) == PrefixGroups([1, 0, 0], [5, 4])


def test_no_groups_when_little_would_be_saved() -> None:
    a, b, c = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9, 9], [8] * 40
    assert prefix_groups([a, b], min_shared=4) is None  # 3 tokens in common, 4 required
    assert prefix_groups([a], min_shared=3) is None
    assert prefix_groups([a, a, [5]], min_shared=3) is None  # a one-token prompt
    # one pair among long distinct prompts saves 5 of 86 tokens
    assert prefix_groups([a, a, c, [9] * 34], min_shared=3) is None
    assert prefix_groups([a, a, c, [9] * 34], min_shared=3, min_saved=0.05) is not None


def test_the_cpu_attention_kernel_returns_the_log_sum_exp_that_merging_relies_on() -> None:
    """The shared-prefix path merges attention over two key sets through this private op's
    second output; guard its meaning across torch versions."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=generator)
               for shape in ((3, 4, 5, 32), (3, 2, 40, 32), (3, 2, 40, 32)))
    bias = torch.zeros(3, 1, 1, 40)
    bias[0, ..., 30:] = float("-inf")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias)
    k4, v4 = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k4.transpose(-1, -2) / 32 ** 0.5 + bias
    assert (lse - scores.logsumexp(-1)).abs().max() < 1e-5
    assert (out - F.scaled_dot_product_attention(q, k4, v4, attn_mask=bias)).abs().max() < 1e-5
    # two halves merged by their log-sum-exps are attention over the whole
    halves = [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k[:, :, part], v[:, :, part], 0.0, False, attn_mask=bias[..., part])
        for part in (slice(0, 17), slice(17, 40))]
    (first, first_lse), (second, second_lse) = halves
    merged = torch.lerp(second, first, torch.sigmoid(first_lse - second_lse).unsqueeze(-1))
    assert (merged - out).abs().max() < 1e-5


def greedy_worst_difference(model: PreTrainedModel, decoder: StaticQwen3Decoder,
                            batch: list[list[int]], steps: int, drops: dict[int, list[int]]
                            ) -> float:
    """Greedy continuations step by step, rows kept as `drops[step]` says (indices into the
    current rows), against one plain forward pass per sequence: the largest logprob error."""
    sequences = [list(p) for p in batch]
    rows = list(range(len(batch)))  # decoder row -> sequence
    logprobs: list[list[torch.Tensor]] = [[] for _ in batch]
    with torch.no_grad():
        logits_B_V = decoder.start(batch, steps)
        for step in range(steps):
            for row, index in enumerate(rows):
                logprobs[index].append(logits_B_V[row].log_softmax(-1))
                sequences[index].append(int(logits_B_V[row].argmax()))
            if step in drops:
                decoder.keep(torch.tensor(drops[step]))
                rows = [rows[k] for k in drops[step]]
            logits_B_V = decoder.step(torch.tensor([sequences[index][-1] for index in rows]))
        worst = 0.0
        for index, prompt in enumerate(batch):
            ids = torch.tensor([sequences[index][:-1]])
            reference = model(ids).logits[0, len(prompt) - 1:].float().log_softmax(-1)
            got = torch.stack(logprobs[index])
            worst = max(worst, (reference[: len(got)] - got).abs().max().item())
    return worst


@pytest.mark.parametrize(("layers", "kv_heads"), [(1, 4), (3, 2)])
def test_shared_prefixes_give_the_forward_pass_for_every_kind_of_batch(
    tokenizer: PreTrainedTokenizerFast, layers: int, kv_heads: int
) -> None:
    model = with_norm_weights(build_model(tokenizer, layers=layers, kv_heads=kv_heads, seed=3), 4)
    decoder = StaticQwen3Decoder(model)
    generator = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(9, len(tokenizer), (n,), generator=generator).tolist()

    question, system, long_system, long_question = tokens(120), tokens(90), tokens(300), tokens(250)
    long_batch = [long_system + tokens(n) for n in (150, 170, 200, 180)] + [long_question] * 2
    # prefixes and suffixes both fill several prefill chunks
    assert len(long_system) + len(long_question) > PREFILL_TOKENS
    assert 150 + 170 + 200 + 180 > PREFILL_TOKENS
    batches = {
        "identical": ([question] * 4, {}),
        "a shared system prompt, questions of different lengths": (
            [system + tokens(n) for n in (7, 40, 1, 25)], {}),
        "long prefixes and suffixes": (long_batch, {}),
        "shared and unshared rows, rows dropped": (
            [question, system + tokens(5), tokens(60), question, question, system + tokens(30),
             tokens(33)],
            # a group shrinks to one row, then another group goes away
            {1: [6, 0, 1, 2, 5], 3: [1, 0, 3]}),
        "identical, all but one dropped": ([question] * 3, {0: [2]}),
    }
    worst = {}
    for name, (batch, drops) in batches.items():
        decoder.share_prefixes = True
        worst[name] = greedy_worst_difference(model, decoder, batch, 6, drops)
        assert decoder.prefixes is not None, name  # it took the shared path
        # every prefix still stored is read by a kept row
        stored = len(decoder.prefixes.cache_L_G_2K_P_D[0])
        assert sorted(set(decoder.prefixes.group_B)) == list(range(stored)), name
    assert max(worst.values()) < TOLERANCE, worst


def test_a_batch_without_shared_prefixes_keeps_the_plain_path(
    tokenizer: PreTrainedTokenizerFast
) -> None:
    model = build_model(tokenizer, seed=3)
    decoder = StaticQwen3Decoder(model)
    generator = torch.Generator().manual_seed(1)
    batch = [torch.randint(9, len(tokenizer), (n,), generator=generator).tolist()
             for n in (50, 80, 20)]
    assert greedy_worst_difference(model, decoder, batch, 4, {1: [2, 0]}) < TOLERANCE
    assert decoder.prefixes is None
