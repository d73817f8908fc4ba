"""The claims the fold checks: what an event says must follow from the events before it.

Every field of the bill is derived, so an edit anywhere shows:

- a lane is one of the lanes its wave was given (`wave.started` records them; a log written
  before it did holds its waves to k lanes numbered from 0 up);
- a hold (`lane.dispatched`) reserves the wave's `lane_max_tokens` of output, its prompt as
  prefill or cached prefill as the request's place gives it, at the price of its usage;
- an outcome bills what follows from it: a completion its usage at the run's prices, a cut-off
  or interrupted attempt its whole hold, an attempt never sent nothing;
- `run.resumed` resumes after the last line with the sampling time the log gives;
- a barrier joins a wave whose lanes are all done and lists them; a verdict comes after its
  candidate's wave was joined, a reduction and the run's end after every wave was;
- a reduction is by the reducer the config names (or `reduce.started` opened), over waves
  that ran, with a winner among their lanes and verdicts on lanes that exist;
- `run.completed` holds what the fold gives, field by field (`primitives/_result_checks.py`);
- times run forward: nothing before `run.started`, and no line more than `TIME_STEP_BACK`
  before the latest time so far (a clock that stepped back, a resume on another machine
  whose clock is behind; the writer stamps no line before the last).

Costs are compared exactly: the writer's ledger and the fold price the same usages with the
same `Spend.add`, in the order of the log (the ledger settles a lane the moment its event is
written; resume rebuilds the ledger from the fold), so their floats are bit for bit the same.
A tolerance would only let a small edit pass. Costs are checked where the fold prices at the
run's own prices (`RunState.priced`): the recorded config's, or those given where the config
records none.

Two things are not derived, and are bounded instead. A prompt's token count is the backend's
(the prompt is not in the log): a hold's prefill is checked for its shape and against the
other lanes of its request, never its size.
Elapsed time is the writer's monotonic clock, which the log does not hold: `elapsed_s` must be
finite and no less than the time recorded before the last resume; no charge depends on it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from lanefold.primitives._backend import Usage
from lanefold.primitives._budget import Hold, Pricing, cost_of
from lanefold.primitives.events import (
    AnyEvent,
    Bill,
    LaneDispatchedData,
    ReduceCompletedData,
    ReduceStarted,
    ReduceStartedData,
    RunResumed,
    RunResumedData,
    RunStarted,
    UsageData,
    WaveBarrierData,
    hash_config,
)

if TYPE_CHECKING:
    from lanefold.primitives._state import RunState, WaveState

__all__ = (
    "TIME_STEP_BACK",
    "Refused",
    "check_barrier",
    "check_billed",
    "check_envelope",
    "check_hold",
    "check_joined",
    "check_lane",
    "check_place",
    "check_priced",
    "check_reduce_started",
    "check_reduction",
    "check_resumed",
    "check_time",
    "check_verdict",
    "recorded_pricing",
)

# How far a line's time may fall before the latest time so far: clocks step (NTP, a VM
# restored), and a resume may run on a machine whose clock is a little behind. The writer
# never stamps a line before the last (`Recorder`), so only older logs and other clocks use it.
TIME_STEP_BACK = timedelta(minutes=5)


class Refused(Exception):
    """An event that does not follow from the state so far; `apply` names its line."""


def recorded_pricing(config: dict[str, Any]) -> Pricing | None:
    """The prices a recorded config names, if it names valid ones."""
    raw = config.get("pricing")
    if not isinstance(raw, dict):
        return None
    try:
        return Pricing.model_validate(raw)
    except ValueError:  # pydantic's ValidationError: the reader's config check names it
        return None


# -- where an event falls ---------------------------------------------------------------------


def check_place(state: RunState, event: AnyEvent) -> None:
    """run.started first and once; nothing after the end; only a resume after an interrupt."""
    if isinstance(event, RunStarted):
        if state.started is not None:
            raise Refused("a second run.started")
    elif state.started is None or state.run_id is None:
        raise Refused(f"{event.type} before run.started")
    elif state.finished:
        if not (state.result is not None and _after_end(state, event)):
            raise Refused(f"{event.type} after the run ended")
    elif state.interrupted is not None and not isinstance(event, RunResumed):
        raise Refused(f"{event.type} after run.interrupted without a run.resumed")


# What may follow a completed run: a re-reduction, opened by reduce.started and closed by its
# reduce.completed, with the judge waves and verdicts it runs (and a resume of one a crash cut).
_REDUCTION_EVENTS = frozenset(
    {
        "wave.started",
        "lane.dispatched",
        "lane.completed",
        "lane.failed",
        "lane.interrupted",
        "wave.barrier",
        "judge.completed",
        "reduce.completed",
        "budget.wave_shrunk",
        "budget.exhausted",
        "budget.overrun",
        "backend.n_unsupported",
        "run.resumed",
    }
)


def _after_end(state: RunState, event: AnyEvent) -> bool:
    if isinstance(event, ReduceStarted):
        return state.open_reduction is None
    return state.open_reduction is not None and event.type in _REDUCTION_EVENTS


def check_envelope(state: RunState, event: AnyEvent) -> None:
    """The event carries this run's id, source, id and next sequence (and run.started a
    config that matches its hash)."""
    if isinstance(event, RunStarted):
        if state.expected_run_id is not None and event.run_id != state.expected_run_id:
            raise Refused(f"run_id {event.run_id!r} is not this run's ({state.expected_run_id!r})")
        try:
            recorded = hash_config(event.data.config)
        except ValueError:  # NaN or infinity: no config is written with one
            raise Refused("the recorded config holds a number JSON does not (NaN or infinity)") from None
        if recorded != event.data.config_hash:
            raise Refused("the recorded config does not match its config_hash (edited?)")
        run_id = event.run_id
    else:
        run_id = state.run_id or ""
        if event.run_id != run_id:
            raise Refused(f"run_id {event.run_id!r} is not this run's ({run_id!r})")
    if event.source != f"lanefold:run/{run_id}" or event.id != f"{run_id}:{event.sequence}":
        raise Refused(f"source {event.source!r} / id {event.id!r} are not this run's")
    if event.sequence != state.last_sequence + 1:
        raise Refused(f"sequence {event.sequence} after {state.last_sequence}")


def check_time(state: RunState, event: AnyEvent) -> None:
    """Nothing is recorded before `run.started`, and no line falls more than `TIME_STEP_BACK`
    before the latest time so far. A time without a UTC offset is no RFC 3339 time."""
    time = event.time
    if time.tzinfo is None or time.utcoffset() is None:
        raise Refused(f"{event.type}'s time {time.isoformat()} has no UTC offset")
    if isinstance(event, RunStarted):
        return
    started, latest = state.first_time, state.latest_time
    if started is not None and time < started:
        raise Refused(f"{event.type} at {_when(time)} before run.started ({_when(started)})")
    if latest is not None and latest - time > TIME_STEP_BACK:  # a difference never overflows
        back = (latest - time).total_seconds()
        raise Refused(
            f"{event.type} at {_when(time)}: {back:g} s before line {state.latest_line}'s time "
            f"({_when(latest)}); a clock may step back at most {TIME_STEP_BACK.total_seconds():g} s"
        )


def _when(time: datetime) -> str:
    return time.isoformat().replace("+00:00", "Z")


# -- lanes and holds ----------------------------------------------------------------------------


def check_lane(wave: WaveState, lane: int, kind: str) -> None:
    """The lane is one the wave was given (or, in a log that did not record them, one of k
    lanes numbered from 0)."""
    given = wave.given
    if given is not None:
        if lane not in given:
            raise Refused(
                f"{kind} for lane {lane} of wave {wave.wave}, which was given lanes "
                f"{_span(wave.info.lanes or [])}"
            )
    elif lane < 0 or (lane not in wave.lanes and len(wave.lanes) >= wave.info.k):
        raise Refused(f"{kind} for lane {lane} of wave {wave.wave}, which has {wave.info.k} lanes")


def _span(lanes: list[int]) -> str:
    ordered = sorted(lanes)  # distinct (the event model says so): a run of them has no gap
    if ordered and ordered[-1] - ordered[0] + 1 == len(ordered):
        return f"{ordered[0]}..{ordered[-1]}"
    shown = ", ".join(map(str, ordered[:8]))
    return f"[{shown}{', ...' if len(ordered) > 8 else ''}]"


def check_hold(state: RunState, wave: WaveState, data: LaneDispatchedData) -> None:
    """A hold reserves the wave's output per lane, its request's prompt on the line its place
    in the request gives (prefill on the lane that pays for the request, cached prefill on
    the others where the prefix is shared), no residency, at the price of that usage."""
    reserved = data.reserved
    if not data.max_tokens == reserved.output_tokens == wave.info.lane_max_tokens:
        raise Refused(
            f"lane.dispatched reserves {reserved.output_tokens} output tokens with "
            f"max_tokens {data.max_tokens}; wave {wave.wave} gives each lane "
            f"{wave.info.lane_max_tokens}"
        )
    shared = wave.info.share_prefix
    if (
        reserved.kv_token_seconds
        or (reserved.cached_input_tokens and (not shared or data.reserved_requests))
        or (shared and reserved.input_tokens and not data.reserved_requests)
    ):
        raise Refused("lane.dispatched reserves its prompt on a line its place in the request does not give")
    # The lanes of one request share its prompt (requests are numbered afresh by each resume).
    prompt = reserved.input_tokens + reserved.cached_input_tokens
    carried = wave.prompts.setdefault(data.request, prompt)
    if prompt != carried:
        raise Refused(
            f"lane.dispatched reserves a prompt of {prompt} tokens; request "
            f"{data.request} of wave {wave.wave} carries {carried}"
        )
    check_priced(state, reserved, wave.info.bill, data.reserved_cost_usd, "reserved_cost_usd")


def check_priced(state: RunState, usage: UsageData, bill: Bill, cost: float, what: str) -> None:
    """`cost` is `usage` at the run's prices, where the fold knows them."""
    if state.priced:
        expected = cost_of(usage, bill, state.pricing)
        if cost != expected:
            raise Refused(f"{what} {cost!r} is not the price of its usage ({expected!r})")


