"""parallel_sample: SAMPLE one governed wave of K lanes -> barrier -> REDUCE.

Self-consistency with `reducer = "majority_vote"`, best-of-N with `"judge_argmax"` (an LLM
judge wave through the same dispatch path and budget, priced as verifier, or a verifier), or
any registered reducer. The K lanes share one prompt, so they travel as one request where the
backend shares the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, Field, model_validator

from lanefold.coordinators._audit import answers, candidate_lanes, earliest, reduced_status
from lanefold.coordinators._reducer_keys import ReducerKeys
from lanefold.primitives import (
    Allowance,
    AuditFinding,
    CostShape,
    ExtractSpec,
    Lane,
    LoopContext,
    Outcome,
    ReduceOptions,
    ReducerChoice,
    Reduction,
    RunState,
    WaveShape,
    largest_within,
    register_loop,
)

__all__ = ("ParallelSample", "ParallelSampleParams", "outcome_of")


class ParallelSampleParams(ReducerKeys):
    """`[loop]` keys of parallel_sample (`reducer`, `tie_break`, `weighting` shared)."""

    k: int = Field(8, ge=1, le=100_000, description="lanes sampled")
    min_quorum: int = Field(
        1, ge=1, description="lanes that must complete, and give an answer for a vote to name one"
    )

    @model_validator(mode="after")
    def _quorum(self) -> ParallelSampleParams:
        if self.min_quorum > self.k:
            raise ValueError(f"loop.min_quorum: {self.min_quorum} is more than loop.k ({self.k})")
        return self

    def options(self, seed: int) -> ReduceOptions:
        """The reducer's options: a vote names a winner only once `min_quorum` lanes gave an
        answer (a lane that completed with nothing extracted casts no ballot)."""
        return replace(super().options(seed), quorum=self.min_quorum)


@register_loop
class ParallelSample:
    """K independent lanes of one prompt, joined at a barrier and reduced to one answer."""

    name: ClassVar[str] = "parallel_sample"
    Params: ClassVar[type[BaseModel]] = ParallelSampleParams

    def __init__(self, params: ParallelSampleParams | None = None) -> None:
        self.params = params or ParallelSampleParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        lanes = await ctx.wave(
            [ctx.prompt(question)] * p.k, params=p.sampling(ctx.sampling), quorum=p.min_quorum
        )
        reduction = await ctx.reduce(lanes, p.reducer, options=p.options(ctx.seed))
        return outcome_of(reduction, lanes)

    @staticmethod
    def cost_shape(params: ParallelSampleParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        """k lanes of the one prompt in one wave, every one a candidate."""
        return CostShape.of([WaveShape(params.k, prompt_tokens)], candidates=params.k)

    @staticmethod
    def fit(params: ParallelSampleParams, budget: Allowance) -> ParallelSampleParams:
        """Under a lane budget, k at most the budget (the quorum with it); under tokens or
        cost, the k whose expected spend fills the budget (as configured where its price is
        not known: the per-question limit shrinks a wave it cannot fund)."""
        if budget.unit == "lanes":
            k = min(params.k, int(budget.amount))
        else:
            found = largest_within(budget, 1, lambda n: params.model_copy(update={"k": n}))
            if found is None:
                return params
            k = found
        return params.model_copy(update={"k": k, "min_quorum": min(params.min_quorum, k)})

    @staticmethod
    def pool(params: ParallelSampleParams) -> int | None:
        """k, where a plain first-lane majority vote reduces the one wave: the lanes of fewer
        are then a subset of these, and a curve reads any k' <= k from them."""
        plain = ("majority_vote", "none", "first_lane")
        return params.k if (params.reducer, params.weighting, params.tie_break) == plain else None

    @staticmethod
    def reducer(params: ParallelSampleParams) -> ReducerChoice:
        return params.choice()

    @staticmethod
    def candidates(params: ParallelSampleParams, state: RunState) -> list[Lane]:
        """Its reduce read every lane of its one wave."""
        return candidate_lanes(state, [1])

    @staticmethod
    def audit(
        params: ParallelSampleParams, state: RunState, *, extract: ExtractSpec, seed: int
    ) -> AuditFinding | None:
        """Each lane's answer is the extractor's, and the run answered where its reduce found
        a winner (the reduce itself is re-run over the lanes: `candidates`)."""
        return earliest(answers(state, [1], extract), reduced_status(state))


def outcome_of(reduction: Reduction, lanes: Sequence[Lane]) -> Outcome:
    """The Outcome a reduction over `lanes` gives: its answer, winner, agreement and margin."""
    wave = reduction.winner_wave
    winner = next(
        (lane for lane in lanes if lane.lane == reduction.winner_lane and wave in (None, lane.wave)), None
    )
    answered = reduction.winner_lane is not None
    return Outcome(
        answer=reduction.winner,
        winner_lane=reduction.winner_lane,
        winner_text=winner.text if winner is not None else None,
        status="answered" if answered else "no_answer",
        reason=None if answered else reduction.reason,
        agreement=reduction.agreement,
        margin=reduction.margin,
        reduction=reduction,
        winner_wave=winner.wave if winner is not None else None,
    )
