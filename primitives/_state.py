"""Run state as a fold of the event log.

`fold(events)` is pure: it replays `apply` over the log. The live run keeps its state with the
same `apply` as it emits each event, so what resume rebuilds is what the run held.

`apply` also refuses an event that is not the run's own or does not follow from the state so
far (another run's id, a config that does not match its hash, a lane of a wave never started,
a completion without a dispatch, a second completion of a lane, anything after the run ended,
a time before the run started) or whose claims the events before it do not give (a lane its
wave was not given, a bill, a barrier, a reducer: `primitives/_checks.py`; every field of a
result: `primitives/_result_checks.py`): it raises `LogCorruptError` naming the log and the
event's line (line N holds sequence N), and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from lanefold.primitives import _checks as checks
from lanefold.primitives._backend import Usage
from lanefold.primitives._budget import Hold, Pricing, Spend
from lanefold.primitives._checks import Refused
from lanefold.primitives._errors import LogCorruptError
from lanefold.primitives._result_checks import check_result, recorded_winner, winning_lane
from lanefold.primitives.events import (
    AnyEvent,
    JudgeCompleted,
    JudgeCompletedData,
    LaneCompleted,
    LaneDispatched,
    LaneFailed,
    LaneInterrupted,
    LoopEvent,
    ReduceCompleted,
    ReduceCompletedData,
    ReduceStarted,
    ReduceStartedData,
    RunCompleted,
    RunFailed,
    RunFailedData,
    RunInterrupted,
    RunInterruptedData,
    RunResumed,
    RunStarted,
    RunStartedData,
    WaveBarrier,
    WaveStarted,
    WaveStartedData,
)

__all__ = ("LaneState", "RunState", "WaveState", "apply", "fold")

LaneStatus = Literal["pending", "dispatched", "completed", "failed", "interrupted"]


@dataclass(slots=True)
class LaneState:
    """One lane of a wave as the log tells it."""

    lane: int
    status: LaneStatus = "pending"
    attempts: int = 0  # dispatches, cut-off ones included (the envelope's attempt number)
    failures: int = 0  # attempts that failed: what `retry.max_attempts` counts
    seed: int | None = None
    hold: Hold | None = None  # the reservation of the attempt in flight
    text: str | None = None
    answer: str | None = None
    answer_error: str | None = None  # why the extractor found no answer, where it says
    finish_reason: str | None = None
    usage: Usage | None = None
    logprob_mean: float | None = None
    backend: dict[str, Any] | None = None  # what the backend said of it (`lane.completed`'s `backend`)
    error: str | None = None
    final: bool = False  # failed for good
    landed_at: int | None = None  # sequence of its lane.completed

    @property
    def done(self) -> bool:
        """Completed, or failed for good: no attempt will be made again."""
        return self.status == "completed" or (self.status == "failed" and self.final)


@dataclass(slots=True)
class WaveState:
    """One wave as its events tell it: what `wave.started` gave it, its lanes, its barrier."""

    wave: int
    info: WaveStartedData
    lanes: dict[int, LaneState] = field(default_factory=dict)
    barrier: bool = False
    given: frozenset[int] | None = None  # the lanes wave.started gave it, where it says
    prompts: dict[int, int] = field(default_factory=dict)  # request -> its prompt's tokens

    def __post_init__(self) -> None:
        if self.given is None and self.info.lanes is not None:
            self.given = frozenset(self.info.lanes)

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
    """Everything resume needs: waves and lanes, verdicts, the loop's own events, the
    reductions, the spend.

    `scores` and `reduce` are the run's own reduce (reduction 1) over wave 1, as
    parallel-sample reads them; `verdicts` and `reductions` hold every reduction's.

    `priced`: `pricing` is the run's own (read from the recorded config where none was
    given; given prices, where the config records none or the same), so claims of cost are
    checked against it; a fold at other prices bills at them and checks no cost. `reducer`: the reducer
    the run's config names for its own reduce ("" where its loop reduces nothing; None where
    the caller does not know, as for a plug-in loop).
    """

    pricing: Pricing = field(default_factory=Pricing)
    source: str = "<log>"  # where the events come from, for errors naming a line
    expected_run_id: str | None = None  # the id the store knows the run by
    priced: bool = False
    reducer: str | None = None
    run_id: str | None = None
    started: RunStartedData | None = None
    waves: dict[int, WaveState] = field(default_factory=dict)
    scores: dict[int, float | None] = field(default_factory=dict)
    # (reduction, candidate wave, candidate lane) -> the verdict
    verdicts: dict[tuple[int, int, int], JudgeCompletedData] = field(default_factory=dict)
    verdict_sequences: dict[tuple[int, int, int], int] = field(default_factory=dict)  # their lines
    reduce: ReduceCompletedData | None = None
    reduce_sequence: int | None = None
    reductions: dict[int, ReduceCompletedData] = field(default_factory=dict)
    reduction_sequences: dict[int, int] = field(default_factory=dict)
    reduction_waves: dict[int, list[int]] = field(default_factory=dict)  # candidates' waves
    open_reduction: ReduceStartedData | None = None  # a re-reduction under way
    reductions_started: dict[int, ReduceStartedData] = field(default_factory=dict)  # what opened each
    loop_events: list[LoopEvent] = field(default_factory=list)
    result: dict[str, Any] | None = None
    result_sequence: int | None = None
    failure: RunFailedData | None = None
    interrupted: RunInterruptedData | None = None  # set until the next resume
    spend: Spend = field(default_factory=Spend)
    last_sequence: int = 0
    first_time: datetime | None = None  # run.started's
    last_time: datetime | None = None
    latest_time: datetime | None = None  # the latest time so far (a clock may step back)
    latest_line: int = 0  # the line that holds it
    active_seconds_before: float = 0.0  # sampling time of segments before the last resume
    segment_start: datetime | None = None  # first dispatch of the current segment
    resumes: int = 0

    def in_flight(self) -> list[tuple[int, LaneState]]:
        """Lanes dispatched whose attempt never landed: a crash or an interrupt came between."""
        return [
            (w.wave, s) for w in self.waves.values() for s in w.lanes.values() if s.status == "dispatched"
        ]

    def winning_lane(
        self, lane: int | None, wave: int | None = None, within: list[int] | None = None
    ) -> tuple[int, LaneState] | None:
        """The lane that won, as (its wave, its state): lane `lane` of wave `wave`, or where
        no wave is named the latest wave of `within` (default: every wave) in which that lane
        completed (else ran). None where no such lane ran. The one rule the result's
        `winner_wave` and `winner_text` follow."""
        return winning_lane(self, lane, wave, within)

    def winner(self) -> tuple[int, LaneState] | None:
        """The winning lane of the recorded result, as (its wave, its state): what a reader
        shows as the winner's text and finish reason, from the fold rather than the result's
        copy. None where there is no result or no winning lane."""
        return recorded_winner(self)

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    def active_seconds(self) -> float:
        """Sampling time of the run, summed over segments (model loading excluded). A clock
        stepped back (or a time edited back) never gives a segment less than no time."""
        if self.segment_start is None or self.last_time is None:
            return self.active_seconds_before
        segment = (self.last_time - self.segment_start).total_seconds()
        return self.active_seconds_before + max(segment, 0.0)


def apply(state: RunState, event: AnyEvent, *, envelope: bool = True) -> None:
    """Fold one event into the state; refuse (LogCorruptError) one that is not the run's own.

    `envelope=False` skips the checks of the envelope (run id, source, id, sequence) for the
    writer that built it; where the event falls in the run, and what it says, are checked
    against the state either way.
    """
    try:
        checks.check_place(state, event)
        if envelope or isinstance(event, RunStarted):
            checks.check_envelope(state, event)
        checks.check_time(state, event)
        _apply(state, event)
    except Refused as refused:
        raise LogCorruptError(state.source, event.sequence, str(refused)) from None
    state.last_sequence = event.sequence
    state.last_time = event.time
    if state.first_time is None:
        state.first_time = event.time
    if state.latest_time is None or event.time >= state.latest_time:
        state.latest_time, state.latest_line = event.time, event.sequence


def _wave(state: RunState, event: AnyEvent) -> WaveState:
    wave = state.waves.get(event.wave) if event.wave is not None else None
    if wave is None:
        raise Refused(f"{event.type} for wave {event.wave}, which was never started")
    if event.lane is None:
        raise Refused(f"{event.type} without a lane")
    checks.check_lane(wave, event.lane, event.type)
    return wave


def _landing(state: RunState, event: AnyEvent) -> LaneState:
    """The lane an attempt's outcome lands on: it must be in flight, with this attempt number."""
    lane = _wave(state, event).lane(event.lane or 0)
    if lane.status != "dispatched" or lane.hold is None:
        raise Refused(
            f"{event.type} of wave {event.wave} lane {event.lane} without a dispatch"
            f" (the lane is {lane.status})"
        )
    if event.attempt != lane.attempts:
        raise Refused(
            f"{event.type} for attempt {event.attempt} of wave {event.wave} lane "
            f"{event.lane}, whose attempt in flight is {lane.attempts}"
        )
    return lane


