"""Rollout collection for RL: task stream, group filtering, error masking, advantages, queue."""

from __future__ import annotations

import itertools
import queue
import threading
from pathlib import Path

import pytest
import torch

from kwrl.train.loop import policy_samples, reward_with_skipped
from kwrl.train.rollouts import (
    GroupQueue,
    StampedGroup,
    TaskStream,
    collect_groups,
    group_version,
    has_signal,
    screen_mixed,
)
from kwrl.types import (
    AgentOutcome,
    Grade,
    StopReason,
    Task,
    Trajectory,
    TrajectoryGroup,
    TrialResult,
    TrialStatus,
)
from kwrl.worlds.split import generate_split
from kwrl.worlds.taskdir import task_dirs


def tape(n: int = 6, version: int = 0) -> Trajectory:
    mask = (0, 0, *([1] * (n - 2)))
    return Trajectory(tuple(range(n)), mask, tuple(-0.5 * m for m in mask),
                      tuple(version if m else -1 for m in mask), (), (), StopReason.ANSWERED)


def trial(score: float | None, task_id: str = "t", version: int = 0) -> TrialResult:
    if score is None:
        return TrialResult(task_id, TrialStatus.ERROR, None, StopReason.ERROR, trajectory=tape())
    return TrialResult(task_id, TrialStatus.OK, Grade(score, score == 1.0, ()),
                       StopReason.ANSWERED, trajectory=tape(version=version))


def test_task_stream_is_seeded_covers_each_epoch_and_resumes_where_it_stopped() -> None:
    dirs = [Path(f"t{i}") for i in range(5)]
    a = TaskStream(dirs, seed=3)
    first = [a.next() for _ in range(12)]
    assert sorted(first[:5]) == sorted(dirs) and sorted(first[5:10]) == sorted(dirs)
    again = TaskStream(dirs, seed=3)
    assert [again.next() for _ in range(12)] == first
    other = TaskStream(dirs, seed=4)
    assert [other.next() for _ in range(12)] != first
    b = TaskStream(dirs, seed=3)
    for _ in range(7):
        b.next()
    resumed = TaskStream(dirs, seed=3)
    resumed.load_state(b.state())
    assert [resumed.next() for _ in range(5)] == first[7:12]
    with pytest.raises(ValueError, match="same data"):
        TaskStream(dirs[:4], seed=3).load_state(b.state())


def test_task_stream_passes_over_unsolved_tasks_and_remembers_them_across_a_resume() -> None:
    dirs = [Path(f"t{i}") for i in range(10)]
    plain = TaskStream(dirs, seed=5)
    skipping = TaskStream(dirs, seed=5, skip_unsolved=0.9)
    assert [plain.next() for _ in range(10)] == [skipping.next() for _ in range(10)]
    for d in dirs[:5]:
        skipping.record(d, [0.0, 0.0, 0.0])  # failed every trial
    skipping.record(dirs[5], [0.0, 1.0])  # mixed
    skipping.record(dirs[6], [])  # every trial an error: nothing learned about the task
    draws = [skipping.next() for _ in range(200)]
    unsolved = sum(d in dirs[:5] for d in draws)
    assert 0 < unsolved < 0.25 * sum(d in dirs[5:] for d in draws)  # ~10% of their share
    assert skipping.progress()["unsolved"] == 5 and skipping.progress()["skipped"] > 0
    skipping.record(dirs[0], [0.0, 0.5])  # solved once: drawn as usual again
    assert skipping.progress()["unsolved"] == 4
    resumed = TaskStream(dirs, seed=5, skip_unsolved=0.9)
    resumed.load_state(skipping.state())
    assert [resumed.next() for _ in range(30)] == [skipping.next() for _ in range(30)]
    only_unsolved = TaskStream(dirs[:2], seed=1, skip_unsolved=0.99)
    for d in dirs[:2]:
        only_unsolved.record(d, [0.0])
    assert len([only_unsolved.next() for _ in range(20)]) == 20  # never stuck
    with pytest.raises(ValueError, match="probability"):
        TaskStream(dirs, seed=0, skip_unsolved=1.0)


def test_collect_tells_the_task_stream_which_tasks_failed_every_trial(split: Path) -> None:
    dirs = [d for d in task_dirs(split) if d.name.endswith(("0", "2"))][:2]
    stream = TaskStream(dirs, seed=0, skip_unsolved=0.5)
    collect_groups(stream, ScriptedAgent(), n_groups=2, group_size=4, max_draws=2)
    assert stream.state()["unsolved_tasks"] == [k for k, d in enumerate(dirs)
                                                if d.name.endswith("2")]


