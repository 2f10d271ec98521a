"""check_split finds shared worlds and copied prompts, and ignores shared template boilerplate."""

from __future__ import annotations

import json
import random
from pathlib import Path

from kwrl.types import Criterion, CriterionKind, Domain
from kwrl.worlds.overlap import check_split, near_duplicate_prompts, split_world_ids
from kwrl.worlds.taskdir import TaskSpec, write_task

TEMPLATE = (
    "You are supporting the deal team at {company}. Using the documents in the workspace, find "
    "the {metric} for the {segment} segment in fiscal {year}. State the figure in millions of US "
    "dollars, rounded to one decimal place, and name the file you used as your source. Do not "
    "modify any files in the workspace."
)
MEMO = (
    "Draft a two paragraph memo to the board of Halvorsen Maritime explaining why the Rotterdam "
    "terminal acquisition was delayed, citing the revised environmental permit timeline and the "
    "lender consent letter dated 3 March."
)
MEMO_REWORDED = "Please d" + MEMO[1:-1] + " 2025, and keep it short."
UNRELATED = (
    "List every change of control clause in the Brightwater supply agreement and say which of "
    "them the proposed merger with Coldharbour Foods would trigger."
)


def lookup(company: str, metric: str, segment: str, year: int) -> str:
    return TEMPLATE.format(company=company, metric=metric, segment=segment, year=year)


def make_split(
    root: Path, prompts: dict[str, tuple[str, str]], with_split_json: bool = True
) -> Path:
    """prompts: task id -> (world id, instruction)."""
    rubric = (Criterion("c1", CriterionKind.ANSWER_TEXT, "Names it.", params={"any_of": ["x"]}),)
    for task_id, (world_id, instruction) in prompts.items():
        world = root / "worlds" / world_id
        (world / "files").mkdir(parents=True, exist_ok=True)
        spec = TaskSpec(task_id, instruction, rubric, Domain.BANKING, 1, "test.t", world_id, "x")
        write_task(spec, root / "tasks", world)
    if with_split_json:
        worlds = sorted({w for w, _ in prompts.values()})
        meta = {"split": root.name, "seed": 0, "worlds": worlds, "tasks": sorted(prompts)}
        (root / "split.json").write_text(json.dumps(meta))
    return root


def train_and_test(tmp_path: Path, with_split_json: bool = True) -> tuple[Path, Path]:
    train = {
        "tr-lookup-1": ("acme", lookup("Acme Holdings", "revenue", "EMEA", 2023)),
        "tr-lookup-2": ("acme", lookup("Acme Holdings", "EBITDA", "Americas", 2022)),
        "tr-lookup-3": ("borealis", lookup("Borealis Capital", "gross margin", "Retail", 2024)),
        "tr-lookup-4": ("borealis", lookup("Borealis Capital", "revenue", "Wholesale", 2021)),
        "tr-memo": ("halvorsen", MEMO),
    }
    test = {
        "te-lookup-1": ("cobalt", lookup("Cobalt Partners", "revenue", "APAC", 2023)),
        "te-lookup-2": ("cobalt", lookup("Cobalt Partners", "operating income", "Energy", 2020)),
        "te-lookup-3": ("halvorsen", lookup("Halvorsen Maritime", "revenue", "Ports", 2022)),
        "te-memo": ("cobalt", MEMO_REWORDED),
        "te-clauses": ("cobalt", UNRELATED),
    }
    return (
        make_split(tmp_path / "train", train, with_split_json),
        make_split(tmp_path / "test", test, with_split_json),
    )


def test_check_split_finds_the_shared_world_and_the_copied_prompt_only(tmp_path: Path) -> None:
    train, test = train_and_test(tmp_path)
    result = check_split(train, test)
    assert result.shared_worlds == ("halvorsen",)
    assert [(p.task_a, p.task_b) for p in result.near_duplicates] == [("tr-memo", "te-memo")]
    pair = result.near_duplicates[0]
    assert 0.8 < pair.similarity <= 1.0 and 0.0 < pair.jaccard <= pair.similarity
    assert (result.n_tasks_a, result.n_tasks_b) == (5, 5)
    assert not result.clean


def test_world_ids_fall_back_to_task_metadata_without_split_json(tmp_path: Path) -> None:
    train, test = train_and_test(tmp_path, with_split_json=False)
    assert split_world_ids(train) == {"acme", "borealis", "halvorsen"}
    assert check_split(train, test).shared_worlds == ("halvorsen",)


def test_same_template_prompts_about_different_companies_are_not_duplicates() -> None:
    companies = [f"Company{i} Group" for i in range(12)]
    prompts_a = {f"a{i}": lookup(c, "revenue", "EMEA", 2023) for i, c in enumerate(companies[:8])}
    prompts_b = {f"b{i}": lookup(c, "revenue", "EMEA", 2023) for i, c in enumerate(companies[8:])}
    assert near_duplicate_prompts(prompts_a, prompts_b) == []


def test_identical_prompts_are_reported_even_when_they_are_all_boilerplate() -> None:
    prompts_a = {f"a{i}": MEMO for i in range(4)}
    pairs = near_duplicate_prompts(prompts_a, {"b": MEMO})
    assert [(p.task_a, p.similarity) for p in pairs] == [(f"a{i}", 1.0) for i in range(4)]


def test_a_copied_prompt_is_found_among_2000_by_500_prompts() -> None:
    rng = random.Random(0)
    vocabulary = [f"w{i}" for i in range(3000)]

    def prompt() -> str:
        return " ".join(rng.choice(vocabulary) for _ in range(80))

    prompts_a = {f"a{i}": prompt() for i in range(2000)}
    prompts_b = {f"b{i}": prompt() for i in range(500)}
    prompts_b["b-copy"] = prompts_a["a7"] + " and one more line"
    pairs = near_duplicate_prompts(prompts_a, prompts_b)
    assert [(p.task_a, p.task_b) for p in pairs] == [("a7", "b-copy")]


def test_the_same_question_about_another_company_is_not_a_duplicate_but_a_copy_is() -> None:
    ask = "What EBITDA did {} Logistics's Energy segment generate in Q3 2024? I need it in USD."
    prompts_a = {"a": ask.format("Dunmore")}
    assert near_duplicate_prompts(prompts_a, {"b": ask.format("Silverline")}) == []
    copied = {"b": ask.format("Dunmore").replace("I need it", "I need the figure")}
    assert [p.task_b for p in near_duplicate_prompts(prompts_a, copied)] == ["b"]
