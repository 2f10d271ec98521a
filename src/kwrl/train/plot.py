"""The learning curve of a run: training reward and pass rate per step, held-out evals as points.

Drawn with matplotlib's Agg canvas on a `Figure` of its own (no pyplot, no global state, no
display), so it works headless and from any thread. Steps whose value is missing (all trials
errored: JSON null) are gaps, not zeros.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kwrl.train.tracking import lookup

REWARD_KEY = "reward/mean"
PASS_KEY = "pass_rate"
WITH_SKIPPED_KEY = "reward_with_skipped"
SKIPPED_KEY = "groups/skipped"
"""Tasks the stream passed over in a step (`data.skip_unsolved`): the trials run then no longer
sample the task distribution, so the curve adds the reward with those tasks counted as failed."""


@dataclass(frozen=True)
class EvalPoint:
    """A held-out evaluation of the policy after `step` training steps (0: before training)."""

    step: int
    mean_score: float | None
    pass_at_1: float | None
    label: str = ""
    """Shown next to the point, e.g. "before" or "after"."""


def plot_learning_curve(metrics: Sequence[Mapping[str, Any]], out_png: Path,
                        eval_points: Sequence[EvalPoint] = (), title: str = "kwrl train"
                        ) -> Path:
    """Write the curve of `metrics` (records as `read_metrics` returns them) to `out_png`."""
    figure = learning_curve(metrics, eval_points, title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png")
    return out_png


def learning_curve(metrics: Sequence[Mapping[str, Any]], eval_points: Sequence[EvalPoint] = (),
                   title: str = "kwrl train") -> Figure:
    """The figure `plot_learning_curve` writes."""
    figure = Figure(figsize=(8, 4.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    skips = any(lookup(record, SKIPPED_KEY) for record in metrics)
    for key, label, style in ((REWARD_KEY, "train mean reward", "-"),
                              (PASS_KEY, "train pass rate", "--"),
                              (WITH_SKIPPED_KEY, "train mean reward, passed-over tasks as 0",
                               "-.")):
        steps, values = _series(metrics, key)
        if steps and (key != WITH_SKIPPED_KEY or skips):
            axes.plot(steps, values, style, marker="." if len(steps) < 50 else None,
                      label=label)
    if eval_points:
        _plot_evals(axes, eval_points)
    axes.set_xlabel("step")
    axes.set_ylabel("score")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of `key`; NaN where a step has no value, so the line breaks there."""
    steps, values = [], []
    for record in metrics:
        value = lookup(record, key)
        if "step" in record:
            steps.append(int(record["step"]))
            values.append(float(value) if isinstance(value, int | float) else math.nan)
    if all(math.isnan(v) for v in values):
        return [], []
    return steps, values


def _plot_evals(axes: Any, points: Sequence[EvalPoint]) -> None:
    ordered = sorted(points, key=lambda p: p.step)
    for attr, label, marker in (("mean_score", "held-out mean score", "o"),
                                ("pass_at_1", "held-out pass@1", "s")):
        shown = [(p.step, getattr(p, attr), p.label) for p in ordered
                 if getattr(p, attr) is not None]
        if not shown:
            continue
        axes.plot([s for s, _, _ in shown], [v for _, v, _ in shown], marker=marker,
                  linestyle=":", markersize=7, label=label)
        for step, value, text in shown:
            if text:
                axes.annotate(f"{text} {value:.2f}", (step, value), textcoords="offset points",
                              xytext=(4, 6), fontsize="x-small")