def check_billed(kind: str, billed: UsageData, cost: float, hold: Hold | None) -> None:
    """A cut-off or interrupted attempt bills its whole hold; one never sent bills nothing."""
    usage = billed.to_usage()
    if hold is not None and (usage != hold.usage or cost != hold.cost_usd):
        raise Refused(
            f"{kind} bills {usage} at {cost!r} USD, not its hold ({hold.usage} at {hold.cost_usd!r} USD)"
        )
    if hold is None and (usage != Usage() or cost != 0.0):
        raise Refused(f"{kind} bills {usage} at {cost!r} USD for an attempt never sent")


def check_barrier(wave: WaveState, data: WaveBarrierData) -> None:
    """A barrier joins a wave whose lanes are all done (each lane it was given landed or
    failed for good) and lists those that completed and those that failed."""
    undone = sorted(
        {lane for lane, s in wave.lanes.items() if not s.done} | (set(wave.given or ()) - set(wave.lanes))
    )
    if undone:
        status = wave.lanes[undone[0]].status if undone[0] in wave.lanes else "pending"
        raise Refused(f"wave.barrier for wave {wave.wave} while its lane {undone[0]} is {status}")
    completed = [s.lane for s in wave.completed()]
    failed = [s.lane for s in wave.failed()]
    if (list(data.completed), list(data.failed)) != (completed, failed):
        raise Refused(
            f"wave.barrier lists lanes {data.completed} completed and {data.failed} "
            f"failed, the log gives {completed} and {failed}"
        )


