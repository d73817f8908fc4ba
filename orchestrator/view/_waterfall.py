"""A run as a waterfall, as numbers: each wave a band, each lane's attempts bars from dispatch
to landing in seconds since the run started, the barriers and reductions as marks.

Read from the run's events (the fold keeps no times per lane): the same list the page's
timeline shows, so a bar and its rows agree. The template draws it; nothing here is markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lanefold.primitives import AnyEvent
from lanefold.primitives.events import (
    LaneCompleted,
    LaneDispatched,
    LaneFailed,
    LaneInterrupted,
    ReduceCompleted,
    WaveBarrier,
    WaveStarted,
)

__all__ = ("Attempt", "Band", "Waterfall", "waterfall")

LEFT, WIDTH, ROW, GAP = (
    120.0,
    840.0,
    14.0,
    22.0,
)  # the plot (1000 wide)'s left margin, width, a row, a band's head


@dataclass(slots=True)
class Attempt:
    """One dispatch of a lane: from `start` to `end` seconds (None: still in flight), how it
    ended (`dispatched` while it goes, `landed`, `failed`, `interrupted`), where it is drawn."""

    wave: int
    lane: int
    attempt: int
    start: float
    end: float | None = None
    state: str = "dispatched"
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0


@dataclass(slots=True)
class Band:
    """One wave: what the loop called it (`sample`, `judge`, ...), its lanes' attempts by lane."""

    wave: int
    purpose: str
    start: float
    lanes: dict[int, list[Attempt]] = field(default_factory=dict)
    y: float = 0.0
    height: float = 0.0


@dataclass(slots=True)
class Waterfall:
    """The bands, the marks (`barrier` of a wave, `reduce`) at their seconds and x, the run's
    span so far, the plot's height, and ticks along the time axis."""

    bands: list[Band]
    marks: list[tuple[str, float, float]]
    span: float
    height: float
    ticks: list[tuple[float, float]]


def waterfall(events: Sequence[AnyEvent]) -> Waterfall:
    """The waterfall of a run's events (a live run's so far: an attempt in flight runs to the
    latest event's time)."""
    if not events:
        return Waterfall([], [], 0.0, 0.0, [])
    t0 = events[0].time
    bands: dict[int, Band] = {}
    open_: dict[tuple[int, int], Attempt] = {}
    marks: list[tuple[str, float]] = []
    for e in events:
        at = (e.time - t0).total_seconds()
        wave, lane = e.wave or 0, e.lane if e.lane is not None else -1
        if isinstance(e, WaveStarted):
            bands.setdefault(wave, Band(wave, e.data.purpose, at))
        elif isinstance(e, LaneDispatched):
            band = bands.setdefault(wave, Band(wave, "sample", at))
            attempt = Attempt(wave, lane, e.attempt or 1, at)
            band.lanes.setdefault(lane, []).append(attempt)
            open_[(wave, lane)] = attempt
        elif isinstance(e, LaneCompleted | LaneFailed | LaneInterrupted):
            ended = open_.pop((wave, lane), None)
            if ended is not None:
                ended.end = at
                ended.state = (
                    "landed"
                    if isinstance(e, LaneCompleted)
                    else "failed"
                    if isinstance(e, LaneFailed)
                    else "interrupted"
                )
        elif isinstance(e, WaveBarrier):
            marks.append((f"barrier {wave}", at))
        elif isinstance(e, ReduceCompleted):
            marks.append(("reduce", at))
    span = max((events[-1].time - t0).total_seconds(), 1e-3)
    return _placed(sorted(bands.values(), key=lambda b: b.wave), marks, span)


def _placed(bands: list[Band], marks: list[tuple[str, float]], span: float) -> Waterfall:
    """Each band and bar given its place: time across, a row a lane, a band under its head."""

    def x(seconds: float) -> float:
        return LEFT + WIDTH * seconds / span

    y = 0.0
    for band in bands:
        band.y = y
        y += GAP
        for _, attempts in sorted(band.lanes.items()):
            for attempt in attempts:
                attempt.x, attempt.y = x(attempt.start), y
                attempt.width = max(x(span if attempt.end is None else attempt.end) - attempt.x, 1.0)
            y += ROW
        band.height = y - band.y
    ticks = [(span * i / 4, x(span * i / 4)) for i in range(5)]
    return Waterfall(bands, [(name, at, x(at)) for name, at in marks], span, y, ticks)
