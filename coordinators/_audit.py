"""What the built-in loops' audits share: each claim a loop makes must follow from its lanes.

The fold checks every line against the state before it, and `audit_run` re-runs a loop's
reducer over the lanes the loop declares it reduced (`candidates`). What is left is what only
the loop knows, which each loop's `audit` checks with these: each answer is what the
extractor finds in its lane's text; the loop's own records (`loop.<name>.<noun>`) say what
its rule gives from the lanes before them; the result's `outcome` detail is what the records
give; and the winner of a loop that answers without a reducer is the lane its rule picks.
Each returns the first claim that does not follow, as (line, what is wrong), or None.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from lanefold.primitives import AuditFinding, ExtractSpec, Lane, RunState, read_answer
from lanefold.primitives.events import LoopEvent

__all__ = (
    "answers",
    "candidate_lanes",
    "chosen",
    "claims",
    "earliest",
    "outcome",
    "records",
    "reduced_status",
    "waves_of",
)


def records(state: RunState, loop: str, noun: str) -> list[LoopEvent]:
    """The loop's `loop.<loop>.<noun>` records, in the order of the log."""
    kind = f"loop.{loop}.{noun}"
    return [event for event in state.loop_events if event.type == kind]


def waves_of(state: RunState, purpose: str) -> list[int]:
    """The numbers of the waves of `purpose`, in the order they ran."""
    return [number for number, wave in sorted(state.waves.items()) if wave.info.purpose == purpose]


def candidate_lanes(state: RunState, waves: Iterable[int]) -> list[Lane]:
    """Every lane the log holds of `waves`, wave by wave and lane by lane: what `ctx.wave`
    gave the loop for each, when its lanes are numbered in the order it asked for them."""
    return [
        Lane.of(number, lane)
        for number in waves
        if number in state.waves
        for _, lane in sorted(state.waves[number].lanes.items())
    ]


def answers(state: RunState, waves: Iterable[int], extract: ExtractSpec) -> AuditFinding | None:
    """Each completed lane of `waves` holds the answer the extractor finds in its text, and
    says why it has none where the extractor says (`answer_error`)."""
    for number in waves:
        for lane in state.waves[number].completed() if number in state.waves else []:
            read = read_answer(lane.text or "", extract)
            if read.answer != lane.answer:
                return (
                    lane.landed_at or 0,
                    f"lane {lane.lane}'s answer {lane.answer!r} is not what "
                    f"the extractor finds in its text ({read.answer!r})",
                )
            if read.reason != lane.answer_error:
                return (
                    lane.landed_at or 0,
                    f"lane {lane.lane}'s answer_error {lane.answer_error!r} is not what "
                    f"the extractor finds in its text ({read.reason!r})",
                )
    return None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:119] + "…"


def claims(
    line: int, what: str, held: Mapping[str, Any], expected: Mapping[str, Any], source: str = "the lanes give"
) -> AuditFinding | None:
    """The first of `expected`'s keys whose value `held` does not have (as JSON gives it
    back), named on `line` as `what says key = held, <source> expected`."""
    for key, value in expected.items():
        value = _jsonable(value)
        if key not in held or held[key] != value:
            return line, f"{what} says {key} = {_shown(held.get(key))}, {source} {_shown(value)}"
    return None


def outcome(
    state: RunState, expected: Mapping[str, Any], *, budget_stop: bool = False
) -> AuditFinding | None:
    """The result's `outcome` (the loop's own detail) holds what the log gives, and says
    `budget_stop: true` only where the log gives a stop for the budget (`budget_stop`; a
    result written before it was said holds none)."""
    result, line = state.result, state.result_sequence
    if result is None or line is None:
        return None
    held = result.get("outcome")
    held = held if isinstance(held, dict) else {}
    if "budget_stop" in held and (held["budget_stop"] is not True or not budget_stop):
        given = "the log gives no stop for the budget" if not budget_stop else "it is true or absent"
        return line, f"run.completed's outcome says budget_stop = {_shown(held['budget_stop'])}, {given}"
    return claims(line, "run.completed's outcome", held, expected, "the log gives")


def reduced_status(state: RunState) -> AuditFinding | None:
    """A loop that answers with its reduce's winner (`outcome_of`) answered exactly where the
    reduce found a winning lane."""
    result, line, reduce = state.result, state.result_sequence, state.reduce
    if result is None or line is None or reduce is None or result.get("reducer") != reduce.reducer:
        return None
    expected = "answered" if reduce.winner_lane is not None else "no_answer"
    if result.get("status") != expected:
        return line, f"run.completed says status = {result.get('status')!r}, its reduce gives {expected!r}"
    return None


def chosen(state: RunState, winner: Lane | None, rule: str) -> AuditFinding | None:
    """A loop that answers without a reducer answers with the lane its rule picks (wave,
    lane and answer), or with none; it reports no agreement or margin of a reduce. `rule`
    says which lane that is, in the refusal: "the last attempt that gave an answer is"."""
    result, line = state.result, state.result_sequence
    if result is None or line is None:
        return None
    expected: dict[str, Any] = (
        {"status": "no_answer", "winner_lane": None, "answer": None}
        if winner is None
        else {"status": "answered", "winner_wave": winner.wave, "winner_lane": winner.lane}
        | {"answer": winner.answer}
    )
    for key, value in (expected | {"agreement": None, "margin": None}).items():
        if result.get(key) != value:
            picked = f"lane {winner.lane} of wave {winner.wave}" if winner is not None else "none"
            return line, f"run.completed says {key} = {_shown(result.get(key))}: {rule} {picked}"
    return None


def earliest(*findings: AuditFinding | None) -> AuditFinding | None:
    """The finding on the earliest line: the first claim of the log that does not follow."""
    return min((f for f in findings if f is not None), key=lambda f: f[0], default=None)
