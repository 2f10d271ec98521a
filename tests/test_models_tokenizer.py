"""The tiny tokenizer: one token per digit, control tokens as single ids, Qwen3's chat format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer

from kwrl.models import build_tokenizer
from kwrl.models.chat_template import SPECIAL_TOKENS, TAG_TOKENS
from kwrl.models.corpus import EXAMPLE_TOOLS, render_chat, sample_corpus, world_corpus

CONTROL = (*SPECIAL_TOKENS, *TAG_TOKENS)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer(sample_corpus(), vocab_size=512)


def ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_every_digit_is_its_own_token(tok: PreTrainedTokenizerFast) -> None:
    digit = {str(d): tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    assert ids(tok, "4512") == [digit["4"], digit["5"], digit["1"], digit["2"]]
    pieces = tok.convert_ids_to_tokens(ids(tok, "Revenue was $4,512.3m in Q3 2025"))
    numeric = [p for p in pieces if any(c.isdigit() for c in p)]
    assert numeric == ["4", "5", "1", "2", "3", "3", "2", "0", "2", "5"]


def test_control_tokens_take_ids_0_to_8_and_encode_to_one_id(tok: PreTrainedTokenizerFast) -> None:
    assert [tok.convert_tokens_to_ids(t) for t in CONTROL] == list(range(9))
    for k, token in enumerate(CONTROL):
        assert ids(tok, token) == [k]
        assert ids(tok, f"a{token}b")[1:-1] == [k]


def test_eos_is_im_end_and_padding_is_endoftext_as_in_qwen3(tok: PreTrainedTokenizerFast) -> None:
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert tok.bos_token is None


def test_tags_survive_decoding_without_special_tokens(tok: PreTrainedTokenizerFast) -> None:
    text = "<|im_start|><think>x</think><tool_call><|im_end|>"
    assert tok.decode(ids(tok, text), skip_special_tokens=True) == "<think>x</think><tool_call>"
    assert tok.decode(ids(tok, text)) == text


def test_plain_text_never_merges_into_a_control_token(tok: PreTrainedTokenizerFast) -> None:
    for text in ("<|im_start", "im_end|>", "<tool_call", "think>", "<|endoftext"):
        assert not set(ids(tok, text)) & set(range(9)), text


def test_the_vocabulary_has_exactly_the_requested_size_and_is_reproducible() -> None:
    first = build_tokenizer(sample_corpus(), vocab_size=300)
    second = build_tokenizer(sample_corpus(), vocab_size=300)
    assert len(first) == 300
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    with pytest.raises(ValueError, match="cannot hold"):
        build_tokenizer(sample_corpus(), vocab_size=200)


def test_the_template_renders_qwen3_chatml_with_tools_calls_and_responses(
    tok: PreTrainedTokenizerFast,
) -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": "é"}}},
            {"type": "function", "function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "content": "one\ntwo"},
        {"role": "tool", "content": "3"},
    ]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False,
                                   add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools>"
        ' XML tags:\n<tools>\n{"type": "function", "function": {"name": "f", "description": "d", '
        '"parameters": {}}}\n</tools>\n\nFor each function call, return a json object with '
        "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nHi<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "f", "arguments": {"a": 1, '
        '"b": "é"}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\none\ntwo\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_without_tools_the_system_turn_is_plain_and_thinking_can_be_switched_off(
    tok: PreTrainedTokenizerFast,
) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def conversation() -> list[dict]:
    call = {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.pdf"}}}
    return [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": "<think>\nLook in a.pdf.\n</think>\n",
         "tool_calls": [call]},
        {"role": "tool", "content": "page 1\nRevenue 4,512"},
        {"role": "tool", "content": "page 2"},
        {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nIt is 4,512."},
        {"role": "user", "content": "And EBITDA?"},
        {"role": "assistant", "reasoning_content": "Same file.", "content": "1,200."},
    ]


def test_rendering_one_more_message_only_appends(tok: PreTrainedTokenizerFast) -> None:
    messages = conversation()
    for k in range(1, len(messages)):
        shorter = render_chat(messages[:k], EXAMPLE_TOOLS)
        longer = render_chat(messages[: k + 1], EXAMPLE_TOOLS)
        assert longer.startswith(shorter), k
        assert ids(tok, longer)[: len(ids(tok, shorter))] == ids(tok, shorter), k


def test_earlier_think_blocks_are_kept(tok: PreTrainedTokenizerFast) -> None:
    text = render_chat(conversation(), [])
    assert "<|im_start|>assistant\n<think>\nLook in a.pdf.\n</think>\n\n<tool_call>" in text
    assert "<think>\nGot it.\n</think>\n\nIt is 4,512.<|im_end|>" in text
    assert "<|im_start|>assistant\n<think>\nSame file.\n</think>\n\n1,200.<|im_end|>" in text


def test_saved_tokenizer_loads_with_auto_tokenizer_template_included(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.chat_template == tok.chat_template
    text = render_chat(conversation(), EXAMPLE_TOOLS) + "Café 12,345.6 <|endoftext|>"
    assert ids(loaded, text) == ids(tok, text)
    assert loaded.apply_chat_template(conversation(), tokenize=False) == render_chat(
        conversation(), [])
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_loading_it_as_qwen2tokenizer_which_rebuilds_the_pipeline_changes_nothing(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    # transformers 5 maps `model_type: qwen3` to Qwen2Tokenizer, which rebuilds Qwen's
    # pre-tokenizer from vocab and merges; ours is that pipeline, so the ids agree.
    tok.save_pretrained(tmp_path)
    rebuilt = Qwen2Tokenizer.from_pretrained(tmp_path)
    text = render_chat(conversation(), EXAMPLE_TOOLS) + "Café 12,345.6 <|endoftext|>"
    assert ids(rebuilt, text) == ids(tok, text)


def test_world_corpus_holds_documents_instructions_and_rendered_tool_chats() -> None:
    texts = world_corpus(n_tasks=15, files_per_world=30)
    chats = [t for t in texts if t.startswith("<|im_start|>system\n")]
    assert len(chats) == 15
    assert all('<tool_call>\n{"name": "' in c and "<tool_response>\n" in c for c in chats)
    assert sum(len(t) for t in texts if t not in chats) > 20_000
