"""Copy augmentation: the answer's copied figures are redrawn everywhere on the tape, nothing else
changes, and a tokenizer that merges digits is refused."""

from __future__ import annotations

import random

import pytest

from kwrl.models import build_tokenizer
from kwrl.models.corpus import sample_corpus
from kwrl.train.augment import (
    CopyAugment,
    answer_drill,
    digit_token_ids,
    number_spans,
    randomize_copied_numbers,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(sample_corpus())


def _tape(tokenizer, context: str, answer: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    before = tokenizer.encode(context, add_special_tokens=False)
    after = tokenizer.encode(answer, add_special_tokens=False)
    return tuple(before + after), tuple([0] * len(before) + [1] * len(after))


def test_copied_figures_are_redrawn_consistently_and_the_rest_is_kept(tokenizer):
    digits, separators = digit_token_ids(tokenizer)
    context = ("Report Q2 page 1: Revenue ($m)=100.4 | EBITDA ($m)=22.0 | Staff=1,250\n"
               "commentary: revenue of $100.4m.\n")
    ids, mask = _tape(tokenizer, "FY 2025 " + context, "2025 revenue was $100.4m, EBITDA 31.5.")
    seen = set()
    for seed in range(20):
        new = randomize_copied_numbers(ids, mask, digits, separators, random.Random(seed))
        text = tokenizer.decode(list(new))
        assert len(new) == len(ids)
        figure = text.split("Revenue ($m)=")[1].split(" ")[0]
        seen.add(figure)
        assert len(figure) == 5 and figure[3] == "." and figure[0] != "0"
        # every occurrence of the copied figure moved together; the rest is untouched
        assert text.count(figure) == 3
        assert "EBITDA ($m)=22.0" in text and "Staff=1,250" in text and "Q2 page 1" in text
        assert text.count("2025") == 2  # a year stays
        assert text.endswith("EBITDA 31.5.")  # computed, not copied: left alone
    assert len(seen) > 15


def test_a_tape_without_copied_figures_is_returned_unchanged(tokenizer):
    digits, separators = digit_token_ids(tokenizer)
    ids, mask = _tape(tokenizer, "The call is on Monday.\n", "On Monday, 12 January.")
    assert randomize_copied_numbers(ids, mask, digits, separators, random.Random(0)) == ids


def test_number_spans_join_digits_across_single_separators(tokenizer):
    digits, separators = digit_token_ids(tokenizer)
    ids = tokenizer.encode("x=1,250.5, then 7. End 42", add_special_tokens=False)
    spans = [tokenizer.decode(ids[a:b]) for a, b in number_spans(ids, digits, separators)]
    assert spans == ["1,250.5", "7", "42"]


def test_a_tokenizer_that_merges_digits_is_refused():
    class Merging:
        def encode(self, text, add_special_tokens=False):
            return [hash(text) % 1000]  # one token for any string

    with pytest.raises(ValueError, match="merges digits"):
        digit_token_ids(Merging())


def test_a_drill_is_the_question_and_the_last_call_result_and_answer(tokenizer):
    turns = ["<|im_start|>system\nYou are an analyst.<|im_end|>\n",
             "<|im_start|>user\nRevenue of Retail?<|im_end|>\n",
             "<|im_start|>assistant\nfind files<|im_end|>\n",
             "<|im_start|>user\n<tool_response>\n3 files\n</tool_response><|im_end|>\n",
             "<|im_start|>assistant\nsearch Retail<|im_end|>\n",
             "<|im_start|>user\n<tool_response>\nRetail=45.5\n</tool_response><|im_end|>\n",
             "<|im_start|>assistant\nRetail revenue was $45.5m.<|im_end|>\n"]
    ids, mask = [], []
    for k, turn in enumerate(turns):
        encoded = tokenizer.encode(turn, add_special_tokens=False)
        ids += encoded
        mask += [int(k in (2, 4, 6))] * len(encoded)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    drill_ids, drill_mask = answer_drill(ids, mask, start)
    assert tokenizer.decode(list(drill_ids)) == "".join(turns[1:2] + turns[4:])
    trained = [t for t, m in zip(drill_ids, drill_mask, strict=True) if m]
    assert tokenizer.decode(trained) == turns[6]
    assert answer_drill(ids[:len(ids) // 3], mask[:len(ids) // 3], start) is None  # no call


def test_staged_sft_trains_on_drills_then_tapes_and_needs_its_inputs(tokenizer):
    from kwrl.models import build_model
    from kwrl.train.sft import SftConfig, SftExample, train_sft

    text = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nRevenue?<|im_end|>\n"
            "<|im_start|>assistant\ncall<|im_end|>\n<|im_start|>user\nRevenue=12.5<|im_end|>\n")
    answer = "<|im_start|>assistant\n$12.5m<|im_end|>\n"
    ids, mask = _tape(tokenizer, text, answer)
    example = SftExample(ids, mask)
    model = build_model(tokenizer, seed=0)
    config = SftConfig(steps=3, drill_steps=2, batch_size=2, drill_batch_size=2,
                       copy_augment=1.0, warmup_steps=1)
    with pytest.raises(ValueError, match="need a CopyAugment"):
        train_sft(model, [example], config, tokenizer.pad_token_id, turn_start_id=1)
    with pytest.raises(ValueError, match="turn_start_id"):
        train_sft(model, [example], config, tokenizer.pad_token_id,
                  augment=CopyAugment.for_tokenizer(tokenizer))
    seen = []
    losses = train_sft(model, [example], config, tokenizer.pad_token_id,
                       on_step=lambda step, loss: seen.append(step),
                       augment=CopyAugment.for_tokenizer(tokenizer),
                       turn_start_id=tokenizer.convert_tokens_to_ids("<|im_start|>"))
    assert len(losses) == 5 and seen == [0, 1, 2, 3, 4]
