"""Scores of an evaluation run: overall, by domain and by tier, with errors kept apart.

Mean score is the mean of per-task scores (each the weighted fraction of its criteria met);
pass@1 is the fraction of tasks whose criteria were all met, from one trial per task. Trials
with status `error` failed for a system reason (task, sandbox, harness, grader...): they have no
valid reward, so they are *masked*, left out of both means and counted in `n_errors`, exactly as
training masks them. A group whose trials all errored has no mean (None, `null` in JSON), not 0.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from kwrl.types import TrialResult, TrialStatus

UNKNOWN = "unknown"
"""Group key for trials whose task never loaded (their domain and tier are not known)."""


@dataclass(frozen=True)
class GroupStats:
    """Scores of one group of trials (all, one domain or one tier)."""

    n: int
    """Trials in the group, errored ones included."""
    n_graded: int
    """Trials with status `ok`: the denominator of both means."""
    n_errors: int
    mean_score: float | None
    """Mean score over graded trials; None when none was graded."""
    pass_at_1: float | None
    """Fraction of graded trials that met every criterion; None when none was graded."""


@dataclass(frozen=True)
class Summary:
    """What `summary.json` holds."""

    agent: str
    tasks_root: str
    n_tasks: int
    """Distinct tasks (each attempted `samples_per_task` times)."""
    n_graded: int
    n_errors: int
    mean_score: float | None
    pass_at_1: float | None
    errors: Mapping[str, Mapping[str, str]]
    """task id -> {"boundary", "message"} for every errored trial."""
    errors_by_boundary: Mapping[str, int]
    by_domain: Mapping[str, GroupStats]
    by_tier: Mapping[str, GroupStats]
    """Keyed by the tier as a string ("1".."4"), so the JSON keys match."""
    wall_sec: float
    samples_per_task: int = 1
    mixed_fraction: float | None = None
    """Share of tasks whose graded samples include both a pass and a fail: where GRPO has signal
    (None with one sample per task)."""
    task_scores: Mapping[str, float] = field(default_factory=dict)
    """task id -> mean score over its graded samples (tasks with none are absent)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summary_from_json(data: Mapping[str, Any]) -> Summary:
    """The inverse of `Summary.to_json` (a `summary.json` read back)."""
    groups = {key: {name: GroupStats(**stats) for name, stats in data[key].items()}
              for key in ("by_domain", "by_tier")}
    return Summary(**{**data, **groups})


@dataclass(frozen=True)
class PairedGain:
    """After minus before, per task, over the tasks both runs graded: the measure of a training
    run's held-out gain that the spread between tasks does not drown (each task is its own
    control)."""

    n_tasks: int
    mean: float
    """Mean over tasks of (after - before) mean score."""
    stderr: float
    """Standard error of that mean (0 with fewer than two tasks)."""
    up: int
    down: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"paired per task {self.mean:+.3f} +- {self.stderr:.3f} (SE) over "
                f"{self.n_tasks} tasks, {self.up} up, {self.down} down")


def paired_gain(before: Summary, after: Summary) -> PairedGain | None:
    """The per-task gain from `before` to `after`; None when they share no graded task."""
    shared = sorted(set(before.task_scores) & set(after.task_scores))
    if not shared:
        return None
    diffs = [after.task_scores[k] - before.task_scores[k] for k in shared]
    stderr = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return PairedGain(len(diffs), statistics.fmean(diffs), stderr,
                      sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))


def group_stats(trials: Iterable[TrialResult]) -> GroupStats:
    """Mean score and pass@1 over the graded trials of a group; errors counted, not scored."""
    trials = list(trials)
    graded = [t.grade for t in trials if t.status is TrialStatus.OK and t.grade is not None]
    n_errors = len(trials) - len(graded)
    if not graded:
        return GroupStats(len(trials), 0, n_errors, None, None)
    mean_score = sum(g.score for g in graded) / len(graded)
    pass_at_1 = sum(1 for g in graded if g.passed) / len(graded)
    return GroupStats(len(trials), len(graded), n_errors, mean_score, pass_at_1)


