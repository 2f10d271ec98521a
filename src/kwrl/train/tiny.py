"""Build the embedded default policy from nothing: the tiny model, then SFT on demonstrations.

`build_tiny_policy(out, train_dir)` is what `kwrl train` runs when its `model.path` is absent
(and what `make tiny-model` runs to make the committed checkpoint): `kwrl.models.init_model`
(tokenizer trained on generated world text, a randomly initialised tiny Qwen3), then
`kwrl.train.run_sft.run_sft` on the oracle demonstrations of `train_dir`'s tasks of `tiers`.

The recipe (measured, see the README): the 6 lookup tools shown `brief` (names and parameter
types only, ~850-token tapes), training splits with thousands of generated company names (so
names must be copied, not memorised), AdamW 3e-3, then two stages (`kwrl.train.augment`):
`drill_steps` steps of 32 answer drills (question, last call and result, answer; ~260 tokens)
whose copied figures are always redrawn, where the retrieval circuit forms; then `steps` steps of
16 whole tapes with cosine decay, half of them with their figures redrawn.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from kwrl.harness.prompt import LOOKUP_MCP_TOOLS
from kwrl.models import init_model
from kwrl.train.run_sft import run_sft


def build_tiny_policy(out: Path, train_dir: Path, *, sft: bool = True, vocab_size: int = 1024,
                      steps: int = 600, drill_steps: int = 1500, batch_size: int = 16,
                      lr: float = 3e-3, tiers: Sequence[int] = (1, 2), seed: int = 0,
                      copy_augment: float = 0.5, detours: float = 0.0,
                      console: Console | None = None) -> Path:
    """Write the tiny policy to `out` (which must be absent or empty); returns `out`."""
    out = Path(out)
    if not sft:
        return init_model(out, vocab_size=vocab_size, seed=seed)
    with tempfile.TemporaryDirectory(prefix="kwrl-tiny-") as tmp:
        base = init_model(Path(tmp) / "base", vocab_size=vocab_size, seed=seed)
        staging = Path(tmp) / "sft"
        run_sft(base, train_dir, staging, steps=steps, batch_size=batch_size, lr=lr,
                tiers=tiers, seed=seed, console=console, tools_subset=LOOKUP_MCP_TOOLS,
                tool_detail="brief", copy_augment=copy_augment, drill_steps=drill_steps,
                detours=detours)
        record = json.loads((staging / "sft.json").read_text())
        record["base_model"] = f"kwrl model init (vocab {vocab_size}, seed {seed})"  # not tmp
        (staging / "sft.json").write_text(json.dumps(record, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, out, dirs_exist_ok=True)
    return out
