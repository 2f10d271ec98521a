"""The committed tiny policy (`checkpoints/tiny-sft`, built by `make tiny-model`) loads like any HF
checkpoint, says how it was trained, and works lookup tasks through the real MCP tools."""

from __future__ import annotations

import json
from pathlib import Path

from kwrl.engines.base import SamplingParams
from kwrl.engines.local import LocalEngine
from kwrl.eval.runner import evaluate
from kwrl.harness.loop import Limits
from kwrl.harness.model_agent import ModelAgent
from kwrl.harness.prompt import LOOKUP_MCP_TOOLS
from kwrl.models import load_model, read_harness_profile
from kwrl.render import ChatTemplateRenderer
from kwrl.tools.host import ToolHost
from kwrl.tools.services import McpServices
from kwrl.train.augment import digit_token_ids
from kwrl.worlds.split import generate_split

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny-sft"


def test_the_committed_policy_loads_with_its_harness_profile_and_recipe() -> None:
    model, tokenizer = load_model(CHECKPOINT, device="cpu")
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    profile = read_harness_profile(CHECKPOINT)
    assert profile is not None
    assert profile.tools == LOOKUP_MCP_TOOLS and profile.tool_detail == "brief"
    digit_token_ids(tokenizer)  # one token per digit: what copy augmentation relies on
    record = json.loads((CHECKPOINT / "sft.json").read_text())
    assert record["config"]["drill_steps"] > 0 and record["examples"] > 1000
    assert record["losses"][-1] < 0.5


def test_the_committed_policy_works_lookup_tasks_through_the_real_tools(tmp_path) -> None:
    """Greedy, on fresh tasks: the policy calls its tools in a parseable format and answers; at
    least one answer is right (the held-out pass rate is in the README, not asserted here)."""
    model, tokenizer = load_model(CHECKPOINT, device="cpu")
    split = generate_split("test", 16, 7, tmp_path / "split", files_per_world=30, workers=1)
    limits = Limits(context_window=4096, nudge_at=None)
    with LocalEngine(model, tokenizer) as engine, ToolHost() as host:
        agent = ModelAgent(engine, ChatTemplateRenderer(tokenizer), "mcp", limits,
                           tools_subset=LOOKUP_MCP_TOOLS, tool_detail="brief",
                           sampling=SamplingParams(max_tokens=256, temperature=0.0, seed=0))
        summary = evaluate(split, agent, tmp_path / "eval", progress=False,
                           services=McpServices(host), concurrency=8, tiers=[1, 2])
    trials = [json.loads(line) for line in (tmp_path / "eval" / "trials.jsonl").open()]
    answered = [t for t in trials if t["stop_reason"] == "answered"]
    assert summary.n_errors == 0 and len(answered) >= len(trials) // 2
    assert (summary.pass_at_1 or 0.0) > 0.0