# -- resumes and reductions ----------------------------------------------------------------------


def check_resumed(state: RunState, data: RunResumedData) -> None:
    """A resume follows the last line, with the sampling time the log gives so far."""
    if data.resumed_after_sequence != state.last_sequence:
        raise Refused(
            f"run.resumed after sequence {data.resumed_after_sequence}, the log ends at {state.last_sequence}"
        )
    if data.active_seconds_before != state.active_seconds():
        raise Refused(
            f"run.resumed says {data.active_seconds_before!r} s ran before it, the "
            f"log gives {state.active_seconds()!r}"
        )


def check_reduce_started(state: RunState, data: ReduceStartedData) -> None:
    """A re-reduction reads the waves the run's own reduce read, and starts its own waves
    after the last one."""
    waves = state.reduction_waves.get(1) or [1]
    if list(data.candidate_waves) != waves:
        raise Refused(f"reduce.started reads waves {data.candidate_waves}, the run's reduce read {waves}")
    first = max(state.waves, default=0) + 1
    if data.first_wave != first:
        raise Refused(f"reduce.started's first wave is {data.first_wave}, the next is {first}")


def check_joined(state: RunState, kind: str) -> None:
    """Every wave started so far was joined at its barrier: what reduces lanes or ends a run
    comes after the waves it read. (A crash before a barrier leaves no such line after it, and
    resume joins the wave.)"""
    open_wave = next((number for number, wave in sorted(state.waves.items()) if not wave.barrier), None)
    if open_wave is not None:
        raise Refused(f"{kind} before wave {open_wave}'s wave.barrier")