def summarize(
    trials: Sequence[TrialResult], agent: str, tasks_root: Path | str, wall_sec: float
) -> Summary:
    """Aggregate one run's trials (one per task)."""
    overall = group_stats(trials)
    errors = {
        t.task_id: {
            "boundary": t.error_boundary.value if t.error_boundary else UNKNOWN,
            "message": t.error or "",
        }
        for t in trials
        if t.status is TrialStatus.ERROR
    }
    by_boundary = Counter(e["boundary"] for e in errors.values())
    outcomes: dict[str, set[bool]] = {}
    scores: dict[str, list[float]] = {}
    for t in trials:
        if t.status is TrialStatus.OK and t.grade is not None:
            outcomes.setdefault(t.task_id, set()).add(t.grade.passed)
            scores.setdefault(t.task_id, []).append(t.grade.score)
    samples = max(Counter(t.task_id for t in trials).values(), default=1)
    mixed = (sum(1 for o in outcomes.values() if len(o) == 2) / len(outcomes)
             if samples > 1 and outcomes else None)
    return Summary(
        agent=agent,
        tasks_root=str(tasks_root),
        n_tasks=len({t.task_id for t in trials}),
        n_graded=overall.n_graded,
        n_errors=overall.n_errors,
        mean_score=overall.mean_score,
        pass_at_1=overall.pass_at_1,
        errors=errors,
        errors_by_boundary=dict(sorted(by_boundary.items())),
        by_domain=_grouped(trials, lambda t: t.domain or UNKNOWN),
        by_tier=_grouped(trials, lambda t: str(t.tier) if t.tier else UNKNOWN),
        wall_sec=round(wall_sec, 3),
        samples_per_task=samples,
        mixed_fraction=mixed,
        task_scores={k: statistics.fmean(v) for k, v in sorted(scores.items())},
    )


def _grouped(trials: Sequence[TrialResult], key: Any) -> dict[str, GroupStats]:
    groups: dict[str, list[TrialResult]] = {}
    for trial in trials:
        groups.setdefault(key(trial), []).append(trial)
    # Known groups in natural order, trials whose task never loaded last.
    ordered = sorted(groups, key=lambda k: (k == UNKNOWN, k))
    return {k: group_stats(groups[k]) for k in ordered}


def summary_table(summary: Summary) -> Table:
    """One table for the terminal: overall, then each domain, then each tier."""
    table = Table(title=f"kwrl eval: {summary.agent} on {summary.tasks_root}")
    for column in ("group", "n", "graded", "errors", "mean score", "pass@1"):
        table.add_column(column, justify="left" if column == "group" else "right")
    _add_row(table, "overall", _overall(summary))
    table.add_section()
    for domain, stats in summary.by_domain.items():
        _add_row(table, f"domain {domain}", stats)
    table.add_section()
    for tier, stats in summary.by_tier.items():
        _add_row(table, f"tier {tier}", stats)
    notes = [f"wall {summary.wall_sec} s"]
    if summary.samples_per_task > 1 and summary.mixed_fraction is not None:
        notes.insert(0, f"{summary.samples_per_task} samples per task, "
                        f"{summary.mixed_fraction:.0%} of tasks with mixed outcomes")
    if summary.errors_by_boundary:
        by = ", ".join(f"{b} {n}" for b, n in summary.errors_by_boundary.items())
        notes.insert(0, f"errored trials are masked (by boundary: {by})")
    table.caption = "; ".join(notes)
    return table


def _overall(summary: Summary) -> GroupStats:
    """The overall row counts trials, like every other row (tasks x samples)."""
    trials = summary.n_graded + summary.n_errors
    return GroupStats(
        trials, summary.n_graded, summary.n_errors, summary.mean_score, summary.pass_at_1
    )


def _add_row(table: Table, label: str, stats: GroupStats) -> None:
    table.add_row(
        label,
        str(stats.n),
        str(stats.n_graded),
        str(stats.n_errors),
        _fmt(stats.mean_score),
        _fmt(stats.pass_at_1),
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
