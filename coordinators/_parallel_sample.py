"""parallel_sample: SAMPLE one governed wave of K lanes -> barrier -> REDUCE.

Self-consistency with `reducer = "majority_vote"`, best-of-N with `"judge_argmax"` (an LLM
judge wave through the same dispatch path and budget, priced as verifier, or a verifier), or
any registered reducer. The K lanes share one prompt, so they travel as one request where the
backend shares the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from primitives import (
    ConfigError,
    Lane,
    LoopContext,
    Outcome,
    ReduceOptions,
    Reduction,
    register_loop,
    resolve_reducer,
)

__all__ = ("ParallelSample", "ParallelSampleParams", "outcome_of")

TieBreak = Literal["first_lane", "lexicographic", "random"]
Weighting = Literal["none", "mean_logprob", "verifier"]


class ParallelSampleParams(BaseModel):
    """`[loop]` keys of parallel_sample."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(8, ge=1, le=100_000, description="lanes sampled")
    reducer: str = Field("majority_vote", description="a registered reducer")
    min_quorum: int = Field(1, ge=1, description="lanes that must complete")
    tie_break: TieBreak = "first_lane"
    weighting: Weighting = "none"

    @field_validator("reducer")
    @classmethod
    def _known_reducer(cls, value: str) -> str:
        try:
            resolve_reducer(value)
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("loop.reducer: ")) from None
        return value

    @model_validator(mode="after")
    def _quorum(self) -> ParallelSampleParams:
        if self.min_quorum > self.k:
            raise ValueError(f"loop.min_quorum: {self.min_quorum} is more than loop.k ({self.k})")
        if self.weighting == "verifier" and self.reducer != "weighted_vote":
            raise ValueError(f"loop.weighting: \"verifier\" weighs a weighted_vote; the "
                             f"{self.reducer} reducer would ignore it")
        return self


@register_loop
class ParallelSample:
    """K independent lanes of one prompt, joined at a barrier and reduced to one answer."""

    name: ClassVar[str] = "parallel_sample"
    Params: ClassVar[type[BaseModel]] = ParallelSampleParams

    def __init__(self, params: ParallelSampleParams | None = None) -> None:
        self.params = params or ParallelSampleParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        params = ctx.sampling
        if _weighs_logprobs(p) and not params.logprobs:
            params = replace(params, logprobs=True)
        lanes = await ctx.wave([ctx.prompt(question)] * p.k, params=params, quorum=p.min_quorum)
        reduction = await ctx.reduce(lanes, p.reducer, options=ReduceOptions(
            tie_break=p.tie_break, weighting=p.weighting, seed=ctx.seed))
        return outcome_of(reduction, lanes)


def _weighs_logprobs(p: ParallelSampleParams) -> bool:
    """Whether the reducer weighs lanes by their mean token logprob (so must ask for them)."""
    return p.weighting == "mean_logprob" or (p.reducer == "weighted_vote"
                                             and p.weighting == "none")


def outcome_of(reduction: Reduction, lanes: Sequence[Lane]) -> Outcome:
    """The Outcome a reduction over `lanes` gives: its answer, winner, agreement and margin."""
    wave = reduction.winner_wave
    winner = next((lane for lane in lanes if lane.lane == reduction.winner_lane
                   and wave in (None, lane.wave)), None)
    answered = reduction.winner_lane is not None
    return Outcome(
        answer=reduction.winner, winner_lane=reduction.winner_lane,
        winner_text=winner.text if winner is not None else None,
        status="answered" if answered else "no_answer",
        reason=None if answered else reduction.reason, agreement=reduction.agreement,
        margin=reduction.margin, reduction=reduction,
        winner_wave=winner.wave if winner is not None else None)