def check_reduction(state: RunState, data: ReduceCompletedData, waves: list[int]) -> None:
    """The reducer is the one the config names (the run's own reduce) or `reduce.started`
    opened (a re-reduction), over waves that ran and were joined, and its winner is one of
    their lanes (on the wave it names, where it names one)."""
    check_joined(state, "reduce.completed")
    if data.reduction == 1:
        expected = state.reducer
        if expected is not None and data.reducer != expected:
            raise Refused(
                f"reduce.completed by {data.reducer}, the config's "
                + (f"reducer is {expected}" if expected else "loop reduces nothing")
            )
    else:
        opened = state.open_reduction
        # A `module:attr` reducer records its class's name: only the reader that imports it
        # (orchestrator's fold_record) can tell; a registered name is checked here.
        if opened is not None and ":" not in opened.reducer and data.reducer != opened.reducer:
            raise Refused(
                f"reduce.completed by {data.reducer}, reduction {data.reduction} was "
                f"opened for {opened.reducer}"
            )
    missing = [wave for wave in waves if wave not in state.waves]
    if missing:
        raise Refused(f"reduce.completed over wave {missing[0]}, which was never started")
    lane, named = data.winner_lane, data.winner_wave
    holding = [wave for wave in waves if lane is not None and lane in state.waves[wave].lanes]
    if (lane is not None and not holding) or (named is not None and named not in holding):
        where = f"wave {named}" if named is not None else f"waves {waves}"
        raise Refused(f"reduce.completed's winner is lane {lane} of {where}, which never ran")


def check_verdict(state: RunState, reduction: int, wave: int, lane: int) -> None:
    """A verdict belongs to the reduction under way, on a lane that ran."""
    under_way = state.open_reduction.reduction if state.open_reduction is not None else 1
    if reduction != under_way:
        raise Refused(f"judge.completed for reduction {reduction}, the one under way is {under_way}")
    candidate = state.waves.get(wave)
    if candidate is None or lane not in candidate.lanes:
        raise Refused(f"judge.completed on lane {lane} of wave {wave}, which never ran")
    if not candidate.barrier:
        raise Refused(f"judge.completed on lane {lane} of wave {wave} before its wave.barrier")
