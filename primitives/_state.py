"""Run state as a fold of the event log.

`fold(events)` is pure: it replays `apply` over the log. The live run keeps its state with the
same `apply` as it emits each event, so what resume rebuilds is what the run held.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from primitives._backend import Usage
from primitives._budget import Hold, Pricing, Spend
from primitives._events import (
    AnyEvent,
    JudgeCompleted,
    LaneCompleted,
    LaneDispatched,
    LaneFailed,
    ReduceCompletedData,
    RunCompleted,
    RunFailed,
    RunFailedData,
    RunResumed,
    RunStarted,
    RunStartedData,
    WaveBarrier,
    WaveStarted,
    WaveStartedData,
)

__all__ = ("LaneState", "RunState", "WaveState", "apply", "fold")

LaneStatus = Literal["pending", "dispatched", "completed", "failed"]


@dataclass(slots=True)
class LaneState:
    """One lane of a wave as the log tells it."""

    lane: int
    status: LaneStatus = "pending"
    attempts: int = 0
    seed: int | None = None
    hold: Hold | None = None  # the reservation of the attempt in flight
    text: str | None = None
    answer: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    logprob_mean: float | None = None
    error: str | None = None
    final: bool = False  # failed for good


@dataclass(slots=True)
class WaveState:
    wave: int
    info: WaveStartedData
    lanes: dict[int, LaneState] = field(default_factory=dict)
    barrier: bool = False

    def lane(self, lane: int) -> LaneState:
        state = self.lanes.get(lane)
        if state is None:
            state = self.lanes[lane] = LaneState(lane)
        return state

    def completed(self) -> list[LaneState]:
        return [s for _, s in sorted(self.lanes.items()) if s.status == "completed"]

    def failed(self) -> list[LaneState]:
        return [s for _, s in sorted(self.lanes.items()) if s.status == "failed" and s.final]


@dataclass(slots=True)
class RunState:
    """Everything resume needs: waves and lanes, judge scores, the reduce, the spend."""

    pricing: Pricing = field(default_factory=Pricing)
    run_id: str | None = None
    started: RunStartedData | None = None
    waves: dict[int, WaveState] = field(default_factory=dict)
    scores: dict[int, float | None] = field(default_factory=dict)
    reduce: ReduceCompletedData | None = None
    result: dict[str, Any] | None = None
    failure: RunFailedData | None = None
    spend: Spend = field(default_factory=Spend)
    last_sequence: int = 0
    first_time: datetime | None = None
    last_time: datetime | None = None
    active_seconds_before: float = 0.0  # wall time of segments before the last resume
    segment_start: datetime | None = None
    resumes: int = 0

    def in_flight(self) -> list[tuple[int, LaneState]]:
        """Lanes dispatched whose attempt never landed: a crash came between."""
        return [(w.wave, s) for w in self.waves.values() for s in w.lanes.values()
                if s.status == "dispatched"]

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    def active_seconds(self) -> float:
        """Wall time the run has been running, summed over segments."""
        if self.segment_start is None or self.last_time is None:
            return self.active_seconds_before
        return self.active_seconds_before + (self.last_time - self.segment_start).total_seconds()


def apply(state: RunState, event: AnyEvent) -> None:
    """Fold one event into the state."""
    state.last_sequence = event.sequence
    state.last_time = event.time
    if state.first_time is None:
        state.first_time = event.time
    if isinstance(event, LaneDispatched):
        lane = state.waves[event.wave or 0].lane(event.lane or 0)
        data = event.data
        usage = data.reserved.to_usage()
        lane.status = "dispatched"
        lane.attempts = event.attempt or lane.attempts + 1
        lane.seed = data.seed
        lane.hold = Hold(usage, data.reserved_cost_usd, data.reserved_requests,
                         state.waves[event.wave or 0].info.purpose)
    elif isinstance(event, LaneCompleted):
        lane = state.waves[event.wave or 0].lane(event.lane or 0)
        done = event.data
        lane.status = "completed"
        lane.text, lane.answer, lane.finish_reason = done.text, done.answer, done.finish_reason
        lane.usage, lane.logprob_mean = done.usage.to_usage(), done.logprob_mean
        _settle(state, lane)
    elif isinstance(event, LaneFailed):
        lane = state.waves[event.wave or 0].lane(event.lane or 0)
        lane.status = "failed"
        lane.error, lane.final = f"{event.data.error}: {event.data.message}", event.data.final
        lane.usage = event.data.billed.to_usage()
        _settle(state, lane)
    elif isinstance(event, WaveStarted):
        state.waves[event.wave or 0] = WaveState(event.wave or 0, event.data)
    elif isinstance(event, WaveBarrier):
        state.waves[event.wave or 0].barrier = True
    elif isinstance(event, JudgeCompleted):
        state.scores[event.data.candidate_lane] = event.data.score
    elif event.type == "reduce.completed":
        state.reduce = event.data
    elif isinstance(event, RunStarted):
        state.run_id, state.started = event.run_id, event.data
        state.segment_start = event.time
    elif isinstance(event, RunResumed):
        _resume(state, event)
    elif isinstance(event, RunCompleted):
        state.result = event.data.result
    elif isinstance(event, RunFailed):
        state.failure = event.data


def _settle(state: RunState, lane: LaneState, usage: Usage | None = None) -> None:
    """Bill the lane's attempt (its usage, or `usage` given) and drop its hold."""
    hold = lane.hold
    if hold is None:
        return
    state.spend.add(usage or lane.usage or Usage(), hold.purpose, state.pricing, hold.requests)
    lane.hold = None


def _resume(state: RunState, event: RunResumed) -> None:
    """A resume charges each in-flight attempt its whole hold (it may have been billed)."""
    for wave, lane_no in event.data.in_flight:
        lane = state.waves[wave].lane(lane_no)
        if lane.hold is not None:
            _settle(state, lane, lane.hold.usage)
        lane.status, lane.final = "failed", False
        lane.error = "Interrupted: the run stopped while this attempt was in flight"
    state.active_seconds_before = event.data.active_seconds_before
    state.segment_start = event.time
    state.resumes += 1


def fold(events: Iterable[AnyEvent], pricing: Pricing | None = None) -> RunState:
    """Rebuild a run's state from its events (pure)."""
    state = RunState(pricing=pricing or Pricing())
    for event in events:
        apply(state, event)
    return state
