"""Load a policy checkpoint from a local directory: kwrl's tiny model or any HF causal LM.

One code path for both, through the Auto classes, so that what works on the tiny model on a
laptop works on Qwen3 on a GPU. Loading never touches the network (`local_files_only`), so a
missing file fails at once with the path in the message instead of hanging on a download.
Precision follows FACTS.md: fp32 on CPU (no bf16 units there: bf16 matmuls run ~400x slower),
bf16 on CUDA.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(
    path: Path | str,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model in eval mode on `device`, tokenizer) from a local checkpoint directory."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    return model.to(device).eval(), tokenizer


HARNESS_FILE = "kwrl_harness.json"
"""Written beside a fine-tuned checkpoint: the tools and schema detail it was trained to use."""


@dataclass(frozen=True)
class HarnessProfile:
    """What the model saw in training, so that evaluation and RL show it the same prompt."""

    tools: tuple[str, ...] | None
    """The tool subset shown (None: all of the harness's tools)."""
    tool_detail: str
    """`full`, `compact` or `brief` (see `kwrl.harness.prompt.tool_schema`)."""


def write_harness_profile(path: Path | str, profile: HarnessProfile) -> None:
    data = {"tools": None if profile.tools is None else list(profile.tools),
            "tool_detail": profile.tool_detail}
    (Path(path) / HARNESS_FILE).write_text(json.dumps(data, indent=1) + "\n")


def read_harness_profile(path: Path | str) -> HarnessProfile | None:
    """The checkpoint's profile, or None when it has none (a base model, any HF checkpoint)."""
    file = Path(path) / HARNESS_FILE
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
        tools = data["tools"]
        return HarnessProfile(None if tools is None else tuple(map(str, tools)),
                              str(data["tool_detail"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{file} is not a harness profile: {exc}") from exc