def test_a_group_has_signal_only_with_two_valid_trials_that_differ() -> None:
    assert has_signal(TrajectoryGroup("t", (trial(1.0), trial(0.0))))
    assert not has_signal(TrajectoryGroup("t", (trial(1.0), trial(1.0))))
    assert not has_signal(TrajectoryGroup("t", (trial(1.0), trial(None))))  # error is masked
    assert has_signal(TrajectoryGroup("t", (trial(0.5), trial(None), trial(0.0))))


def test_group_version_is_the_oldest_sampled_token() -> None:
    group = TrajectoryGroup("t", (trial(1.0, version=4), trial(0.0, version=3)))
    assert group_version(group) == 3


def test_policy_samples_mask_errors_and_centre_rewards_within_each_group() -> None:
    groups = [StampedGroup(TrajectoryGroup("a", (trial(1.0), trial(0.0), trial(None))), 0),
              StampedGroup(TrajectoryGroup("b", (trial(0.5), trial(0.0), trial(0.25))), 0)]
    samples = policy_samples(groups, "grpo")
    assert [s.group for s in samples] == [0, 0, 1, 1, 1]  # the error trial never trains
    assert [s.advantage for s in samples] == pytest.approx([0.5, -0.5, 0.25, -0.25, 0.0])
    assert samples[0].rollout_logprobs == tape().logprobs_T
    rloo = policy_samples(groups[:1], "rloo")
    assert [s.advantage for s in rloo] == pytest.approx([1.0, -1.0])


def test_queue_drops_groups_older_than_the_staleness_bound() -> None:
    q = GroupQueue(max_staleness=1)
    group = TrajectoryGroup("t", (trial(1.0),))
    for version in (0, 2, 3):
        q.put(StampedGroup(group, version))
    taken = q.get(2, current_version=3, timeout_s=0.1)
    assert [g.policy_version for g in taken] == [2, 3] and q.dropped_stale == 1
    with pytest.raises(queue.Empty):
        q.get(1, current_version=3, timeout_s=0.01)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("split") / "train"
    return generate_split("unit", 6, 5, out, files_per_world=30, workers=1)


class ScriptedAgent:
    """Answers right on odd calls of tasks whose id ends in 0 (mixed groups), never on the rest;
    raises on a task id ending in 1 (a harness failure: the trial is `error`)."""

    name = "scripted"

    def __init__(self) -> None:
        self.calls = itertools.count()
        self.lock = threading.Lock()

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        with self.lock:
            k = next(self.calls)
        if task.task_id.endswith("1"):
            raise RuntimeError("scripted harness failure")
        right = task.task_id.endswith("0") and k % 2 == 1
        answer = (task.task_dir / "solution" / "answer.md").read_text() if right else ""
        return AgentOutcome(answer, StopReason.ANSWERED, trajectory=tape())


def test_collect_replaces_groups_without_signal_and_masks_errors(split: Path) -> None:
    dirs = task_dirs(split)
    order = iter([d for d in dirs if d.name.endswith(("1", "2"))] + dirs)
    collection = collect_groups(lambda: next(order), ScriptedAgent(), n_groups=1, group_size=4,
                                concurrency=4, max_draws=6)
    assert collection.draws >= 3  # the t01/t02-like tasks give no signal: drawn again
    assert len(collection.kept) == 1
    kept = collection.kept[0]
    assert kept.group.task_id.endswith("0") and has_signal(kept.group)
    assert collection.dropped_no_signal == collection.draws - 1
    assert collection.errors["harness"] >= 4  # every trial of the failing task, masked
    assert len(collection.trials) == 4 * collection.draws


def test_collect_gives_up_after_max_draws(split: Path) -> None:
    hopeless = [d for d in task_dirs(split) if d.name.endswith("2")]
    collection = collect_groups(itertools.cycle(hopeless).__next__, ScriptedAgent(), n_groups=2,
                                group_size=2, max_draws=3)
    assert collection.kept == [] and collection.draws == 3
    everything = collect_groups(itertools.cycle(hopeless).__next__, ScriptedAgent(), n_groups=2,
                                group_size=2, keep_all=True)
    assert len(everything.kept) == 2 and everything.draws == 2


