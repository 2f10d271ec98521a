"""Worlds and splits: deterministic, complete, consistent, and disjoint between train and test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import openpyxl
import pdfplumber
import pytest

from kwrl.types import Domain
from kwrl.worlds.compose import Paths, compose_world
from kwrl.worlds.facts import PERIODS, make_world
from kwrl.worlds.split import generate_split
from kwrl.worlds.taskdir import load_task, task_dirs


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    return generate_split("test", 20, 3, tmp_path_factory.mktemp("s") / "test", files_per_world=40)


def test_the_same_seed_gives_byte_identical_splits_whatever_the_worker_count(split, tmp_path):
    again = generate_split("test", 20, 3, tmp_path / "again", files_per_world=40, workers=1)
    assert _hashes(split) == _hashes(again)


def test_another_seed_gives_other_worlds(split, tmp_path):
    other = generate_split("test", 5, 4, tmp_path / "other", files_per_world=40)
    a, b = (
        json.loads((split / "split.json").read_text()),
        json.loads((other / "split.json").read_text()),
    )
    assert not set(a["worlds"]) & set(b["worlds"])


def test_train_and_test_never_share_a_world():
    test_ids = {make_world("test", 1, i, Domain.LAW).world_id for i in range(50)}
    train_ids = {make_world("train", 1, i, Domain.LAW).world_id for i in range(50)}
    assert not test_ids & train_ids


def test_a_split_has_the_requested_tasks_and_a_manifest(split):
    manifest = json.loads((split / "split.json").read_text())
    dirs = task_dirs(split)
    assert len(dirs) == len(manifest["tasks"]) == 20
    assert [d.name for d in dirs] == sorted(manifest["tasks"])
    tasks = [load_task(d) for d in dirs]
    assert {t.world_id for t in tasks} == set(manifest["worlds"])
    for t in tasks:
        assert (t.task_dir / "tests" / "test.sh").stat().st_mode & 0o111
        assert (t.task_dir / "solution" / "answer.md").read_text()


def test_a_world_holds_every_file_type_an_agent_will_face(split):
    world = next((split / "worlds").iterdir()) / "files"
    suffixes = {p.suffix for p in world.rglob("*") if p.is_file()}
    assert {
        ".pdf",
        ".xlsx",
        ".pptx",
        ".docx",
        ".mbox",
        ".json",
        ".ics",
        ".csv",
        ".md",
        ".txt",
    } <= suffixes
    assert len([p for p in world.rglob("*") if p.is_file()]) == 40


@pytest.mark.parametrize("n_files", [60, 160])
def test_files_per_world_is_a_knob(n_files):
    facts = make_world("test", 1, 0, Domain.BANKING)
    assert len(compose_world(facts, n_files)) == n_files


def test_documents_agree_with_the_fact_table_except_the_superseded_draft(split):
    paths = Paths(make_world("test", 3, 0, Domain.CONSULTING))
    world_dir = split / "worlds" / paths.facts.world_id
    facts = json.loads((world_dir / "world.json").read_text())
    period, seg = facts["draft_period"], facts["segments"][0]
    final = facts["revenue"][seg][period]
    wb = openpyxl.load_workbook(world_dir / "files" / paths.financials, data_only=True)
    row = next(r for r in wb["Revenue"].iter_rows(values_only=True) if r[0] == seg)
    assert row[1 + PERIODS.index(period)] == final
    with pdfplumber.open(world_dir / "files" / paths.report(period)) as pdf:
        final_text = "".join(page.extract_text() for page in pdf.pages)
    with pdfplumber.open(world_dir / "files" / paths.draft_report) as pdf:
        draft_text = "".join(page.extract_text() for page in pdf.pages)
    assert f"{final:.1f}" in final_text
    assert f"{facts['draft_revenue'][seg]:.1f}" in draft_text and "DRAFT" in draft_text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "Test!"}, "split name"),
        ({"n_tasks": 0}, "at least 1"),
        ({"files_per_world": 5}, "files per world"),
    ],
)
def test_bad_split_arguments_are_refused_clearly(tmp_path, kwargs, message):
    args = {"split": "test", "n_tasks": 3, "seed": 1, "out": tmp_path / "x"} | kwargs
    with pytest.raises(ValueError, match=message):
        generate_split(**args)


def test_a_split_never_overwrites_a_non_empty_directory(split):
    with pytest.raises(FileExistsError):
        generate_split("test", 3, 1, split)


def test_distractors_are_a_knob():
    facts = make_world("test", 1, 0, Domain.CONSULTING)
    paths = Paths(facts)
    with_them, without = compose_world(facts, 60), compose_world(facts, 60, distractors=False)
    assert paths.draft_report in with_them and paths.draft_report not in without
    lookalike = facts.lookalike.replace(" ", "_")
    assert any(lookalike in p for p in with_them)
    assert not any(lookalike in p for p in without)
    assert len(without) == 60


def test_generated_train_and_test_splits_share_no_world_company_or_prompt(split, tmp_path):
    from kwrl.worlds.overlap import check_split

    train = generate_split("train", 60, 3, tmp_path / "train", files_per_world=30)
    overlap = check_split(train, split)
    assert overlap.clean, (overlap.shared_worlds, overlap.near_duplicates[:3])
    companies = {json.loads((w / "world.json").read_text())["company"]
                 for s in (train, split) for w in (s / "worlds").iterdir()}
    test_companies = {json.loads((w / "world.json").read_text())["company"]
                      for w in (split / "worlds").iterdir()}
    train_companies = companies - test_companies
    assert not any(c.split()[0] in {t.split()[0] for t in test_companies} for c in train_companies)
