"""The claims of `run.completed`: its result holds what the fold of the events before it gives.

Every field the log determines is checked against the fold, so an edited copy is refused by
every reader (and the gateway serves nothing the fold did not give):

- who and what: `run_id`, `question`, `resumes`; the bill (`usage` and `cost`), line by line;
- the lanes as the log tells them (status, answer and why none, finish reason, tokens, attempts), with
  each lane's `score` as the cited reduce gave it (none where no reduce is cited); the counts;
- the reduce it cites: `reducer`, `answer`, `winner_lane`, `votes`, `scores`, `tie_break`,
  `agreement` and `margin` as `reduce.completed` records them; a result that cites none names
  its loop and holds no votes or scores;
- the winner (`winning_lane`): `winner_wave` and `winner_lane` name a lane that ran (of the
  reduce's waves, where one decided) and `winner_text` is that lane's text as its
  `lane.completed` holds it; no text or wave without a winning lane;
- `status` "answered" only with an answer or a winning lane; no `error` (a failure is
  `run.failed`'s) and no `index` (a batch's position is its caller's);
- every wave joined at its barrier, and `elapsed_s` no less than the time before the last resume.

Whether the reduce itself follows from its lanes is `audit_run`'s (the reducer run again over
them, `primitives/_audit.py`); what only the loop knows (its `outcome` detail, its own records,
an answer no reducer gave) is its own audit's (`Loop.audit`).
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

from lanefold.primitives._answers import normalize_answer
from lanefold.primitives._checks import Refused, check_joined
from lanefold.primitives.events import ReduceCompletedData

if TYPE_CHECKING:
    from lanefold.primitives._state import LaneState, RunState

__all__ = ("check_result", "recorded_winner", "winning_lane")


def winning_lane(
    state: RunState, lane: int | None, wave: int | None, within: list[int] | None = None
) -> tuple[int, LaneState] | None:
    """The lane that won, as (its wave, its state): lane `lane` of wave `wave`; where no wave
    is named (a loop that names none, a result written before results recorded it), the
    latest wave of `within` (default: every wave) in which that lane completed, else the
    latest in which it ran. None where no such lane ran."""
    if lane is None:
        return None
    if wave is not None:
        found = state.waves.get(wave)
        return (wave, found.lanes[lane]) if found is not None and lane in found.lanes else None
    numbers = sorted(state.waves if within is None else within, reverse=True)
    ran = [
        (n, state.waves[n].lanes[lane]) for n in numbers if n in state.waves and lane in state.waves[n].lanes
    ]
    return next(((n, s) for n, s in ran if s.status == "completed"), ran[0] if ran else None)


def _reduced_waves(state: RunState, result: dict[str, Any]) -> list[int] | None:
    """The waves the run's own reduce read, where the result cites that reduce."""
    reduce = state.reduce
    if reduce is None or result.get("reducer") != reduce.reducer:
        return None
    return state.reduction_waves.get(1, [])


def recorded_winner(state: RunState) -> tuple[int, LaneState] | None:
    """The winning lane of the run's recorded result (which the fold checked), as (its wave,
    its state); None where the run has no result or the result no winning lane."""
    result = state.result
    if result is None or not isinstance(result.get("winner_lane"), int):
        return None
    number, wave = result["winner_lane"], result.get("winner_wave")
    within = _reduced_waves(state, result)
    if "winner_wave" not in result:  # written before results named the wave: the lane whose text it holds
        numbers = sorted(within if within is not None else state.waves, reverse=True)
        for n in numbers:
            lane = state.waves[n].lanes.get(number) if n in state.waves else None
            if lane is not None and lane.text == result.get("winner_text"):
                return n, lane
    return winning_lane(state, number, wave if isinstance(wave, int) else None, within)


