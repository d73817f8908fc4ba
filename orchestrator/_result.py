"""The result of a run: what `--json`, `show --json` and `resume --json` print."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from coordinators import LoopOutcome
from primitives import RunState, Spend

__all__ = ("CostBreakdown", "LaneResult", "RunResult", "UsageBreakdown", "result_from_state")

SAMPLE_WAVE = 1


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
        return cls(prefill_tokens=spend.prefill_tokens,
                   cached_prefill_tokens=spend.cached_prefill_tokens,
                   decode_tokens=spend.decode_tokens, verifier_tokens=spend.verifier_tokens,
                   cut_off_tokens=spend.cut_off_tokens,
                   kv_token_seconds=spend.kv_token_seconds, requests=spend.requests)


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
        return cls(prefill=spend.prefill_usd, cached_prefill=spend.cached_prefill_usd,
                   decode=spend.decode_usd, kv_residency=spend.kv_residency_usd,
                   verifier=spend.verifier_usd, cut_off=spend.cut_off_usd, total=spend.cost_usd)


class LaneResult(BaseModel):
    """One sampled lane as the result reports it."""

    model_config = ConfigDict(frozen=True)

    lane: int
    status: str  # completed, failed, interrupted, pending
    answer: str | None
    score: float | None
    finish_reason: str | None
    tokens: int  # output tokens the lane decoded
    attempts: int


class RunResult(BaseModel):
    """One finished run: the answer, how it was reached, what it cost, where its log is.

    `status` is "answered", or "no_answer" when no lane gave an extractable answer or no
    candidate got a score (then `answer` is None and `reason` says why; the CLI exits 4).
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Literal["answered", "no_answer"] = "answered"
    reason: str | None = None
    question: str
    answer: str | None
    winner_lane: int | None
    winner_text: str | None = None
    reducer: str
    votes: dict[str, float]
    scores: dict[int, float | None]
    tie_break: str
    agreement: float | None = None
    margin: float | None = None
    lanes_completed: int
    lanes_failed: int
    lanes: list[LaneResult] = []
    usage: UsageBreakdown
    cost: CostBreakdown
    elapsed_s: float
    resumes: int
    events: str | None


def result_from_state(state: RunState, outcome: LoopOutcome, spend: Spend, elapsed_s: float,
                      events: str | None) -> RunResult:
    """Assemble the result from the loop's outcome and the ledger's bill."""
    wave = state.waves.get(SAMPLE_WAVE)
    lanes = [] if wave is None else [
        LaneResult.model_construct(  # our own values: thousands of lanes skip re-validation
            lane=s.lane, status=s.status, answer=s.answer, score=outcome.scores.get(s.lane),
            finish_reason=s.finish_reason,
            tokens=s.usage.output_tokens if s.status == "completed" and s.usage else 0,
            attempts=s.attempts)
        for _, s in sorted(wave.lanes.items())]
    return RunResult(
        run_id=state.run_id or "", status=outcome.status, reason=outcome.reason,
        question=state.started.question if state.started else "",
        answer=outcome.answer, winner_lane=outcome.winner_lane, winner_text=outcome.winner_text,
        reducer=outcome.reducer, votes=outcome.votes, scores=outcome.scores,
        tie_break=outcome.tie_break, agreement=outcome.agreement, margin=outcome.margin,
        lanes_completed=outcome.lanes_completed, lanes_failed=outcome.lanes_failed, lanes=lanes,
        usage=UsageBreakdown.of(spend), cost=CostBreakdown.of(spend),
        elapsed_s=round(elapsed_s, 6), resumes=state.resumes, events=events)
