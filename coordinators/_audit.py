"""The audit of a parallel-sample log: what its events claim must follow from what it holds.

The fold already refuses a line that is not the run's own (another run's id, a lane never
dispatched, a second completion). This goes one level up, to what only the loop knows: each
lane's answer is what the extractor finds in its text, the reduce is what the lanes' answers
(or the judges' scores) give, and the result is the reduce's. An edited answer, vote or
result is named by its line instead of being believed.
"""

from __future__ import annotations

from typing import Any

from lanefold.coordinators._reducer_keys import TieBreak, Weighting
from lanefold.coordinators._reducers import logprob_weights, vote
from lanefold.primitives import (
    ExtractSpec,
    Lane,
    RunState,
    extract_answer,
    judge_argmax,
    normalize_answer,
)

SAMPLE_WAVE = 1

__all__ = ("audit",)


def audit(
    state: RunState,
    *,
    extract: ExtractSpec,
    tie_break: TieBreak = "first_lane",
    weighting: Weighting = "none",
    seed: int = 0,
    min_quorum: int = 1,
) -> tuple[int, str] | None:
    """The first claim of the log that does not follow from it: (line, what is wrong)."""
    wave = state.waves.get(SAMPLE_WAVE)
    if wave is None or wave.info.purpose != "sample":
        return None
    for lane in wave.completed():
        found = extract_answer(lane.text or "", extract)
        if found != lane.answer:
            return (
                lane.landed_at or 0,
                f"lane {lane.lane}'s answer {lane.answer!r} is not what "
                f"the extractor finds in its text ({found!r})",
            )
    reduce = state.reduce
    if reduce is None or state.reduce_sequence is None:
        return None
    if reduce.reducer == "majority_vote":
        lanes = [Lane.of(wave.wave, s) for _, s in sorted(wave.lanes.items())]
        weights = logprob_weights(lanes) if weighting == "mean_logprob" else None
        # The quorum of answers the vote was held to (a log written before it had one: 1).
        quorum = reduce.detail.get("quorum", 1)
        if quorum not in (1, min_quorum):
            return (state.reduce_sequence, f"reduce.completed's quorum {quorum!r} is not the loop's")
        got = vote(lanes, tie_break=tie_break, seed=seed, weights=weights, quorum=quorum)
        if (got.winner, got.winner_lane, dict(got.votes), got.abstentions) != (
            reduce.winner,
            reduce.winner_lane,
            dict(reduce.votes),
            reduce.abstentions,
        ):
            return (
                state.reduce_sequence,
                "reduce.completed does not follow from the lanes' "
                f"answers (they give {got.winner!r} at lane {got.winner_lane})",
            )
    elif reduce.reducer == "judge_argmax":
        scores = dict(state.scores)
        answers = {s.lane: normalize_answer(s.answer) if s.answer else None for s in wave.completed()}
        best = judge_argmax(scores, tie_break=tie_break, seed=seed, answers=answers)
        if (best.winner_lane, best.abstentions) != (reduce.winner_lane, reduce.abstentions) or scores != dict(
            reduce.scores
        ):
            return (
                state.reduce_sequence,
                "reduce.completed does not follow from the judges' "
                f"scores (they give lane {best.winner_lane})",
            )
    result = state.result
    if result is None or state.result_sequence is None:
        return None
    claims = {
        "run_id": state.run_id,
        "answer": reduce.winner,
        "winner_lane": reduce.winner_lane,
        "votes": dict(reduce.votes),
        "agreement": reduce.agreement,
        "margin": reduce.margin,
        "question": state.started.question if state.started else None,
    }
    for key, expected in claims.items():
        if result.get(key) != expected:
            return (
                state.result_sequence,
                f"run.completed says {key} = {result.get(key)!r}, the log gives {expected!r}",
            )
    recorded_scores = {int(k): v for k, v in (result.get("scores") or {}).items()}
    if recorded_scores != dict(reduce.scores):
        return (state.result_sequence, "run.completed's scores are not the reduce's")
    reported: list[dict[str, Any]] = result.get("lanes") or []  # the fold checked their shape
    if [lane.get("score") for lane in reported] != [
        reduce.scores.get(lane.get("lane", -1)) for lane in reported
    ]:
        return (state.result_sequence, "run.completed's lane scores are not the reduce's")
    return None
