"""The plots' common ground and `compare.png`: what a question paid, in its unit, against
accuracy; tick labels a person reads (`1,200` tokens, `$0.0012`), never an offset."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ("draw", "readable", "spend_axis", "spend_label", "spend_ticks", "tick_labels")

_log = logging.getLogger("lanefold.compare")


class Drawn(Protocol):
    """What `draw` reads of a comparison (`Comparison` has it)."""

    @property
    def configs(self) -> Sequence[Any]: ...

    @property
    def equal_budget(self) -> Any: ...

    @property
    def compare_id(self) -> str: ...

    @property
    def questions(self) -> int: ...


def draw(comparison: Drawn, path: Path) -> str | None:
    """`compare.png`: accuracy against what a question paid (the equal budget's unit, else
    tokens computed), 95% interval bars, one point per config, the frontier as stars, a config
    over 105% of the budget crossed (never a star), and the budget as a dashed line. None
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display is asked for, on a server or in CI
        from matplotlib import pyplot
    except ImportError:
        _log.warning("compare.no_matplotlib: install matplotlib to draw %s", path)
        return None
    lines = comparison.configs
    unit = lines[0].unit if lines else "tokens"
    figure, axes = pyplot.subplots(figsize=(6.4, 4.4))
    try:
        for line in lines:
            low, high = line.interval
            over = line.flag == "over"
            axes.errorbar(
                [line.paid_mean],
                [line.accuracy],
                yerr=[[line.accuracy - low], [high - line.accuracy]],
                fmt="X" if over else "*" if line.pareto else "o",
                markersize=10 if line.pareto else 8 if over else 6,
                capsize=4,
                label=f"{line.name} ({line.loop})"
                + (" over budget" if over else " frontier" if line.pareto else ""),
                gid=f"{line.name}:{'over' if over else 'frontier' if line.pareto else 'point'}",
            )
            axes.annotate(
                line.name,
                (line.paid_mean, line.accuracy),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=8,
            )
        budget = comparison.equal_budget
        if budget is not None:
            axes.axvline(budget.limit, linestyle="--", color="grey", linewidth=1, label="budget")
        spend_axis(axes, unit)
        axes.set_ylabel("accuracy (95% Wilson interval)")
        axes.set_ylim(0, 1.02)
        axes.set_title(
            f"compare {comparison.compare_id}: {comparison.questions} questions"
            + (f", equal budget {readable(budget.limit, unit)}" if budget else "")
        )
        axes.legend(fontsize=8, loc="lower right")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        pyplot.close(figure)
    return str(path)


def spend_label(unit: str) -> str:
    """The axis's unit in words."""
    return {"USD": "USD", "lanes": "lanes"}.get(unit, "tokens computed: prefill, decode, judge")


def readable(value: float, unit: str) -> str:
    """A spend for a person: `$0.0012`, `1,234 tokens`, `3 lanes`."""
    if unit == "USD":
        return f"${value:.3g}" if value < 1 else f"${value:,.2f}"
    return f"{value:,.0f} {unit}" if value >= 10 or value == int(value) else f"{value:.2g} {unit}"


def tick_labels(values: Sequence[float], unit: str) -> list[str]:
    """Plain tick labels in the unit (`$0.0012`, `1,200`, never `1e-6` offsets), with the
    fewest figures that keep every label distinct (10.5 and 11 are not both `11`)."""

    def one(value: float, figures: int) -> str:
        if unit == "USD":
            return f"${value:.{figures + 2}g}" if value else "$0"
        return f"{value:,.{figures}f}"

    labels = [one(v, 0) for v in values]
    for figures in range(8):
        labels = [one(v, figures) for v in values]
        if len(set(labels)) == len(labels):
            break
    return labels


def spend_ticks(unit: str) -> Any:
    """A matplotlib formatter of `tick_labels`: every tick of the axis labelled at once."""
    from matplotlib.ticker import Formatter

    class Spend(Formatter):
        def format_ticks(self, values: Sequence[float]) -> list[str]:
            return tick_labels(list(values), unit)

        def __call__(self, x: float, pos: int | None = None) -> str:
            return tick_labels([x], unit)[0]

    return Spend()


def spend_axis(axes: Any, unit: str) -> None:
    """The x axis as what a question paid: its unit in words and at most five plain ticks,
    so dollar amounts never run into each other."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(nbins=5))
    axes.xaxis.set_major_formatter(spend_ticks(unit))
    axes.set_xlabel(f"paid per question ({spend_label(unit)})")
