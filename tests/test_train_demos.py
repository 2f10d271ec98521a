"""Demonstrations are oracle plans replayed through the real harness: right, and in the exact
format the policy samples in (scripted turns at mask 1, everything else at mask 0)."""

from __future__ import annotations

import pytest

from kwrl.harness.loop import Limits
from kwrl.harness.prompt import SMALL_MCP_TOOLS
from kwrl.models import build_tokenizer
from kwrl.models.corpus import sample_corpus
from kwrl.render import ChatTemplateRenderer
from kwrl.tools.host import ToolHost
from kwrl.train.demos import build_demonstrations, plan_turns
from kwrl.worlds.split import generate_split
from kwrl.worlds.taskdir import task_dirs


@pytest.fixture(scope="module")
def renderer():
    return ChatTemplateRenderer(build_tokenizer(sample_corpus()))


def test_every_task_gives_a_demonstration_whose_sampled_tokens_are_the_plan(renderer, tmp_path):
    split = generate_split("train", 6, 4, tmp_path / "split", files_per_world=30)
    with ToolHost() as host:
        demos = build_demonstrations(split, renderer, host, Limits(context_window=1 << 15,
                                                                   nudge_at=None),
                                     SMALL_MCP_TOOLS)
    assert len(demos.examples) == 6 and not demos.skipped
    tokenizer = renderer.tokenizer
    for task_id, example in zip(demos.task_ids, demos.examples, strict=True):
        turns = plan_turns(split / "tasks" / task_id)
        sampled = [t for t, m in zip(example.token_ids, example.loss_mask, strict=True) if m]
        expected = [i for turn in turns for i in (*tokenizer.encode(turn), tokenizer.eos_token_id)]
        assert sampled == expected
        assert example.loss_mask[0] == 0 and sum(example.loss_mask) < len(example.loss_mask)


def test_tier_filtering_counts_what_it_skips(renderer, tmp_path):
    split = generate_split("train", 6, 4, tmp_path / "split", files_per_world=30)
    with ToolHost() as host:
        demos = build_demonstrations(split, renderer, host, Limits(context_window=1 << 15,
                                                                   nudge_at=None),
                                     SMALL_MCP_TOOLS, tiers=(1, 2))
    assert len(demos.examples) + sum(demos.skipped.values()) == len(task_dirs(split))
    assert all(reason.startswith("tier ") for reason in demos.skipped)
