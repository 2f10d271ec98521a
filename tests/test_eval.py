"""Evaluation runs every task, keeps going past broken ones, and masks errors from the scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kwrl.eval.runner import evaluate, trial_to_json
from kwrl.eval.summary import GroupStats, summarize, summary_table
from kwrl.harness.baselines import NullAgent, OracleAgent
from kwrl.types import (
    Criterion,
    CriterionKind,
    CriterionResult,
    Domain,
    ErrorBoundary,
    Grade,
    StopReason,
    TrialResult,
    TrialStatus,
)
from kwrl.worlds.taskdir import TaskSpec, write_task


def make_split(root: Path) -> Path:
    """Three tasks over one world; the middle one has a broken task.toml."""
    world = root / "worlds" / "w1"
    (world / "files").mkdir(parents=True)
    (world / "files" / "report.md").write_text("EMEA revenue was $4.5m in 2024.\n")
    rubric = (
        Criterion(
            "c1",
            CriterionKind.ANSWER_NUMBER,
            "States EMEA revenue of 4.5m.",
            params={"value": 4.5e6, "rel_tol": 0.005, "abs_tol": 0.0, "unit": ""},
        ),
    )
    for task_id, domain, tier in (
        ("a", Domain.LAW, 1),
        ("b", Domain.LAW, 2),
        ("c", Domain.BANKING, 2),
    ):
        spec = TaskSpec(
            task_id=task_id,
            instruction="What was EMEA revenue in 2024?",
            rubric=rubric,
            domain=domain,
            tier=tier,
            template="test.lookup",
            world_id="w1",
            oracle_answer="EMEA revenue was $4.5m.",
        )
        write_task(spec, root / "tasks", world)
    (root / "tasks" / "b" / "task.toml").write_text("not = [valid")
    return root


def graded(task_id: str, domain: str, tier: int, score: float, passed: bool) -> TrialResult:
    criterion = CriterionResult("c1", CriterionKind.ANSWER_NUMBER, 1.0, passed, "")
    return TrialResult(
        task_id=task_id,
        status=TrialStatus.OK,
        grade=Grade(score, passed, (criterion,)),
        stop_reason=StopReason.ANSWERED,
        domain=domain,
        tier=tier,
    )


def errored(task_id: str, domain: str, tier: int, boundary: ErrorBoundary) -> TrialResult:
    return TrialResult(
        task_id=task_id,
        status=TrialStatus.ERROR,
        grade=None,
        stop_reason=StopReason.ERROR,
        error_boundary=boundary,
        error=f"{boundary.value} broke",
        domain=domain,
        tier=tier,
    )


TRIALS = [
    graded("t1", "consulting", 1, 1.0, True),
    graded("t2", "consulting", 2, 0.5, False),
    graded("t3", "banking", 1, 0.25, False),
    errored("t4", "banking", 2, ErrorBoundary.GRADER),
    errored("t5", "", 0, ErrorBoundary.TASK),  # never loaded: domain and tier unknown
]


def test_summary_means_exclude_errored_trials() -> None:
    summary = summarize(TRIALS, "oracle", "split", wall_sec=1.0)
    assert (summary.n_tasks, summary.n_graded, summary.n_errors) == (5, 3, 2)
    assert summary.mean_score == pytest.approx((1.0 + 0.5 + 0.25) / 3, abs=1e-12)
    assert summary.pass_at_1 == pytest.approx(1 / 3, abs=1e-12)
    assert summary.errors == {
        "t4": {"boundary": "grader", "message": "grader broke"},
        "t5": {"boundary": "task", "message": "task broke"},
    }
    assert summary.errors_by_boundary == {"grader": 1, "task": 1}


def test_summary_breaks_down_by_domain_and_tier() -> None:
    summary = summarize(TRIALS, "oracle", "split", wall_sec=1.0)
    assert summary.by_domain == {
        "consulting": GroupStats(n=2, n_graded=2, n_errors=0, mean_score=0.75, pass_at_1=0.5),
        "banking": GroupStats(n=2, n_graded=1, n_errors=1, mean_score=0.25, pass_at_1=0.0),
        "unknown": GroupStats(n=1, n_graded=0, n_errors=1, mean_score=None, pass_at_1=None),
    }
    assert summary.by_tier == {
        "1": GroupStats(n=2, n_graded=2, n_errors=0, mean_score=0.625, pass_at_1=0.5),
        "2": GroupStats(n=2, n_graded=1, n_errors=1, mean_score=0.5, pass_at_1=0.0),
        "unknown": GroupStats(n=1, n_graded=0, n_errors=1, mean_score=None, pass_at_1=None),
    }


def test_a_run_of_only_errors_has_no_mean_rather_than_zero() -> None:
    summary = summarize(TRIALS[3:], "null", "split", wall_sec=0.0)
    assert summary.mean_score is None and summary.pass_at_1 is None
    assert summary.n_errors == 2


def test_the_table_shows_overall_domains_and_tiers() -> None:
    table = summary_table(summarize(TRIALS, "oracle", "split", wall_sec=1.0))
    labels = list(table.columns[0].cells)
    assert labels == [
        "overall",
        "domain banking",
        "domain consulting",
        "domain unknown",
        "tier 1",
        "tier 2",
        "tier unknown",
    ]
    assert list(table.columns[4].cells)[0] == "0.583"


def test_trials_serialize_to_json_with_criteria_and_enums() -> None:
    line = json.loads(json.dumps(trial_to_json(TRIALS[0])))
    assert line["status"] == "ok" and line["stop_reason"] == "answered"
    assert line["grade"]["criteria"][0]["kind"] == "answer_number"


def test_evaluate_records_a_broken_task_and_goes_on(tmp_path: Path) -> None:
    split = make_split(tmp_path / "split")
    out = tmp_path / "run"
    summary = evaluate(split, NullAgent(), out, progress=False)
    lines = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert [line["task_id"] for line in lines] == ["a", "b", "c"]
    assert lines[1]["status"] == "error" and lines[1]["error_boundary"] == "task"
    assert "task.toml" in summary.errors["b"]["message"]
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["n_tasks"] == 3 and on_disk["agent"] == "null"
    for key in (
        "mean_score",
        "pass_at_1",
        "n_errors",
        "errors",
        "by_domain",
        "by_tier",
        "wall_sec",
    ):
        assert key in on_disk


def test_evaluate_scores_the_oracle_one_and_the_null_agent_zero(tmp_path: Path) -> None:
    split = make_split(tmp_path / "split")
    oracle = evaluate(split, OracleAgent(), tmp_path / "oracle", progress=False)
    assert (oracle.n_tasks, oracle.n_errors) == (3, 1), oracle.errors
    assert oracle.mean_score == 1.0 and oracle.pass_at_1 == 1.0
    assert oracle.by_domain["unknown"].n_errors == 1  # task b never loaded
    assert oracle.by_domain["law"].mean_score == 1.0 and oracle.by_tier["2"].n_graded == 1
    null = evaluate(split, NullAgent(), tmp_path / "null", progress=False)
    assert null.n_errors == 1, null.errors
    assert null.mean_score == 0.0 and null.pass_at_1 == 0.0
    line = json.loads((tmp_path / "oracle" / "trials.jsonl").read_text().splitlines()[0])
    assert line["grade"]["criteria"][0]["met"] is True
    assert set(line["timings"]) == {"setup", "agent", "grade", "teardown"}


def test_several_samples_per_task_report_the_share_of_tasks_with_mixed_outcomes() -> None:
    from kwrl.eval.summary import summarize

    trials = [graded("a", "law", 1, 1.0, True), graded("a", "law", 1, 0.0, False),
              graded("b", "law", 1, 1.0, True), graded("b", "law", 1, 1.0, True)]
    summary = summarize(trials, "model", "tasks", 1.0)
    assert summary.n_tasks == 2 and summary.samples_per_task == 2
    assert summary.mixed_fraction == 0.5 and summary.pass_at_1 == 0.75


def test_the_paired_gain_compares_each_task_with_itself() -> None:
    from kwrl.eval.summary import paired_gain, summarize, summary_from_json

    before = summarize([graded("a", "law", 1, 0.0, False), graded("a", "law", 1, 1.0, True),
                        graded("b", "law", 1, 1.0, True), graded("c", "law", 1, 0.5, False),
                        errored("d", "law", 1, ErrorBoundary.TOOL)], "before", "tasks", 1.0)
    after = summarize([graded("a", "law", 1, 1.0, True), graded("a", "law", 1, 1.0, True),
                       graded("b", "law", 1, 0.0, False), graded("c", "law", 1, 1.0, True),
                       graded("d", "law", 1, 1.0, True)], "after", "tasks", 1.0)
    assert before.task_scores == {"a": 0.5, "b": 1.0, "c": 0.5}  # d errored: no score
    gain = paired_gain(before, after)
    assert gain is not None and (gain.n_tasks, gain.up, gain.down) == (3, 2, 1)
    assert gain.mean == pytest.approx((0.5 - 1.0 + 0.5) / 3)
    assert gain.stderr == pytest.approx(0.8660254 / 3 ** 0.5)  # stdev(0.5, -1, 0.5) / sqrt 3
    assert "+0.000 +- 0.500" in str(gain)
    assert summary_from_json(json.loads(json.dumps(after.to_json()))) == after
    old = {k: v for k, v in before.to_json().items() if k != "task_scores"}
    assert paired_gain(summary_from_json(old), after) is None  # a summary.json from before
