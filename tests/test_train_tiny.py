"""The embedded default policy's build, end to end on a few tasks and steps."""

from __future__ import annotations

import json
from pathlib import Path

from kwrl.models import load_model, read_harness_profile
from kwrl.train.tiny import build_tiny_policy
from kwrl.worlds.split import generate_split


def test_the_tiny_policy_builds_loads_and_records_how(tmp_path: Path) -> None:
    split = generate_split("train", 6, 4, tmp_path / "split", files_per_world=30)
    out = build_tiny_policy(tmp_path / "policy", split, steps=2, drill_steps=2, batch_size=2,
                            vocab_size=512, seed=3)
    model, tokenizer = load_model(out, device="cpu")
    assert model.config.model_type == "qwen3" and len(tokenizer) >= 512
    record = json.loads((out / "sft.json").read_text())
    assert record["base_model"] == "kwrl model init (vocab 512, seed 3)"
    assert record["config"]["drill_steps"] == 2 and len(record["losses"]) == 4
    profile = read_harness_profile(out)
    assert profile is not None and profile.tool_detail == "brief"
