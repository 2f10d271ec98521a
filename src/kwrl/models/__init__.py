"""Policy models: kwrl's tiny Qwen3 built from nothing, and loading any local HF checkpoint.

- `build_tokenizer`: byte-level BPE on world text, one token per digit, Qwen3's control tokens
  and a prefix-stable Qwen3 chat template (`chat_template.CHAT_TEMPLATE`).
- `build_model` / `init_model`: a randomly initialised Qwen3ForCausalLM, saved with
  `save_pretrained` so the Auto classes load it like any HF model.
- `load_model`: model and tokenizer from a local directory (tiny or real), no network.
"""

from kwrl.models.load import (
    HarnessProfile,
    load_model,
    read_harness_profile,
    write_harness_profile,
)
from kwrl.models.tiny import build_model, init_model, parameter_count
from kwrl.models.tokenizer import build_tokenizer

__all__ = [
    "HarnessProfile",
    "build_model",
    "build_tokenizer",
    "init_model",
    "load_model",
    "parameter_count",
    "read_harness_profile",
    "write_harness_profile",
]
