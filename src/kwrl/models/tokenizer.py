"""A byte-level BPE tokenizer trained from nothing, shaped like Qwen3's.

The tiny model must copy numbers out of documents digit by digit (FACTS.md: the recipe that
learned had one token per digit), so the pre-tokenizer is Qwen2/3's own split regex, in which
`\\p{N}` matches one digit at a time, followed by byte-level encoding without a second regex. That
choice has a second reason: transformers 5 maps `model_type: qwen3` to `Qwen2Tokenizer`, which
rebuilds exactly this pipeline (NFC, that regex, byte level) from the vocabulary and merges, so the
tokenizer tokenizes the same whichever class loads it. A `Digits` pre-tokenizer would give the
same digits here but would be silently dropped by such a rebuild.

Control tokens are Qwen3's: `<|endoftext|>` (padding), `<|im_start|>`, `<|im_end|>` (end of a
turn, the eos) as special tokens, and the tool and think tags as added non-special tokens, so
every one of them is a single id that plain text can never produce by accident of merging.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast

from kwrl.models.chat_template import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    SPECIAL_TOKENS,
    TAG_TOKENS,
)

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2/Qwen3's pre-tokenizer split: letters with one leading mark, single digits, punctuation
runs with their trailing newlines, whitespace."""
DEFAULT_VOCAB_SIZE = 1024
"""All ids included (256 bytes, 9 control tokens, merges). See `build_tokenizer`."""
MODEL_MAX_LENGTH = 4096


def bare_tokenizer() -> Tokenizer:
    """The untrained pipeline (NFC, Qwen's split, byte level), control tokens registered."""
    raw = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    raw.decoder = decoders.ByteLevel()
    register_control_tokens(raw)
    return raw


def register_control_tokens(raw: Tokenizer) -> None:
    """Mark the control tokens as added tokens: special ones, then Qwen3's non-special tags.

    BPE training re-registers every token it was given as special, so this runs again after it.
    """
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])


def _without_control_tokens(texts: Iterable[str]) -> Iterator[str]:
    """The pieces of each text between control tokens.

    `train_from_iterator` does not cut added tokens out of its input, so rendered chats would
    otherwise spend merges on spelling `<|im_start|>` and `<tool_call>` out of characters.
    """
    pattern = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *TAG_TOKENS)))
    for text in texts:
        yield from (piece for piece in pattern.split(text) if piece)


def wrap(raw: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around `raw`, with Qwen3's eos/pad and kwrl's chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
    )


def build_tokenizer(
    texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `texts` and return it with the chat template set.

    `vocab_size` counts every id. The 9 control tokens take ids 0-8, the 256 byte symbols come
    next, and merges fill the rest in order of frequency, so the result has exactly `vocab_size`
    ids unless the text runs out of pairs seen `min_frequency` times first. On kwrl's generated
    worlds that happens between ~1.8k (70k characters) and ~2.4k ids (290k characters); 1024 keeps
    the merges that matter (2.4 characters per token, against 2.8 at exhaustion) and keeps the
    tied embedding of a 128-wide model at 131k parameters.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} cannot hold the 256 bytes and control tokens")
    raw = bare_tokenizer()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *TAG_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer gives the control tokens ids 0-8, ahead of the bytes and merges.
    raw.train_from_iterator(_without_control_tokens(texts), trainer)
    register_control_tokens(raw)
    return wrap(raw)
