"""`sweep.png`: accuracy against what a question paid, one line per config."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from lanefold.evaluate._compare_plot import spend_axis

if TYPE_CHECKING:
    from lanefold.evaluate._sweep_records import Sweep

__all__ = ("draw",)

_log = logging.getLogger("lanefold.sweep")


def draw(sweep: Sweep, path: Path) -> str | None:
    """One line per config through its points (paid mean, accuracy) with 95% interval bars, a
    hollow marker where a point was read from a pool, and the greedy baseline as a horizontal
    line. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display is asked for, on a server or in CI
        from matplotlib import pyplot
    except ImportError:
        _log.warning("sweep.no_matplotlib: install matplotlib to draw %s", path)
        return None
    figure, axes = pyplot.subplots(figsize=(7.2, 4.8))
    try:
        for line in sweep.configs:
            xs = [point.paid_mean for point in line.points]
            ys = [point.accuracy for point in line.points]
            low = [point.accuracy - point.interval[0] for point in line.points]
            high = [point.interval[1] - point.accuracy for point in line.points]
            axes.errorbar(xs, ys, yerr=[low, high], fmt="-o", capsize=3, label=f"{line.name} ({line.loop})")
        if sweep.baseline is not None:
            axes.axhline(
                sweep.baseline.accuracy,
                linestyle="--",
                color="grey",
                linewidth=1,
                label=f"greedy ({sweep.baseline.name}) {sweep.baseline.accuracy:.3f}",
            )
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