class HoldingAgent:
    """Right on the first trial of `slow` and of `later`, wrong on every other trial; holds
    every trial of `slow` until a trial of `later` has started."""

    name = "holding"

    def __init__(self, slow: str, later: str) -> None:
        self.slow, self.later = slow, later
        self.later_started = threading.Event()
        self.held: list[bool] = []
        """Per held trial: whether `later` started while it waited (False: it timed out)."""
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def run(self, task: Task, workspace: Path, tools: object = None) -> AgentOutcome:
        if task.task_id == self.later:
            self.later_started.set()
        elif task.task_id == self.slow:
            # the timeout only guards against a hang: a wave-by-wave collector would wait for
            # this group before drawing a replacement, so `later` would never start meanwhile
            self.held.append(self.later_started.wait(timeout=20))
        with self.lock:
            first = task.task_id not in self.seen
            self.seen.add(task.task_id)
        right = first and task.task_id in (self.slow, self.later)
        answer = (task.task_dir / "solution" / "answer.md").read_text() if right else ""
        return AgentOutcome(answer, StopReason.ANSWERED, trajectory=tape())


def test_collect_replaces_a_group_without_waiting_for_the_others(split: Path) -> None:
    # draw order: a mixed task (held), a hopeless one, then its replacement (mixed)
    drawn = task_dirs(split)[:3]
    agent = HoldingAgent(slow=drawn[0].name, later=drawn[2].name)
    collection = collect_groups(iter(drawn).__next__, agent, n_groups=2, group_size=2,
                                concurrency=4, max_draws=3)
    assert agent.held == [True, True]  # drawn and run while the first group was held
    assert [g.group.task_id for g in collection.kept] == [drawn[0].name, drawn[2].name]
    assert [t.task_id for t in collection.trials] == [d.name for d in drawn for _ in range(2)]
    assert collection.draws == 3 and collection.dropped_no_signal == 1


def test_screening_keeps_the_first_tasks_with_mixed_outcomes_in_order(split: Path) -> None:
    dirs = task_dirs(split)
    mixed = [d for d in dirs if d.name.endswith("0")]
    assert mixed and len(mixed) < len(dirs)
    chosen = screen_mixed(dirs, ScriptedAgent(), n=len(dirs), group_size=4, concurrency=4)
    assert chosen == mixed  # all of them, in the given order; the rest never mixed
    assert screen_mixed(dirs, ScriptedAgent(), n=1, group_size=4) == mixed[:1]
    hopeless = [d for d in dirs if d.name.endswith("2")]
    assert screen_mixed(hopeless, ScriptedAgent(), n=3, group_size=2) == []


def test_advantages_follow_the_registered_estimator() -> None:
    groups = [StampedGroup(TrajectoryGroup("a", (trial(1.0), trial(0.0), trial(0.0))), 0)]
    (a, b, c) = policy_samples(groups, "grpo", {"norm_by_std": True})
    expected = (torch.tensor([1.0, 0.0, 0.0]) - 1 / 3) / (torch.tensor([1.0, 0, 0]).std() + 1e-6)
    assert [a.advantage, b.advantage, c.advantage] == pytest.approx(expected.tolist(), rel=1e-5)


def test_the_reward_with_skipped_tasks_counts_their_trials_as_failed() -> None:
    trials = [trial(1.0), trial(0.5), trial(0.0), trial(None)]  # the error is not graded
    assert reward_with_skipped(trials, 0) == pytest.approx(0.5)
    assert reward_with_skipped(trials, 3) == pytest.approx(1.5 / 6)
    assert reward_with_skipped([trial(None)], 0) is None


def test_mini_batches_hold_whole_groups_and_step_metrics_merge() -> None:
    from kwrl.train.loop import merge_step_metrics, split_groups

    groups = [StampedGroup(TrajectoryGroup(t, (trial(1.0), trial(0.0))), 0) for t in "abcde"]
    samples = policy_samples(groups, "grpo")
    parts = split_groups(samples, 2)
    assert [sorted({s.group for s in p}) for p in parts] == [[0, 1, 2], [3, 4]]
    assert sum(len(p) for p in parts) == len(samples)
    assert len(split_groups(samples, 9)) == 5 and split_groups(samples, 1) == [samples]
    merged = merge_step_metrics([{"tokens": 10.0, "loss": 1.0, "lr": 0.1, "step": 1.0},
                                 {"tokens": 6.0, "loss": 3.0, "lr": 0.2, "step": 2.0}])
    assert merged == {"tokens": 16.0, "loss": 2.0, "lr": 0.2, "step": 2.0}