def check_result(state: RunState, result: dict[str, Any]) -> None:
    """`run.completed` holds what the fold gives (the module's docstring lists each claim)."""
    check_joined(state, "run.completed")
    started = state.started
    claims: dict[str, Any] = {
        "run_id": state.run_id,
        "question": started.question if started else None,
        "resumes": state.resumes,
        "error": None,
        "index": None,
    }
    for key, expected in claims.items():
        if result.get(key) != expected:
            raise Refused(f"run.completed says {key} = {result.get(key)!r}, the log gives {expected!r}")
    _check_bill(state, result)
    reduce = _cited(state, result)
    _check_lanes(state, result, reduce)
    _check_reducer(state, result, reduce)
    _check_winner(state, result, reduce)
    if result.get("status", "answered") == "answered" and (
        result.get("answer") is None and result.get("winner_lane") is None
    ):
        raise Refused("run.completed says status = 'answered' with no answer and no winning lane")
    elapsed = result.get("elapsed_s")
    floor = round(state.active_seconds_before, 6)
    if not (isinstance(elapsed, int | float) and math.isfinite(elapsed) and elapsed >= floor):
        raise Refused(
            f"run.completed says elapsed_s = {elapsed!r}: not a time of at least the "
            f"{floor} s recorded before the last resume"
        )


def _check_bill(state: RunState, result: dict[str, Any]) -> None:
    spend = state.spend
    lines = [("usage", spend.usage_lines())]
    if state.priced:
        lines.append(("cost", spend.cost_lines()))
    for part, expected in lines:
        claimed = result.get(part)
        if not isinstance(claimed, dict):
            raise Refused(f"run.completed has no {part}")
        for name, value in expected.items():
            # Results written before the cut-off line existed leave it out: it was 0.
            got = claimed.get(name, 0 if name.startswith("cut_off") else None)
            if got != value:
                raise Refused(
                    f"run.completed says {part}.{name} = {got!r}, the fold of the log gives {value!r}"
                )


def _cited(state: RunState, result: dict[str, Any]) -> ReduceCompletedData | None:
    """The run's own reduce, where the result cites it (names its reducer); else None, once
    the result is seen to name its loop and the config's reducer to have decided nothing."""
    reduce = state.reduce
    reducer = result.get("reducer")
    if reduce is not None and reducer == reduce.reducer:
        return reduce
    loop = state.started.coordinator if state.started else None
    if reducer != loop:
        recorded = (
            f"the log's reduce is by {reduce.reducer}"
            if reduce is not None
            else "the log holds no reduce.completed"
        )
        raise Refused(f"run.completed names reducer {reducer!r}, {recorded}")
    if reduce is None and state.reducer:
        raise Refused(f"run.completed without a reduce by {state.reducer}, the config's reducer")
    return None


_LANE_CLAIMS = operator.itemgetter("lane", "wave", "status", "answer", "finish_reason", "tokens", "attempts")


