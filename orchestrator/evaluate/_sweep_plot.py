"""`sweep.png`: accuracy against what a question paid, one line per config."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanefold.evaluate._compare_plot import spend_axis

if TYPE_CHECKING:
    from lanefold.evaluate._sweep_records import Sweep

__all__ = ("draw", "plot_into")

_log = logging.getLogger("lanefold.sweep")


def plot_into(axes: Any, sweep: Sweep) -> None:
    """Draw `sweep` on matplotlib `axes`: one line per config through its points (paid mean,
    accuracy) with 95% interval bars; a point read from a pool hollow, a real run filled, a
    point that paid over 105% of its budget crossed; a budget the loop cannot use (or that
    refused every run) is no point. Greedy is one filled point at what it paid, with a dashed
    line at its accuracy."""
    for line in sweep.configs:
        points = [p for p in line.points if p.status == "ran" and p.accuracy is not None]
        xs = [p.paid_mean for p in points]
        ys = [float(p.accuracy or 0.0) for p in points]
        (drawn,) = axes.plot(xs, ys, "-", label=f"{line.name} ({line.loop})")
        colour = drawn.get_color()
        for point, x, y in zip(points, xs, ys, strict=True):
            low, high = point.interval or (y, y)
            hollow = point.source == "pool"
            axes.errorbar(
                [x],
                [y],
                yerr=[[y - low], [high - y]],
                fmt="X" if point.flag == "over" else "o",
                color=colour,
                markerfacecolor="none" if hollow else colour,
                markersize=7,
                capsize=3,
                gid=f"{line.name}@{point.budget:g}:{point.source}",
            )
    if sweep.baseline is not None:
        base = sweep.baseline
        axes.axhline(base.accuracy, linestyle="--", color="grey", linewidth=1)
        low, high = base.interval
        axes.errorbar(
            [base.paid_mean],
            [base.accuracy],
            yerr=[[base.accuracy - low], [high - base.accuracy]],
            fmt="s",
            color="grey",
            capsize=3,
            label=f"greedy ({base.name}) {base.accuracy:.3f}, one lane",
            gid=f"{base.name}:greedy",
        )
    if any(p.source == "pool" for line in sweep.configs for p in line.points):
        axes.plot([], [], "o", color="black", markerfacecolor="none", label="read from a pool (hollow)")


def draw(sweep: Sweep, path: Path) -> str | None:
    """`sweep.png` (see `plot_into`), the x axis in the budget's unit with distinct plain tick
    labels. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display is asked for, on a server or in CI
        from matplotlib import pyplot
    except ImportError:
        _log.warning("sweep.no_matplotlib: install matplotlib to draw %s", path)
        return None
    figure, axes = pyplot.subplots(figsize=(7.2, 4.8))
    try:
        plot_into(axes, sweep)
        spend_axis(axes, sweep.unit)
        axes.set_ylabel("accuracy (95% interval)")
        axes.set_ylim(0, 1.02)
        axes.set_title(f"sweep {sweep.sweep_id}: {sweep.questions} questions, budgets in {sweep.unit}")
        axes.legend(fontsize=8, loc="lower right")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        pyplot.close(figure)
    return str(path)
