"""Evaluate an agent on a split: one trial per task, results on disk as they happen.

`out/trials.jsonl` gets one TrialResult per line, written and flushed after each trial, so a run
that is interrupted still leaves every finished trial behind; `out/summary.json` is written at the
end (see `kwrl.eval.summary` for the metrics). Tasks run one after another in this process: a
failing trial is recorded as `error` and the run goes on (`run_trial` never raises for a trial).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kwrl.eval.summary import Summary, summarize
from kwrl.sandbox.trial import Agent, SnapshotCache, TrialServices, run_trial
from kwrl.types import TrialResult, TrialStatus
from kwrl.worlds.taskdir import TaskFormatError, load_task, task_dirs

TRIALS_FILE = "trials.jsonl"
SUMMARY_FILE = "summary.json"


def evaluate(
    tasks_root: Path,
    agent: Agent,
    out: Path,
    progress: bool = True,
    console: Console | None = None,
    services: TrialServices | None = None,
    concurrency: int = 1,
    samples: int = 1,
    tiers: Sequence[int] | None = None,
    max_tasks: int = 0,
) -> Summary:
    """Run `agent` once on every task under `tasks_root`; write trials and summary to `out`.

    `services` (e.g. MCP tool servers) are started and stopped around each trial's agent.
    `concurrency` trials run at once, each in its own thread (a model agent runs its own event
    loop there, and a batching engine serves them together); results keep the task order.
    `samples` trials per task (pass@1 over all of them; `mixed_fraction` in the summary).
    `tiers` keeps only tasks of those tiers (a task that does not load is kept: its error counts).
    `max_tasks` keeps the first N of those, by id (0: all).
    """
    tasks_root, out = Path(tasks_root), Path(out)
    if not tasks_root.is_dir():
        raise FileNotFoundError(f"tasks directory not found: {tasks_root}")
    chosen = [d for d in task_dirs(tasks_root) if tiers is None or _tier(d) in (*tiers, None)]
    chosen = chosen[:max_tasks] if max_tasks else chosen
    dirs = [d for d in chosen for _ in range(max(1, samples))]
    out.mkdir(parents=True, exist_ok=True)
    before_cache: SnapshotCache = {}
    trials: list[TrialResult] = []
    start = time.perf_counter()
    def one(task_dir: Path) -> TrialResult:
        return run_trial(task_dir, agent, before_cache, services=services)

    with (
        (out / TRIALS_FILE).open("w") as sink,
        _progress(progress, len(dirs), console) as advance,
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
    ):
        for trial in pool.map(one, dirs):
            sink.write(json.dumps(trial_to_json(trial)) + "\n")
            sink.flush()
            trials.append(trial)
            advance(trial)
    summary = summarize(trials, agent.name, tasks_root, time.perf_counter() - start)
    (out / SUMMARY_FILE).write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    return summary


def _tier(task_dir: Path) -> int | None:
    try:
        return load_task(task_dir).tier
    except TaskFormatError:
        return None


def trial_to_json(trial: TrialResult) -> dict[str, Any]:
    """A TrialResult as plain JSON values (enums as their values, grade with every criterion)."""
    return _plain(asdict(trial))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "items"):  # other Mappings, e.g. MappingProxyType
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@contextmanager
def _progress(
    enabled: bool, total: int, console: Console | None
) -> Iterator[Callable[[TrialResult], None]]:
    """A rich progress bar that counts errors as it goes; a no-op when disabled."""
    if not enabled:
        yield lambda trial: None
        return
    columns = (
        TextColumn("[bold]eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        job = bar.add_task("eval", total=total, errors=0, last="")
        n_errors = 0

        def advance(trial: TrialResult) -> None:
            nonlocal n_errors
            n_errors += trial.status is TrialStatus.ERROR
            bar.update(job, advance=1, errors=n_errors, last=trial.task_id)

        yield advance
