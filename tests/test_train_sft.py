"""SFT trains on the policy's tokens only and drives their loss down on a tiny model."""

from __future__ import annotations

import random

import pytest
import torch

from kwrl.models import build_model, build_tokenizer
from kwrl.models.corpus import sample_corpus
from kwrl.train.sft import IGNORE, SftConfig, SftExample, batches, masked_loss, train_sft


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(sample_corpus())


def examples(tok) -> list[SftExample]:
    out = []
    for segment, value in (("Retail", "45.5"), ("Online", "12.25"), ("Services", "301.7")):
        prompt = tok.encode(f"<|im_start|>user\nRevenue of {segment}?<|im_end|>\n"
                            "<|im_start|>assistant\n")
        answer = tok.encode(f"{segment} revenue was ${value}m.<|im_end|>")
        out.append(SftExample(tuple(prompt + answer), (0,) * len(prompt) + (1,) * len(answer)))
    return out


def test_labels_are_the_tokens_under_mask_one_and_ignored_elsewhere(tok) -> None:
    data = examples(tok)
    ids, attention, labels = next(batches(data, 3, pad_id=0, max_len=512, rng=random.Random(0)))
    for row in range(3):
        length = int(attention[row].sum())
        kept = labels[row, :length] != IGNORE
        assert kept.sum() > 0 and bool((labels[row, length:] == IGNORE).all())
        assert bool((labels[row, :length][kept] == ids[row, :length][kept]).all())


def test_the_loss_is_cross_entropy_over_mask_one_tokens_only(tok) -> None:
    model = build_model(tok, seed=1)
    ids, attention, labels = next(batches(examples(tok), 3, 0, 512, random.Random(0)))
    loss = masked_loss(model, ids, attention, labels)
    logits = model(input_ids=ids, attention_mask=attention).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), -1)
    target = labels[:, 1:]
    keep = target != IGNORE
    manual = -logprobs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[keep].mean()
    assert loss.item() == pytest.approx(manual.item(), abs=1e-6)


def test_lm_weight_adds_the_loss_over_every_real_token(tok) -> None:
    model = build_model(tok, seed=1)
    ids, attention, labels = next(batches(examples(tok), 3, 0, 512, random.Random(0)))
    assistant = masked_loss(model, ids, attention, labels).item()
    logits = model(input_ids=ids, attention_mask=attention).logits
    logprobs = torch.log_softmax(logits[:, :-1].float(), -1)
    real = attention[:, 1:].bool()  # padding never trains
    every = -logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)[real].mean().item()
    combined = masked_loss(model, ids, attention, labels, lm_weight=0.3).item()
    assert combined == pytest.approx(assistant + 0.3 * every, abs=1e-5)


def test_sft_drives_the_answer_loss_down(tok) -> None:
    model = build_model(tok, seed=2)
    losses = train_sft(model, examples(tok), SftConfig(steps=60, batch_size=3, warmup_steps=5),
                       pad_id=tok.pad_token_id)
    assert losses[-1] < 0.2 * losses[0]