def _apply(state: RunState, event: AnyEvent) -> None:  # one branch per event type
    if isinstance(event, LaneDispatched):
        wave = _wave(state, event)
        if wave.barrier:
            raise Refused(f"lane.dispatched in wave {event.wave} after its barrier")
        lane = wave.lane(event.lane or 0)
        if lane.status == "dispatched" or lane.done:
            raise Refused(
                f"lane.dispatched of wave {event.wave} lane {event.lane}, which is "
                f"{'in flight' if lane.status == 'dispatched' else lane.status}"
            )
        if event.attempt != lane.attempts + 1:
            raise Refused(
                f"attempt {event.attempt} of wave {event.wave} lane {event.lane} "
                f"after attempt {lane.attempts}"
            )
        data = event.data
        checks.check_hold(state, wave, data)
        lane.status = "dispatched"
        lane.attempts = lane.attempts + 1
        lane.seed = data.seed
        lane.hold = Hold(
            data.reserved.to_usage(), data.reserved_cost_usd, data.reserved_requests, wave.info.bill
        )
        if state.segment_start is None:
            state.segment_start = event.time
    elif isinstance(event, LaneCompleted):
        lane = _landing(state, event)
        done = event.data
        checks.check_priced(
            state,
            done.usage,
            lane.hold.bill if lane.hold else "sample",
            done.cost_usd,
            "lane.completed's cost_usd",
        )
        lane.status = "completed"
        lane.text, lane.answer, lane.finish_reason = done.text, done.answer, done.finish_reason
        lane.answer_error = done.answer_error
        lane.usage, lane.logprob_mean = done.usage.to_usage(), done.logprob_mean
        lane.backend = done.backend or None
        lane.landed_at = event.sequence
        _settle(state, lane)
    elif isinstance(event, LaneFailed):
        wave = _wave(state, event)
        lane = wave.lane(event.lane or 0)
        failed = event.data
        if lane.status == "dispatched":
            lane = _landing(state, event)
            if failed.cut_off:
                checks.check_billed("lane.failed", failed.billed, failed.billed_cost_usd, lane.hold)
            else:
                checks.check_priced(
                    state,
                    failed.billed,
                    wave.info.bill,
                    failed.billed_cost_usd,
                    "lane.failed's billed_cost_usd",
                )
        elif lane.done or not failed.final or event.attempt != lane.attempts + 1:
            # An attempt refused before dispatch (no budget for it) fails for good, unsent.
            raise Refused(
                f"lane.failed of wave {event.wave} lane {event.lane} without a "
                f"dispatch (the lane is {lane.status})"
            )
        else:
            checks.check_billed("lane.failed", failed.billed, failed.billed_cost_usd, None)
        lane.status = "failed"
        lane.error, lane.final = f"{event.data.error}: {event.data.message}", event.data.final
        lane.failures += 1
        lane.usage = event.data.billed.to_usage()
        if event.data.cut_off:
            _cut_off(state, lane)
        else:
            _settle(state, lane)
    elif isinstance(event, LaneInterrupted):
        lane = _landing(state, event)
        checks.check_billed("lane.interrupted", event.data.billed, event.data.billed_cost_usd, lane.hold)
        lane.status, lane.error = "interrupted", f"Interrupted: {event.data.reason}"
        _cut_off(state, lane)
    elif isinstance(event, WaveStarted):
        if event.wave is None or event.wave in state.waves:
            raise Refused(
                f"wave.started for wave {event.wave}, which "
                f"{'has no number' if event.wave is None else 'was started before'}"
            )
        state.waves[event.wave] = WaveState(event.wave, event.data)
    elif isinstance(event, WaveBarrier):
        closing = state.waves.get(event.wave) if event.wave is not None else None
        if closing is None or closing.barrier:
            raise Refused(
                f"wave.barrier for wave {event.wave}, which "
                f"{'was never started' if closing is None else 'was closed before'}"
            )
        if any(s.status == "dispatched" for s in closing.lanes.values()):
            raise Refused(f"wave.barrier for wave {event.wave} while lanes are in flight")
        checks.check_barrier(closing, event.data)
        closing.barrier = True
    elif isinstance(event, JudgeCompleted):
        d = event.data
        checks.check_verdict(state, d.reduction, d.candidate_wave, d.candidate_lane)
        key = (d.reduction, d.candidate_wave, d.candidate_lane)
        if key in state.verdicts:
            raise Refused(
                f"a second judge.completed for candidate {d.candidate_lane}"
                + (f" of wave {d.candidate_wave}" if d.candidate_wave != 1 else "")
                + (f" in reduction {d.reduction}" if d.reduction != 1 else "")
            )
        state.verdicts[key], state.verdict_sequences[key] = d, event.sequence
        if d.reduction == 1 and d.candidate_wave == 1:
            state.scores[d.candidate_lane] = d.score
    elif isinstance(event, ReduceStarted):
        expected = max(state.reductions, default=0) + 1
        if event.data.reduction != expected or expected < 2:
            raise Refused(f"reduce.started for reduction {event.data.reduction}, expected {max(expected, 2)}")
        checks.check_reduce_started(state, event.data)
        state.open_reduction = state.reductions_started[event.data.reduction] = event.data
    elif isinstance(event, ReduceCompleted):
        number = event.data.reduction
        if number in state.reductions:
            raise Refused(f"a second reduce.completed for reduction {number}")
        opened = state.open_reduction
        if state.result is not None and (opened is None or opened.reduction != number):
            raise Refused(f"reduce.completed for reduction {number}, which was never started")
        if state.result is None and number != 1:
            raise Refused(f"reduce.completed for reduction {number} before the run ended")
        waves = (
            list(event.data.candidate_waves) or ([event.wave] if event.wave is not None else [])
            if number == 1
            else list(opened.candidate_waves)
            if opened is not None
            else []
        )
        checks.check_reduction(state, event.data, waves)
        state.reductions[number] = event.data
        state.reduction_sequences[number] = event.sequence
        state.reduction_waves[number] = waves
        state.open_reduction = None
        if number == 1:
            state.reduce, state.reduce_sequence = event.data, event.sequence
    elif isinstance(event, LoopEvent):
        state.loop_events.append(event)
    elif isinstance(event, RunStarted):
        if event.sequence != 1:
            raise Refused("run.started is not the first event")
        state.run_id, state.started = event.run_id, event.data
        recorded = checks.recorded_pricing(event.data.config)
        if recorded is not None and state.priced:  # given prices: checked against if the run's
            state.priced = state.pricing == recorded
        elif recorded is not None and state.pricing in (Pricing(), recorded):
            state.pricing, state.priced = recorded, True  # none given: the run's own
    elif isinstance(event, RunResumed):
        _resume(state, event)
    elif isinstance(event, RunInterrupted):
        if state.in_flight():
            raise Refused("run.interrupted while lanes are still in flight")
        state.interrupted = event.data
    elif isinstance(event, RunCompleted):
        check_result(state, event.data.result)
        state.result, state.result_sequence = event.data.result, event.sequence
    elif isinstance(event, RunFailed):
        state.failure = event.data


