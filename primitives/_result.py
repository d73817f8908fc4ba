"""The result of a run: what `--json`, `show --json` and `resume --json` print, what `run.completed`
records and what a hook's `on_run_end` is handed.

It lives in primitives, beside the events it is made from, so the Hook protocol can name it: its
fields are the fold's (`RunState`), the loop's `Outcome` and the ledger's `Spend`, all of them
primitives'. `lanefold.RunResult` is this class.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lanefold.primitives._answers import normalize_answer
from lanefold.primitives._budget import Spend
from lanefold.primitives._errors import LanefoldError, RunError
from lanefold.primitives._loop import Outcome
from lanefold.primitives._state import LaneState, RunState

__all__ = (
    "CostBreakdown",
    "LaneResult",
    "RunFailure",
    "RunResult",
    "UsageBreakdown",
    "failed_result",
    "result_from_state",
)


class UsageBreakdown(BaseModel):
    """Tokens by line of the bill."""

    model_config = ConfigDict(frozen=True)

    prefill_tokens: int  # prompt tokens computed
    cached_prefill_tokens: int  # prompt tokens served from a shared prefix or cache
    decode_tokens: int
    verifier_tokens: int
    cut_off_tokens: int = 0  # holds charged for attempts cut off (crash, interrupt, timeout)
    kv_token_seconds: float
    requests: int

    @classmethod
    def of(cls, spend: Spend) -> UsageBreakdown:
        return cls(
            prefill_tokens=spend.prefill_tokens,
            cached_prefill_tokens=spend.cached_prefill_tokens,
            decode_tokens=spend.decode_tokens,
            verifier_tokens=spend.verifier_tokens,
            cut_off_tokens=spend.cut_off_tokens,
            kv_token_seconds=spend.kv_token_seconds,
            requests=spend.requests,
        )


class CostBreakdown(BaseModel):
    """USD by line of the bill."""

    model_config = ConfigDict(frozen=True)

    prefill: float
    cached_prefill: float
    decode: float
    kv_residency: float
    verifier: float
    cut_off: float = 0.0
    total: float

    @classmethod
    def of(cls, spend: Spend) -> CostBreakdown:
        return cls(
            prefill=spend.prefill_usd,
            cached_prefill=spend.cached_prefill_usd,
            decode=spend.decode_usd,
            kv_residency=spend.kv_residency_usd,
            verifier=spend.verifier_usd,
            cut_off=spend.cut_off_usd,
            total=spend.cost_usd,
        )


class LaneResult(BaseModel):
    """One sampled lane as the result reports it."""

    model_config = ConfigDict(frozen=True)

    lane: int
    wave: int = 1
    status: str  # completed, failed, interrupted, pending
    answer: str | None
    # why a completed lane has no answer, where the extractor says (an invalid call or value)
    answer_error: str | None = Field(None, exclude_if=lambda v: v is None)
    score: float | None
    finish_reason: str | None
    tokens: int  # output tokens the lane decoded
    attempts: int


class RunFailure(BaseModel):
    """Why a run failed, where a batch returns failures instead of raising them: the error's
    class, the exit code the command line would give for it, and its one-line message."""

    model_config = ConfigDict(frozen=True)

    type: str
    exit_code: int
    message: str


class RunResult(BaseModel):
    """One finished run: the answer, how it was reached, what it cost, where its log is.

    `status` is "answered", or "no_answer" when no lane gave an extractable answer or no
    candidate got a score (then `answer` is None and `reason` says why; the CLI exits 4), or
    "failed" where a caller asked for failures as results (`errors="return"`): then `error`
    says why, and usage, cost and lanes are what the run's log holds.
    `reducer`, `votes`, `scores` and `tie_break` are the reduction's, where a reducer decided
    (`votes`: each answer's ballot count, an integer, or its total weight in a weighted vote);
    `outcome` is the loop's own detail; `lanes` are the lanes priced as samples, every wave's.
    `winner_wave` and `winner_lane` say which lane won, `winner_text` is that lane's text as
    its `lane.completed` holds it (None where no lane won).
    `index` is the question's position, in results from `Session.run_many`.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Literal["answered", "no_answer", "failed"] = "answered"
    reason: str | None = None
    error: RunFailure | None = Field(None, exclude_if=lambda v: v is None)
    question: str
    answer: str | None
    winner_lane: int | None
    winner_wave: int | None = None
    winner_text: str | None = None
    reducer: str = ""
    votes: dict[str, int] | dict[str, float] = {}  # ballot counts; total weights if weighted
    scores: dict[int, float | None] = {}
    tie_break: str = "none"
    agreement: float | None = None
    margin: float | None = None
    lanes_completed: int
    lanes_failed: int
    lanes_answered: int = 0  # sampled lanes that completed with an answer: the vote's ballots
    lanes: list[LaneResult] = []
    usage: UsageBreakdown
    cost: CostBreakdown
    elapsed_s: float
    resumes: int
    events: str | None
    outcome: dict[str, Any] = {}
    index: int | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="before")
    @classmethod
    def _answered(cls, data: Any) -> Any:
        """A result recorded before `lanes_answered` existed: counted from its lanes."""
        if isinstance(data, dict) and "lanes_answered" not in data:
            lanes = [lane if isinstance(lane, dict) else vars(lane) for lane in data.get("lanes") or []]
            count = sum(_gave_answer(lane.get("status"), lane.get("answer")) for lane in lanes)
            data = {**data, "lanes_answered": count}
        return data


