"""A comparison's points as numbers: each compared config (at a budget, in a sweep) labelled
with its fitted keys, the frontier marked by the evaluate code's own rule over the points within
budget (an over-budget point never on it), placed in the compare and sweep pages' plot with
round ticks in the comparison's unit. The templates draw them; nothing here is markup."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from lanefold.evaluate import pareto_frontier, readable, spend_label

__all__ = ("Chart", "Mark", "Spot", "chart", "framed", "label")

_LEFT, _TOP, _PLOT_W, _PLOT_H = 60, 20, 440, 240  # the plot's frame in the 680x310 SVG (plots.html)
_LINE = 11  # a label's height: labels closer than this (and overlapping across) are moved up


@dataclass(frozen=True, slots=True)
class Spot:
    """One compared config (at one budget, in a sweep) as a point: its label, accuracy with its
    interval, mean paid a question in the comparison's unit, whether it paid over its budget,
    was read from a pool (hollow), is the greedy baseline, and is on the frontier."""

    name: str
    label: str
    accuracy: float
    low: float
    high: float
    paid: float
    over: bool
    eval_id: str | None
    budget: float | None = None
    pool: bool = False
    greedy: bool = False
    frontier: bool = False

    def notes(self) -> str:
        """What marks the point, in words: over budget, on the frontier, greedy, from a pool."""
        said = (
            (self.over, "over budget"),
            (self.frontier, "frontier"),
            (self.greedy, "greedy baseline"),
            (self.pool, "read from a pool"),
        )
        return ", ".join(words for on, words in said if on)


@dataclass(frozen=True, slots=True)
class Mark:
    """A point placed in the plot: its centre, its interval's ends, its label's baseline."""

    spot: Spot
    x: float
    y: float
    y_low: float
    y_high: float
    label_y: float = 0.0


@dataclass(frozen=True, slots=True)
class Chart:
    """The plot: the marks, the frontier's line, greedy's accuracy line (y), the budget's line
    (x), and the x axis's ticks as (x, label) with its name in words."""

    marks: list[Mark]
    frontier: list[tuple[float, float]]
    greedy_y: float | None
    budget_x: float | None
    ticks: list[tuple[float, str]]
    axis: str


def label(name: str, fitted: Mapping[str, object]) -> str:
    """A point's label: the config's name and the keys its fit set, as `vote k=23`."""
    keys = " ".join(f"{key}={value}" for key, value in fitted.items())
    return f"{name} {keys}" if keys else name


def framed(spots: Sequence[Spot]) -> list[Spot]:
    """`spots` with the frontier marked: the evaluate code's frontier over the points within
    their budget, so a point over its budget is never on it."""
    within = [i for i, s in enumerate(spots) if not s.over]
    best = pareto_frontier([(spots[i].paid, spots[i].accuracy) for i in within])
    on = {within[j] for j in best}
    return [replace(s, frontier=i in on) for i, s in enumerate(spots)]


def _scale(most: float) -> tuple[float, float]:
    """The axis's right end and tick step: a round step (1, 2 or 5 times a power of ten) that
    reaches past `most` in at most five ticks."""
    if most <= 0:
        return 1.0, 0.25
    power = 10 ** math.floor(math.log10(most / 4))
    step = next(power * m for m in (1, 2, 5, 10) if power * m * 4 >= most)
    return step * math.ceil(most / step + 1e-9), step


def _labelled(marks: Sequence[Mark]) -> list[Mark]:
    """Each mark with its label's baseline above it, moved up past the labels placed before it
    that it would run into (two configs that paid alike)."""
    placed: list[Mark] = []
    for m in marks:
        y = m.y - 6
        while any(abs(p.label_y - y) < _LINE and abs(p.x - m.x) < 120 for p in placed):
            y -= _LINE
        placed.append(replace(m, label_y=y))
    return placed


def chart(spots: Sequence[Spot], unit: str, budget: float | None) -> Chart:
    """The spots placed in the plot, paid across (from 0, in `unit`, round ticks) and accuracy
    up."""
    top, step = _scale(max([s.paid for s in spots] + [budget or 0.0]))

    def x(paid: float) -> float:
        return _LEFT + _PLOT_W * paid / top

    def y(accuracy: float) -> float:
        return _TOP + _PLOT_H * (1 - accuracy)

    marks = _labelled([Mark(s, x(s.paid), y(s.accuracy), y(s.low), y(s.high)) for s in spots])
    best = sorted((s.paid, s.accuracy) for s in spots if s.frontier)
    greedy = next((s for s in spots if s.greedy), None)
    ticks = [i * step for i in range(round(top / step) + 1)]
    return Chart(
        marks=marks,
        frontier=[(x(p), y(a)) for p, a in best],
        greedy_y=y(greedy.accuracy) if greedy is not None else None,
        budget_x=x(budget) if budget is not None else None,
        ticks=[(x(v), readable(v, unit)) for v in ticks],
        axis=f"paid per question ({spend_label(unit)})",
    )