def _settle(state: RunState, lane: LaneState) -> None:
    """Bill the lane's attempt its reported usage and drop its hold."""
    hold = lane.hold
    if hold is None:
        return
    state.spend.add(lane.usage or Usage(), hold.bill, state.pricing, hold.requests)
    lane.hold = None


def _cut_off(state: RunState, lane: LaneState) -> None:
    """Charge an attempt cut off before it answered its whole hold, on the cut-off line."""
    if lane.hold is not None:
        state.spend.add_cut_off(lane.hold)
        lane.hold = None


def _resume(state: RunState, event: RunResumed) -> None:
    """A resume charges each attempt a crash cut off its whole hold (it may have been billed)."""
    checks.check_resumed(state, event.data)
    flying = {(wave, lane.lane) for wave, lane in state.in_flight()}
    if set(map(tuple, event.data.in_flight)) != flying:
        raise Refused(
            f"run.resumed names lanes in flight {sorted(event.data.in_flight)}, the log has {sorted(flying)}"
        )
    for wave, lane_no in event.data.in_flight:
        lane = state.waves[wave].lane(lane_no)
        _cut_off(state, lane)
        lane.status = "interrupted"
        lane.error = "Interrupted: the run stopped while this attempt was in flight"
    for started in state.waves.values():
        started.prompts.clear()  # the dispatcher numbers its requests afresh
    state.interrupted = None
    state.active_seconds_before = event.data.active_seconds_before
    state.segment_start = None
    state.resumes += 1


def fold(
    events: Iterable[AnyEvent],
    pricing: Pricing | None = None,
    *,
    source: str = "<log>",
    run_id: str | None = None,
    reducer: str | None = None,
) -> RunState:
    """Rebuild a run's state from its events (pure).

    `pricing`: the prices to bill at (by default the run's, from its recorded config; claims
    of cost are checked only at the run's own). `source` names the log in errors; `run_id`,
    where given, is the id the run must carry; `reducer`, where given, the reducer its config
    names for its own reduce ("" for a loop that reduces nothing). Raises LogCorruptError at
    the first event that is not the run's own.
    """
    state = RunState(
        pricing=pricing or Pricing(),
        source=source,
        expected_run_id=run_id,
        priced=pricing is not None,
        reducer=reducer,
    )
    for event in events:
        apply(state, event)
    return state
