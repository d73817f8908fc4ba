"""The result of a run: what `--json`, `show --json` and `resume --json` print."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from coordinators import LoopOutcome
from primitives import Spend
from primitives._state import RunState

__all__ = ("CostBreakdown", "RunResult", "UsageBreakdown", "result_from_state")


class UsageBreakdown(BaseModel):
    """Tokens by line of the bill."""

    model_config = ConfigDict(frozen=True)

    prefill_tokens: int  # prompt tokens computed
    cached_prefill_tokens: int  # prompt tokens served from a shared prefix or cache
    decode_tokens: int
    verifier_tokens: int
    kv_token_seconds: float
    requests: int

    @classmethod
    def of(cls, spend: Spend) -> UsageBreakdown:
        return cls(prefill_tokens=spend.prefill_tokens,
                   cached_prefill_tokens=spend.cached_prefill_tokens,
                   decode_tokens=spend.decode_tokens, verifier_tokens=spend.verifier_tokens,
                   kv_token_seconds=spend.kv_token_seconds, requests=spend.requests)


class CostBreakdown(BaseModel):
    """USD by line of the bill."""

    model_config = ConfigDict(frozen=True)

    prefill: float
    cached_prefill: float
    decode: float
    kv_residency: float
    verifier: float
    total: float

    @classmethod
    def of(cls, spend: Spend) -> CostBreakdown:
        return cls(prefill=spend.prefill_usd, cached_prefill=spend.cached_prefill_usd,
                   decode=spend.decode_usd, kv_residency=spend.kv_residency_usd,
                   verifier=spend.verifier_usd, total=spend.cost_usd)


class RunResult(BaseModel):
    """One finished run: the answer, how it was reached, what it cost, where its log is."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: str = "completed"
    question: str
    answer: str | None
    winner_lane: int | None
    reducer: str
    votes: dict[str, float]
    scores: dict[int, float | None]
    tie_break: str
    lanes_completed: int
    lanes_failed: int
    usage: UsageBreakdown
    cost: CostBreakdown
    elapsed_s: float
    resumes: int
    events: str | None


def result_from_state(state: RunState, outcome: LoopOutcome, spend: Spend, elapsed_s: float,
                      events: str | None) -> RunResult:
    """Assemble the result from the loop's outcome and the ledger's bill."""
    return RunResult(
        run_id=state.run_id or "", question=state.started.question if state.started else "",
        answer=outcome.answer, winner_lane=outcome.winner_lane, reducer=outcome.reducer,
        votes=outcome.votes, scores=outcome.scores, tie_break=outcome.tie_break,
        lanes_completed=outcome.lanes_completed, lanes_failed=outcome.lanes_failed,
        usage=UsageBreakdown.of(spend), cost=CostBreakdown.of(spend),
        elapsed_s=round(elapsed_s, 6), resumes=state.resumes, events=events)
