"""What the compare and sweep pages are drawn from, read from `compare.json` and `sweep.json`.

Only the compared configs are points: each labelled with its config's name and the keys its fit
set (`vote k=23`), placed by what a question paid in the comparison's own unit (tokens for a
token budget, dollars only for a dollar one). Pilots are listed apart and never drawn. Whether a
point is over its budget is the record's `flag` (the evaluate code's 105% rule) and the frontier
is the evaluate code's own (`pareto_frontier`) over the points within budget: an over-budget
point is marked and never on it. Greedy, where it ran, is the baseline line. Nothing here is
markup.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from lanefold.evaluate import Comparison, Sweep, pareto_frontier, readable, spend_label
from lanefold.primitives import ConfigError

__all__ = (
    "Chart",
    "Mark",
    "Pilot",
    "Spot",
    "Unused",
    "compare_context",
    "label",
    "list_comparisons",
    "read_record",
    "record_context",
    "sweep_context",
)

KINDS: dict[str, type[Comparison] | type[Sweep]] = {
    "compare": Comparison,
    "sweep": Sweep,
}  # a record's kind: its file is `<kind>.json`
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
class Pilot:
    """A config's pilot: listed apart, never a point (it ran as configured, not fitted)."""

    name: str
    eval_id: str
    questions: int
    paid: float


@dataclass(frozen=True, slots=True)
class Unused:
    """A budget a sweep's config cannot use (its fit refused it, or the budget refused every
    run): listed, never drawn."""

    name: str
    budget: float
    status: str
    note: str


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


def read_record(runs_dir: Path, kind: str, record_id: str) -> Comparison | Sweep | None:
    """The `kind` record (`compare.json` or `sweep.json`) of `record_id` under `runs_dir`; None
    where there is none; a ConfigError naming the file where it cannot be read."""
    path = runs_dir / record_id / f"{kind}.json"
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        return KINDS[kind].model_validate_json(body)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not a {kind} record: {first}") from None


def list_comparisons(runs_dir: Path) -> list[tuple[str, str]]:
    """Every (kind, id) with a record under `runs_dir`, by id."""
    try:
        folders = sorted(p for p in runs_dir.iterdir() if p.is_dir())
    except OSError:
        return []
    return [(kind, p.name) for p in folders for kind in KINDS if (p / f"{kind}.json").is_file()]


def _command(words: list[str], where: Sequence[str]) -> str:
    return shlex.join([*words, *where])


def compare_context(comparison: Comparison, where: Sequence[str]) -> dict[str, object]:
    """What compare.html is drawn from: every config a point, pilots apart, the command."""
    unit = comparison.configs[0].unit if comparison.configs else "tokens"
    spots = framed(
        [
            Spot(
                name=c.name,
                label=label(c.name, c.fitted),
                accuracy=c.accuracy,
                low=c.interval[0],
                high=c.interval[1],
                paid=c.paid_mean,
                over=c.flag == "over",
                eval_id=c.eval_id,
                budget=c.budget,
                greedy=c.fit is not None and c.fit.greedy,
            )
            for c in comparison.configs
        ]
    )
    pilots = [
        Pilot(c.name, c.fit.pilot.eval_id, c.fit.pilot.questions, c.fit.pilot.mean_paid)
        for c in comparison.configs
        if c.fit is not None and c.fit.pilot is not None
    ]
    budget = comparison.equal_budget
    words = ["orchestrator", "compare", *(c.config for c in comparison.configs)]
    words += ["--dataset", comparison.dataset, "--limit", str(comparison.questions)]
    if comparison.scorer:
        words += ["--scorer", comparison.scorer]
    if budget is not None:
        words += ["--equal-budget", budget.mode]
        if budget.source == "--budget":
            words += ["--budget", f"{budget.limit:g}"]
    words += ["--compare-id", comparison.compare_id]
    return {
        "title": f"compare {comparison.compare_id}",
        "live": None,
        "record": comparison,
        "unit": unit,
        "budget": readable(budget.limit, unit) if budget is not None else None,
        "spots": spots,
        "chart": chart(spots, unit, budget.limit if budget is not None else None),
        "pilots": pilots,
        "unused": [],
        "command": _command(words, where),
    }


def sweep_context(sweep: Sweep, where: Sequence[str]) -> dict[str, object]:
    """What sweep.html is drawn from: every config at every budget it ran a point, greedy the
    baseline, budgets a config cannot use listed, pilots apart, the command."""
    spots: list[Spot] = []
    unused: list[Unused] = []
    pilots: list[Pilot] = []
    for line in sweep.configs:
        for p in line.points:
            if p.status != "ran" or p.accuracy is None:
                unused.append(Unused(line.name, p.budget, p.status, p.note or ""))
                continue
            low, high = p.interval or (p.accuracy, p.accuracy)
            spots.append(
                Spot(
                    name=line.name,
                    label=label(line.name, p.fitted),
                    accuracy=p.accuracy,
                    low=low,
                    high=high,
                    paid=p.paid_mean,
                    over=p.flag == "over",
                    eval_id=p.eval_id,
                    budget=p.budget,
                    pool=p.source == "pool",
                )
            )
        pilot_id = next((p.fit.pilot.eval_id for p in line.points if p.fit and p.fit.pilot), None)
        pilots.append(
            Pilot(
                line.name,
                pilot_id or f"{sweep.sweep_id}-{line.name}.pilot",
                sweep.pilot_questions,
                line.pilot,
            )
        )
    base = sweep.baseline
    if base is not None:
        low, high = base.interval
        spots.append(
            Spot(
                base.name,
                label(base.name, {}),
                base.accuracy,
                low,
                high,
                base.paid_mean,
                False,
                base.eval_id,
                greedy=True,
            )
        )
    spots = framed(spots)
    mode = "cost" if sweep.unit == "USD" else "tokens"
    words = ["orchestrator", "sweep", *(line.config for line in sweep.configs)]
    if base is not None and base.config:
        words.append(base.config)
    words += ["--dataset", sweep.dataset, "--limit", str(sweep.questions)]
    words += ["--budgets", ",".join(f"{b:g}" for b in sweep.budgets), "--unit", mode]
    if sweep.scorer:
        words += ["--scorer", sweep.scorer]
    words += ["--sweep-id", sweep.sweep_id]
    return {
        "title": f"sweep {sweep.sweep_id}",
        "live": None,
        "record": sweep,
        "unit": sweep.unit,
        "budget": None,
        "spots": spots,
        "chart": chart(spots, sweep.unit, None),
        "pilots": pilots,
        "unused": unused,
        "command": _command(words, where),
    }


def record_context(record: Comparison | Sweep, where: Sequence[str]) -> dict[str, object]:
    """What the record's page (compare.html or sweep.html) is drawn from."""
    if isinstance(record, Comparison):
        return compare_context(record, where)
    return sweep_context(record, where)