def _count_answered(lanes: Iterable[LaneResult]) -> int:
    """The lanes that completed with an answer (one that does not normalise to nothing): the
    ballots a vote counts, the N of "N of M lanes answered"."""
    return sum(_gave_answer(lane.status, lane.answer) for lane in lanes)


def _gave_answer(status: object, answer: object) -> bool:
    return status == "completed" and isinstance(answer, str) and bool(normalize_answer(answer))


def _lanes(state: RunState, outcome: Outcome | None) -> list[LaneResult]:
    return [
        LaneResult.model_construct(  # our own values: thousands of lanes skip re-validation
            lane=s.lane,
            wave=w.wave,
            status=s.status,
            answer=s.answer,
            answer_error=s.answer_error,
            score=_score(outcome, w.wave, s.lane) if outcome is not None else None,
            finish_reason=s.finish_reason,
            tokens=s.usage.output_tokens if s.status == "completed" and s.usage else 0,
            attempts=s.attempts,
        )
        for _, w in sorted(state.waves.items())
        if w.info.bill == "sample"
        for _, s in sorted(w.lanes.items())
    ]


def failed_result(
    run_id: str, question: str, error: LanefoldError, state: RunState | None, events: str | None
) -> RunResult:
    """A run that raised `error`, as a result: what its log (`state`, None when it has none)
    says it spent and which lanes it ran. A run whose log records its failure is described
    by that record (a failed run resumed says the same as when it failed)."""
    state = state or RunState()
    spend = state.spend
    lanes = _lanes(state, None)
    failure = state.failure
    return RunResult(
        run_id=run_id,
        status="failed",
        reason=None,
        error=RunFailure(
            type=failure.error, exit_code=failure.exit_code, message=" ".join(failure.message.split())
        )
        if failure is not None
        else RunFailure(
            type=type(error).__name__, exit_code=error.exit_code, message=" ".join(str(error).split())
        ),
        question=question,
        answer=None,
        winner_lane=None,
        lanes_completed=sum(lane.status == "completed" for lane in lanes),
        lanes_failed=sum(lane.status == "failed" for lane in lanes),
        lanes_answered=_count_answered(lanes),
        lanes=lanes,
        usage=UsageBreakdown.of(spend),
        cost=CostBreakdown.of(spend),
        elapsed_s=round(state.active_seconds(), 6),
        resumes=state.resumes,
        events=events,
    )


def result_from_state(
    state: RunState,
    outcome: Outcome,
    spend: Spend,
    elapsed_s: float,
    events: str | None,
    *,
    coordinator: str | None = None,
) -> RunResult:
    """Assemble the result from the loop's outcome and the ledger's bill."""
    waves = [w for _, w in sorted(state.waves.items()) if w.info.bill == "sample"]
    lanes = _lanes(state, outcome)
    reduction = outcome.reduction
    winner = _winner(state, outcome)
    return RunResult(
        run_id=state.run_id or "",
        status="answered" if outcome.answered else "no_answer",
        reason=None if outcome.answered else outcome.reason or "the loop gave no answer",
        question=state.started.question if state.started else "",
        answer=outcome.answer,
        winner_lane=outcome.winner_lane,
        winner_wave=winner[0] if winner is not None else None,
        winner_text=winner[1].text if winner is not None else None,
        reducer=reduction.reducer
        if reduction
        else coordinator or (state.started.coordinator if state.started else ""),
        votes=dict(reduction.votes) if reduction else {},
        scores=dict(reduction.scores) if reduction else {},
        tie_break=reduction.tie_break if reduction else "none",
        # A reduction's own summary (what its reduce.completed records), else the loop's.
        agreement=reduction.agreement if reduction else outcome.agreement,
        margin=reduction.margin if reduction else outcome.margin,
        lanes_completed=sum(len(w.completed()) for w in waves),
        lanes_failed=sum(len(w.failed()) for w in waves),
        lanes_answered=_count_answered(lanes),
        lanes=lanes,
        usage=UsageBreakdown.of(spend),
        cost=CostBreakdown.of(spend),
        elapsed_s=round(elapsed_s, 6),
        resumes=state.resumes,
        events=events,
        outcome=json.loads(json.dumps(dict(outcome.detail), default=str)),
    )


def _winner(state: RunState, outcome: Outcome) -> tuple[int, LaneState] | None:
    """The lane the loop says won, found in the log: on the wave the outcome (or its
    reduction) names, else by `RunState.winning_lane`'s rule. Its text is the result's
    `winner_text`, whatever the outcome's says, so the record holds nothing the fold cannot
    check."""
    number = outcome.winner_lane
    if number is None:
        return None
    reduction, wave = outcome.reduction, outcome.winner_wave
    if wave is None and reduction is not None and reduction.winner_lane == number:
        wave = reduction.winner_wave
    within = state.reduction_waves.get(1) if reduction is not None else None
    found = state.winning_lane(number, wave, within)
    if found is None:
        where = f" of wave {wave}" if wave is not None else ""
        raise RunError(f"the loop's winner_lane {number}{where} is no lane the run ran")
    return found


def _score(outcome: Outcome, wave: int, lane: int) -> float | None:
    reduction = outcome.reduction
    if reduction is None or reduction.wave not in (None, wave):
        return None
    return reduction.scores.get(lane)