def _check_lanes(state: RunState, result: dict[str, Any], reduce: ReduceCompletedData | None) -> None:
    """The lanes priced as samples, every wave's, as the result reports them, each scored as
    the cited reduce scored it (a reduce over one wave scores that wave's lanes only)."""
    waves = state.reduction_waves.get(1, [])
    scored = waves[0] if len(waves) == 1 else None
    expected = [
        (
            s.lane,
            w.wave,
            s.status,
            s.answer,
            s.finish_reason,
            s.usage.output_tokens if s.status == "completed" and s.usage else 0,
            s.attempts,
            s.answer_error,
            reduce.scores.get(s.lane) if reduce is not None and scored in (None, w.wave) else None,
        )
        for _, w in sorted(state.waves.items())
        if w.info.bill == "sample"
        for _, s in sorted(w.lanes.items())
    ]
    lanes = result.get("lanes")
    try:
        claimed = (
            [(*_LANE_CLAIMS(lane), lane.get("answer_error"), lane.get("score")) for lane in lanes]
            if isinstance(lanes, list)
            else None
        )
    except (KeyError, TypeError, AttributeError):  # a lane that is not one, or lacks a claim
        claimed = None
    if claimed != expected:
        scores_only = claimed is not None and [c[:-1] for c in claimed] == [e[:-1] for e in expected]
        raise Refused(
            "run.completed's lane scores are not the reduce's"
            if scores_only
            else "run.completed's lanes are not the lanes of the log"
        )
    counts = {
        "lanes_completed": sum(row[2] == "completed" for row in expected),
        "lanes_failed": sum(len(w.failed()) for w in state.waves.values() if w.info.bill == "sample"),
    }
    if "lanes_answered" in result:  # results written before it: the reader counts it
        counts["lanes_answered"] = sum(
            row[2] == "completed" and isinstance(row[3], str) and bool(normalize_answer(row[3]))
            for row in expected
        )
    for key, count in counts.items():
        if result.get(key) != count:
            raise Refused(f"run.completed says {key} = {result.get(key)!r}, the log gives {count}")


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _check_reducer(state: RunState, result: dict[str, Any], reduce: ReduceCompletedData | None) -> None:
    """A result that cites the reduce holds its answer, winner, votes, scores, tie break,
    agreement and margin; one that cites none holds no votes or scores."""
    if reduce is not None:
        claims: dict[str, Any] = {
            "answer": reduce.winner,
            "winner_lane": reduce.winner_lane,
            "votes": dict(reduce.votes),
            "scores": dict(reduce.scores),
            "tie_break": reduce.tie_break,
            "agreement": reduce.agreement,
            "margin": reduce.margin,
        }
    else:
        claims = {"votes": {}, "scores": {}, "tie_break": "none"}
    for key, expected in claims.items():
        got = _finite(result.get(key))
        if key == "scores" and isinstance(got, dict):
            try:
                got = {int(k): v for k, v in got.items()}
            except ValueError:
                pass
        if got != expected:
            raise Refused(f"run.completed says {key} = {got!r}, the log's reduce gives {expected!r}")


def _shown(text: Any) -> str:
    """A text in an error's one line: quoted, its line breaks escaped, a long one cut."""
    if isinstance(text, str) and len(text) > 60:
        text = text[:59] + "…"
    return repr(text)


def _check_winner(state: RunState, result: dict[str, Any], reduce: ReduceCompletedData | None) -> None:
    """The winner is a lane that ran (of the cited reduce's waves, on the wave it names) and
    `winner_text` is its text."""
    number, wave, text = result.get("winner_lane"), result.get("winner_wave"), result.get("winner_text")
    if number is None:
        if wave is not None or text is not None:
            raise Refused("run.completed names a winner_wave or winner_text, and no winner_lane")
        return
    placed = isinstance(number, int) and (wave is None or isinstance(wave, int))
    if not placed or isinstance(number, bool) or isinstance(wave, bool):
        raise Refused(f"run.completed's winner (lane {number!r}, wave {wave!r}) is not a lane's place")
    within = _reduced_waves(state, result)
    if within is not None and wave is not None:
        named = reduce.winner_wave if reduce is not None else None
        expected = named if named is not None else within[0] if len(within) == 1 else None
        if wave not in within or expected not in (None, wave):
            raise Refused(
                f"run.completed says winner_wave = {wave}, the log's reduce gives "
                f"{expected if expected is not None else f'one of waves {within}'}"
            )
    if "winner_wave" in result:
        found = winning_lane(state, number, wave, within)
        texts = [found[1].text] if found is not None else []
    else:  # written before results named the wave: the text of a lane of that number
        numbers = within if within is not None else sorted(state.waves)
        texts = [state.waves[n].lanes[number].text for n in numbers if number in state.waves[n].lanes]
        found = winning_lane(state, number, None, within)
    if found is None:
        where = f" of wave {wave}" if wave is not None else ""
        raise Refused(f"run.completed's winner is lane {number}{where}, which never ran")
    if text not in texts:
        raise Refused(
            f"run.completed says winner_text = {_shown(text)}, lane {number} of wave {found[0]} "
            f"wrote {_shown(found[1].text)}"
        )
