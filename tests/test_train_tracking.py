"""Step metrics: JSONL that survives a kill, TensorBoard scalars, rollout summaries, the plot."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kwrl.train.plot import EvalPoint, learning_curve, plot_learning_curve
from kwrl.train.tracking import (
    METRICS_FILE,
    TENSORBOARD_DIR,
    MetricsLogger,
    TrainingProgress,
    flatten_metrics,
    lookup,
    progress_line,
    read_metrics,
    trial_metrics,
    truncate_after,
)
from kwrl.types import (
    ErrorBoundary,
    Grade,
    Message,
    StopReason,
    Trajectory,
    TrialResult,
    TrialStatus,
    Turn,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def f32(value: float) -> object:
    """TensorBoard stores scalars as float32."""
    return pytest.approx(value, rel=1e-6)


def step_metrics(reward: float) -> dict:
    return {"reward": {"mean": reward, "std": 0.1}, "pass_rate": reward / 2, "note": "ok"}


def scalars(run_dir: Path, tag: str) -> dict[int, float]:
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


# --- JSONL -------------------------------------------------------------------------------------


def test_each_step_is_one_json_line_with_nested_metrics_kept(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, step_metrics(0.25))
        logger.log(1, step_metrics(0.5))
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 0 and first["reward"] == {"mean": 0.25, "std": 0.1}
    assert first["pass_rate"] == 0.125 and first["note"] == "ok"
    assert isinstance(first["wall_time"], float)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]


def test_a_step_is_on_disk_before_log_returns(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(0, {"reward": 1.0})
    assert read_metrics(tmp_path / METRICS_FILE)[0]["reward"] == 1.0
    logger.close()


def test_a_killed_run_keeps_every_step_it_finished(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal
        from kwrl.train.tracking import MetricsLogger
        logger = MetricsLogger({str(tmp_path)!r}, tensorboard=False)
        for step in range(3):
            logger.log(step, {{"reward": {{"mean": step / 10}}}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2]["reward"]["mean"] == 0.2


def test_a_torn_last_line_is_skipped_and_cut_before_the_next_append(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, step_metrics(0.1))
        logger.log(1, step_metrics(0.2))
    path = tmp_path / METRICS_FILE
    with path.open("a") as f:
        f.write('{"step": 2, "reward": {"me')  # killed mid-write
    assert [r["step"] for r in read_metrics(path)] == [0, 1]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        assert logger.last_step == 1
        logger.log(2, step_metrics(0.3))
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_corrupt_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match=":2 is not a JSON line"):
        read_metrics(path)


def test_resuming_drops_the_steps_after_the_checkpoint_so_none_appears_twice(
        tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(5):
            logger.log(step, step_metrics(step / 10))
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=2) as logger:
        for step in range(3, 6):
            logger.log(step, step_metrics(0.9))
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r["reward"]["mean"] for r in records] == [0.0, 0.1, 0.2, 0.9, 0.9, 0.9]


def test_truncate_after_counts_what_it_dropped(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(4)) + '{"st')
    assert truncate_after(path, 1) == 2
    assert [r["step"] for r in read_metrics(path)] == [0, 1]
    assert path.read_text().endswith("\n")
    assert truncate_after(tmp_path / "absent.jsonl", 3) == 0


def test_logging_a_step_twice_or_backwards_is_an_error(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(3, {"reward": 1.0})
        with pytest.raises(ValueError, match="steps must increase"):
            logger.log(3, {"reward": 1.0})
        with pytest.raises(ValueError, match="steps must increase"):
            logger.log(2, {"reward": 1.0})
    assert len(read_metrics(tmp_path)) == 1


def test_a_fresh_logger_continues_after_the_last_logged_step(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"reward": 1.0})
    with MetricsLogger(tmp_path, tensorboard=False) as logger, pytest.raises(ValueError):
        logger.log(0, {"reward": 1.0})


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"ratio": {"min": float("nan"), "max": float("inf")}, "n": 3})
    line = (tmp_path / METRICS_FILE).read_text()
    assert "NaN" not in line and "Infinity" not in line
    assert read_metrics(tmp_path)[0]["ratio"] == {"min": None, "max": None}


def test_reserved_and_unserialisable_metrics_are_refused(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(ValueError, match="set by the logger"):
            logger.log(0, {"step": 1})
        with pytest.raises(TypeError, match="'bad'"):
            logger.log(0, {"bad": object()})
    assert read_metrics(tmp_path) == []


def test_logging_after_close_is_an_error(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.close()
    with pytest.raises(ValueError, match="closed"):
        logger.log(0, {"reward": 1.0})


# --- TensorBoard -------------------------------------------------------------------------------


def test_tensorboard_gets_every_number_under_slash_joined_keys(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, step_metrics(0.25))
        logger.log(1, step_metrics(0.75))
    assert list((tmp_path / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert scalars(tmp_path, "reward/mean") == {0: 0.25, 1: 0.75}
    assert scalars(tmp_path, "pass_rate") == {0: 0.125, 1: 0.375}
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert "note" not in events.Tags()["scalars"]


def test_a_resumed_run_hides_the_killed_runs_later_tensorboard_steps(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step in range(4):
            logger.log(step, {"reward": 0.1})
    with MetricsLogger(tmp_path, resume_step=1) as logger:
        logger.log(2, {"reward": 0.9})
    assert scalars(tmp_path, "reward") == {0: f32(0.1), 1: f32(0.1), 2: f32(0.9)}


def test_flatten_metrics_keeps_numbers_only() -> None:
    flat = flatten_metrics({"a": {"b": 1, "c": {"d": 2.5}}, "s": "x", "n": None,
                            "nan": float("nan"), "ok": True})
    assert flat == {"a/b": 1.0, "a/c/d": 2.5, "ok": 1.0}


# --- rollout metrics ---------------------------------------------------------------------------


def trial(task_id: str, score: float | None, stop: StopReason = StopReason.ANSWERED,
          tokens: int = 10, sampled: int = 4, turns: int = 2) -> TrialResult:
    mask = (0,) * (tokens - sampled) + (1,) * sampled
    trajectory = Trajectory(
        token_ids_T=tuple(range(tokens)), loss_mask_T=mask,
        logprobs_T=tuple(-0.5 * m for m in mask), policy_version_T=tuple(m - 1 for m in mask),
        turns=tuple(Turn(i, i + 1, 0, "stop") for i in range(turns)), messages=(),
        stop_reason=stop)
    if score is None:
        return TrialResult(task_id, TrialStatus.ERROR, None, StopReason.ERROR,
                           error_boundary=ErrorBoundary.SANDBOX, error="boom",
                           timings={"setup": 1.0})
    return TrialResult(task_id, TrialStatus.OK, Grade(score, score == 1.0, ()), stop,
                       trajectory=trajectory, timings={"setup": 3.0, "agent": 2.0})


def test_trial_metrics_summarise_a_step_by_hand() -> None:
    trials = [
        trial("a", 1.0, tokens=10, sampled=4, turns=2),
        trial("a", 0.0, stop=StopReason.MAX_TURNS, tokens=20, sampled=8, turns=4),
        trial("b", 0.5, tokens=30, sampled=6, turns=3),
        trial("b", None),
    ]
    m = trial_metrics(trials)
    assert m["trials"] == 4
    assert m["reward"]["mean"] == pytest.approx(0.5)
    assert m["reward"]["min"] == 0.0 and m["reward"]["max"] == 1.0
    assert m["reward"]["std"] == pytest.approx((1 / 6) ** 0.5)
    assert m["pass_rate"] == pytest.approx(1 / 3)
    assert m["error_rate"] == 0.25
    assert m["stop"]["answered"] == 0.5 and m["stop"]["max_turns"] == 0.25
    assert m["stop"]["error"] == 0.25 and m["stop"]["timeout"] == 0.0
    assert m["errors"]["sandbox"] == 1 and m["errors"]["engine"] == 0
    assert m["tokens"]["mean"] == 20.0 and m["tokens"]["max"] == 30.0
    assert m["sampled_tokens"]["mean"] == 6.0
    # The errored trial had no tape and no assistant message: 0 turns.
    assert m["turns"]["mean"] == pytest.approx((2 + 4 + 3 + 0) / 4)
    # a: 1.0 and 0.0 (signal); b: one graded trial (no signal).
    assert m["groups"] == {"count": 2, "with_signal": 0.5}
    assert m["trial_time"] == {"agent": 2.0, "setup": 2.5}  # (3 + 3 + 3 + 1) / 4


def test_trial_metrics_of_all_errored_trials_are_null_not_zero(tmp_path: Path) -> None:
    m = trial_metrics([trial("a", None), trial("a", None)])
    assert m["reward"]["mean"] is None and m["pass_rate"] is None
    assert m["error_rate"] == 1.0 and m["groups"]["with_signal"] is None
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, m)
    assert read_metrics(tmp_path)[0]["reward"]["mean"] is None


def test_turns_fall_back_to_assistant_messages_without_a_tape() -> None:
    bare = TrialResult("a", TrialStatus.OK, Grade(1.0, True, ()), StopReason.ANSWERED,
                       messages=(Message("user", "q"), Message("assistant", "x"),
                                 Message("tool", "y"), Message("assistant", "z")))
    assert trial_metrics([bare])["turns"]["mean"] == 2.0


# --- live view ---------------------------------------------------------------------------------


def test_the_progress_line_shows_the_headline_numbers() -> None:
    metrics = {**trial_metrics([trial("a", 1.0), trial("a", 0.0)]),
               "train": {"loss": 0.01234, "logprob_mismatch": 0.0041, "grad_norm": 0.5},
               "time": {"step": 12.34}}
    line = progress_line(metrics)
    assert line == ("reward 0.500 pass 0.500 err 0.00 turns 2.0 loss 0.0123 mismatch 0.0041 "
                    "grad 0.500 12.3s")
    assert progress_line({}) == ""


def test_lookup_reads_nested_or_flat_keys() -> None:
    assert lookup({"a": {"b": 1}}, "a/b") == 1
    assert lookup({"a/b": 2}, "a/b") == 2
    assert lookup({"a": 1}, "a/b") is None


def test_the_progress_display_renders_steps_and_metrics() -> None:
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    with TrainingProgress(4, console) as progress:
        progress.update(3, {"reward": {"mean": 0.75}})
    text = console.file.getvalue()
    assert "3/4" in text and "reward 0.750" in text
    terminal = Console(file=io.StringIO(), width=160, force_terminal=True)
    with TrainingProgress(4, terminal) as progress:
        progress.update(1, {"reward": {"mean": 0.5}})
    assert "reward 0.500" in terminal.file.getvalue()


def test_without_a_terminal_the_progress_is_one_line_per_step() -> None:
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    with TrainingProgress(4, console) as progress:
        progress.update(1, {"reward": {"mean": 0.25}})
        progress.update(2, {"reward": {"mean": 0.5}})
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("train 1/4") and "reward 0.250" in lines[0]
    assert lines[1].startswith("train 2/4") and len(lines) == 2


# --- plot --------------------------------------------------------------------------------------


def test_the_learning_curve_is_a_png(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(6):
            logger.log(step, trial_metrics([trial("a", step / 5), trial("a", 0.0)]))
        logger.log(6, trial_metrics([trial("a", None)]))  # a gap, not a zero
    out = plot_learning_curve(read_metrics(tmp_path), tmp_path / "plots" / "curve.png",
                              [EvalPoint(0, 0.1, 0.0, "before"), EvalPoint(6, 0.4, 0.25, "after")])
    assert out == tmp_path / "plots" / "curve.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000


def test_the_curve_adds_the_reward_with_skipped_tasks_only_when_tasks_were_skipped() -> None:
    def labels(records: list[dict]) -> list[str]:
        return learning_curve(records).axes[0].get_legend_handles_labels()[1]

    records = [{"step": k, "reward": {"mean": 0.5}, "pass_rate": 0.5, "groups": {"skipped": 0},
                "reward_with_skipped": 0.5} for k in (1, 2)]
    assert labels(records) == ["train mean reward", "train pass rate"]
    records[1] = {**records[1], "groups": {"skipped": 3}, "reward_with_skipped": 0.3}
    assert labels(records)[-1] == "train mean reward, passed-over tasks as 0"


def test_an_empty_run_still_plots(tmp_path: Path) -> None:
    out = plot_learning_curve([], tmp_path / "empty.png", [EvalPoint(0, None, None)])
    assert out.read_bytes().startswith(PNG_MAGIC)
