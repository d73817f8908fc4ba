"""What the view's plots are made of, as numbers: the vote tally, an eval's accuracy curve, the
evals' points against spend with their Pareto frontier, a key's spend over time. The templates
draw them; nothing here is markup."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lanefold.primitives import RunState, RunSummary

__all__ = ("Bar", "Mark", "Plot", "Point", "curve", "frontier", "pareto", "spend_bars", "tally")


def tally(state: RunState) -> list[tuple[str, float, float]]:
    """The vote as (answer, count, share of the top count), most votes first: the reduce's
    votes, else the landed lanes' answers so far."""
    votes: dict[str, float] = {}
    if state.reduce is not None and state.reduce.votes:
        votes = {k: float(v) for k, v in state.reduce.votes.items()}
    else:
        for wave in state.waves.values():
            for lane in wave.lanes.values():
                if lane.status == "completed" and lane.answer is not None:
                    votes[lane.answer] = votes.get(lane.answer, 0) + 1
    top = max(votes.values(), default=1) or 1
    return [(answer, count, count / top) for answer, count in sorted(votes.items(), key=lambda kv: -kv[1])]


def curve(correct: Sequence[bool], total: int | None = None) -> list[tuple[float, float]]:
    """Accuracy as the questions landed, in the 400x200 plot's coordinates: across to `total`
    questions (where known, so a running eval's curve grows towards the right edge), else to
    those landed."""
    points, right = [], 0
    for i, ok in enumerate(correct, 1):
        right += ok
        points.append((i, right / i))
    n = max((total or len(points)) - 1, len(points) - 1, 1)
    return [(10 + 380 * (i - 1) / n, 190 - 180 * acc) for i, acc in points]


@dataclass(frozen=True, slots=True)
class Point:
    """One eval on the evals page: accuracy with its interval, mean paid spend per question,
    over the equal budget it was fitted to, on the frontier."""

    eval_id: str
    accuracy: float
    low: float
    high: float
    cost: float
    over: bool
    frontier: bool = False


@dataclass(frozen=True, slots=True)
class Mark:
    """A point placed in the plot: its centre and its interval's ends."""

    point: Point
    x: float
    y: float
    y_low: float
    y_high: float


@dataclass(frozen=True, slots=True)
class Plot:
    """The evals plot: each eval's mark, the frontier's line, the spend at the right edge."""

    marks: list[Mark]
    frontier: list[tuple[float, float]]
    top: float


def frontier(points: Sequence[Point]) -> set[str]:
    """The evals within their budget that no other within its budget beats on both: as
    accurate or more for as little or less, better on one. An eval over its budget is on no
    frontier."""
    fair = [p for p in points if not p.over]
    return {
        p.eval_id
        for p in fair
        if not any(
            q.accuracy >= p.accuracy and q.cost <= p.cost and (q.accuracy > p.accuracy or q.cost < p.cost)
            for q in fair
        )
    }


def pareto(points: Sequence[Point]) -> Plot:
    """The evals placed in the 400x220 plot: spend across, accuracy up."""
    top = max((p.cost for p in points), default=1.0) or 1.0

    def x(cost: float) -> float:
        return 40 + 340 * cost / top

    def y(acc: float) -> float:
        return 190 - 180 * acc

    marks = [Mark(p, x(p.cost), y(p.accuracy), y(p.low), y(p.high)) for p in points]
    best = sorted((p.cost, p.accuracy) for p in points if p.frontier)
    return Plot(marks, [(x(c), y(a)) for c, a in best], top)


@dataclass(frozen=True, slots=True)
class Bar:
    """One period of a key's spend: its start, tokens and USD, the bar's place and height."""

    start: datetime
    tokens: int
    cost_usd: float
    runs: int
    x: float
    width: float
    height: float


def spend_bars(found: Sequence[RunSummary], limit: int = 48) -> tuple[str, list[Bar]]:
    """Runs' paid tokens and USD summed per hour (per day where the runs span more than two
    days), the latest `limit` periods, as bars in the 400x200 plot (tokens up); with the
    period's name ("hour" or "day")."""
    if not found:
        return "hour", []
    first, last = min(s.started for s in found), max(s.started for s in found)
    unit = "hour" if last - first <= timedelta(days=2) else "day"

    def period(at: datetime) -> datetime:
        at = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        return at if unit == "hour" else at.replace(hour=0)

    sums: dict[datetime, tuple[int, float, int]] = {}
    for s in found:
        tokens, cost, runs = sums.get(period(s.started), (0, 0.0, 0))
        sums[period(s.started)] = (tokens + s.tokens, cost + s.cost_usd, runs + 1)
    shown = sorted(sums.items())[-limit:]
    top = max((t for _, (t, _, _) in shown), default=1) or 1
    width = 380 / len(shown)
    return unit, [
        Bar(at, tokens, cost, runs, 10 + i * width, max(width - 2, 1), 180 * tokens / top)
        for i, (at, (tokens, cost, runs)) in enumerate(shown)
    ]
