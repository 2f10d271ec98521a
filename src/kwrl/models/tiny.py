"""The embedded default policy: a tiny Qwen3, built from nothing, saved like any HF checkpoint.

Nothing can be downloaded here, so kwrl builds its own model: a tokenizer trained on generated
worlds (`kwrl.models.tokenizer`) and a randomly initialised `Qwen3ForCausalLM` in the shape that
learned fastest on this CPU (FACTS.md: hidden 128, 2 layers, 4 heads of 32, tied embeddings,
~0.66M parameters with a 1k vocabulary). `init_model` writes both with `save_pretrained`
(safetensors, `config.json`, `generation_config.json`, `tokenizer.json`, `chat_template.jinja`),
so everything downstream loads it through the Auto classes exactly as it would load Qwen3-8B.
Weights depend only on the seed and the vocabulary size: the same call writes the same tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from kwrl.models.chat_template import ENDOFTEXT, IM_END
from kwrl.models.corpus import world_corpus
from kwrl.models.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer

MANIFEST = "kwrl_model.json"
"""Written next to the weights: how the checkpoint was built. No timings, so that two builds
from the same inputs are byte-identical."""


def build_model(
    tokenizer: PreTrainedTokenizerBase,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    head_dim: int = 32,
    intermediate: int = 512,
    kv_heads: int | None = None,
    max_positions: int = 4096,
    rope_theta: float = 10_000.0,
    seed: int = 0,
) -> Qwen3ForCausalLM:
    """A randomly initialised fp32 Qwen3 whose vocabulary is `tokenizer`'s, deterministic in seed.

    `intermediate` is 4x hidden (Qwen3 uses ~3x at scale; at this size the MLP is cheap and the
    0.66M-parameter shape is the one measured in FACTS.md). `kv_heads` defaults to `heads` (no
    grouped-query attention: with 4 heads there is little cache to save). Stop ids are Qwen3
    instruct's: `<|im_end|>` ends a turn, `<|endoftext|>` a document; `<|endoftext|>` pads.
    """
    stop_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=stop_ids,
        pad_token_id=stop_ids[1],
    )
    # Initialisation draws from torch's global generator: fork it so the caller's stream is
    # untouched and the weights depend on `seed` alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=stop_ids, pad_token_id=stop_ids[1], bos_token_id=None
    )
    return model.eval()


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def init_model(
    out: Path,
    texts: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    **model_kwargs: Any,
) -> Path:
    """Build the tokenizer (on `texts`, or on a freshly generated world corpus) and the model,
    and save both under `out`, which must be empty or absent. Returns `out`.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose a new output directory")
    corpus = list(texts) if texts is not None else world_corpus(seed=seed)
    tokenizer = build_tokenizer(corpus, vocab_size=vocab_size)
    model = build_model(tokenizer, seed=seed, **model_kwargs)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {
        "builder": "kwrl.models.init_model",
        "seed": seed,
        "vocab_size": len(tokenizer),
        "parameters": parameter_count(model),
        "corpus": {"texts": len(corpus), "characters": sum(map(len, corpus)),
                   "source": "given" if texts is not None else "world_corpus"},
        "model": {"hidden": model.config.hidden_size, "layers": model.config.num_hidden_layers,
                  "heads": model.config.num_attention_heads, "head_dim": model.config.head_dim,
                  "intermediate": model.config.intermediate_size},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out
