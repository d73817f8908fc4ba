"""adaptive_sample: waves of `window` lanes until a stopping rule fires -> REDUCE.

Early-stop self-consistency. After each wave's barrier the loop tallies every answer so far and
asks its rule whether the vote is settled: `esc` (the last window agrees; Li et al. 2024),
`beta` (the posterior that the leader is the majority, `P(Bin(a+b+1, 1/2) <= a)`, reaches
`threshold`; Aggarwal et al. 2023) or `margin` (the leader can no longer be overtaken within
`max_lanes`). It also stops at `max_lanes`, or when the budget cannot fund the next wave; no
budget is held for waves that do not run. The answer is the configured reducer over every lane.

Each decision is recorded (`loop.adaptive_sample.checked`) before the wave it allows starts,
and a replay follows the recorded decision, so a resumed run takes the path the first one took
even where the budget, which a replay sees fuller, would now decide otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from math import comb
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from lanefold.coordinators._parallel_sample import outcome_of
from lanefold.coordinators._reducer_keys import ReducerKeys
from lanefold.primitives import (
    Allowance,
    BudgetExhaustedError,
    CostShape,
    Lane,
    LaneJob,
    LoopContext,
    Outcome,
    QuorumNotMetError,
    ReduceOptions,
    ReducerChoice,
    WaveShape,
    largest_within,
    normalize_answer,
    register_loop,
)

__all__ = ("AdaptiveSample", "AdaptiveSampleParams", "majority_posterior", "settled", "top_two")

Rule = Literal["esc", "beta", "margin"]


class AdaptiveSampleParams(ReducerKeys):
    """`[loop]` keys of adaptive_sample."""

    window: int = Field(4, ge=1, le=10_000, description="lanes per wave")
    max_lanes: int = Field(40, ge=1, le=10_000, description="lanes at most, over all waves")
    rule: Rule = Field("beta", description="the stopping rule checked at each barrier")
    threshold: float = Field(0.95, gt=0.5, le=1, description="posterior the beta rule needs")
    reducer: str = Field("majority_vote", description="a registered reducer, over every lane")
    min_quorum: int = Field(
        1, ge=1, description="lanes that gave an answer before a rule may stop (and for the vote)"
    )

    @model_validator(mode="after")
    def _across_keys(self) -> AdaptiveSampleParams:
        if self.max_lanes < self.window:
            raise ValueError(f"loop.max_lanes: {self.max_lanes} is less than loop.window ({self.window})")
        if self.rule == "esc" and self.window < 2:
            raise ValueError(
                "loop.window: the esc rule stops when a window agrees, and a window "
                "of 1 always does; give window >= 2"
            )
        if self.min_quorum > self.max_lanes:
            raise ValueError(
                f"loop.min_quorum: {self.min_quorum} is more than loop.max_lanes ({self.max_lanes})"
            )
        return self

    def options(self, seed: int) -> ReduceOptions:
        """The reducer's options: the vote names a winner only once `min_quorum` lanes gave an
        answer, as a rule stops only then."""
        return replace(super().options(seed), quorum=self.min_quorum)


def majority_posterior(a: int, b: int) -> Fraction:
    """P(Bin(a+b+1, 1/2) <= a): with a uniform prior, the posterior probability that the answer
    seen `a` times is more likely than the one seen `b` times (Adaptive-Consistency's Beta rule).
    Exact, so a threshold is met or not without rounding."""
    n = a + b + 1
    return Fraction(sum(comb(n, i) for i in range(a + 1)), 2**n)


def top_two(counts: Mapping[str, int]) -> tuple[str | None, int, int]:
    """The leading answer, its count `a` and the runner-up's count `b` (0 where none); of
    answers tied for the lead, the one counted first leads."""
    ranked = Counter(counts).most_common(2)
    leader, a = ranked[0] if ranked else (None, 0)
    return leader, a, ranked[1][1] if len(ranked) > 1 else 0


def settled(
    rule: Rule,
    counts: Mapping[str, int],
    last_window: Sequence[str | None],
    *,
    remaining: int,
    threshold: float,
) -> bool:
    """Whether `rule` stops sampling, given every answer's count so far, the answers of the
    last wave (None: that lane gave none) and the lanes `max_lanes` still allows."""
    _, a, b = top_two(counts)
    if a == 0:
        return False
    if rule == "esc":
        return bool(last_window) and None not in last_window and len(set(last_window)) == 1
    if rule == "beta":
        return majority_posterior(a, b) >= Fraction(threshold)
    return a - b > remaining  # margin: even every remaining lane for the runner-up cannot pass


@register_loop
class AdaptiveSample:
    """Sample a window at a time, stop as soon as the vote is settled, reduce every lane."""

    name: ClassVar[str] = "adaptive_sample"
    Params: ClassVar[type[BaseModel]] = AdaptiveSampleParams

    def __init__(self, params: AdaptiveSampleParams | None = None) -> None:
        self.params = params or AdaptiveSampleParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        sampling = p.sampling(ctx.sampling)
        prompt = ctx.prompt(question)
        lanes: list[Lane] = []
        last: list[Lane] = []
        waves, cut = 0, False
        while True:
            decision = ctx.record(
                "checked",
                self._check(ctx, prompt, lanes, last, cut, sampling.max_tokens),
                wave=last[0].wave if last else None,
            )
            stopped_by: str | None = decision["stopped_by"]
            if stopped_by is not None:
                break
            size = int(decision["next"])
            # Lanes are numbered across waves (0, 1, ...), so a lane's number is its place in
            # the run; its seed still differs per wave, as it derives from (wave, lane).
            jobs = [LaneJob(len(lanes) + i, prompt) for i in range(size)]
            last = await ctx.wave(jobs, params=sampling, quorum=0)
            lanes.extend(last)
            waves += 1
            cut = len(last) < size  # the budget shrank the wave: it cannot fund another

        completed = sum(lane.completed for lane in lanes)
        if completed < p.min_quorum:
            why = f"{len(lanes)} lanes ran, {completed} completed, below loop.min_quorum ({p.min_quorum})"
            if stopped_by == "budget":
                raise BudgetExhaustedError(f"budget: {why}")
            raise QuorumNotMetError(why)
        reduction = await ctx.reduce(lanes, p.reducer, options=p.options(ctx.seed))
        return replace(
            outcome_of(reduction, lanes),
            detail={
                "lanes_used": len(lanes),
                "stopped_by": stopped_by,
                "waves": waves,
                "rule": p.rule,
                "completed": completed,
                **({"budget_stop": True} if stopped_by == "budget" else {}),  # said only where it did
            },
        )

    @staticmethod
    def cost_shape(params: AdaptiveSampleParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        """At most max_lanes lanes of the one prompt in waves of `window` (the last one the
        rest), every one a candidate; each wave after the first sends the first's prompt again."""
        full, rest = divmod(params.max_lanes, params.window)
        sizes = [params.window] * full + ([rest] if rest else [])
        waves = [WaveShape(n, prompt_tokens, repeat=i > 0) for i, n in enumerate(sizes)]
        return CostShape.of(waves, candidates=params.max_lanes)

    @staticmethod
    def fit(params: AdaptiveSampleParams, budget: Allowance) -> AdaptiveSampleParams:
        """Under a lane budget, max_lanes at most the budget (window and quorum with it);
        under tokens or cost, the max_lanes whose expected spend fills the budget (as
        configured where its price is not known: the loop stops when the budget cannot fund a
        wave)."""
        if budget.unit == "lanes":
            most = min(params.max_lanes, int(budget.amount))
        else:

            def capped(n: int) -> AdaptiveSampleParams:
                return params.model_copy(update={"max_lanes": n, "window": min(params.window, n)})

            least = 2 if params.rule == "esc" else 1  # esc needs a window of two
            found = largest_within(budget, least, capped, most=10_000)
            if found is None:
                return params
            most = found
        return params.model_copy(
            update={
                "max_lanes": most,
                "window": min(params.window, most),
                "min_quorum": min(params.min_quorum, most),
            }
        )

    @staticmethod
    def reducer(params: AdaptiveSampleParams) -> ReducerChoice:
        return params.choice()

    def _check(
        self,
        ctx: LoopContext,
        prompt: str,
        lanes: Sequence[Lane],
        last: Sequence[Lane],
        cut: bool,
        max_tokens: int,
    ) -> dict[str, Any]:
        """The decision at a barrier (or before the first wave): what stopped, or the next
        wave's size; with the tally it was made from."""
        p = self.params
        counts = Counter(normalize_answer(lane.answer) for lane in lanes if lane.completed and lane.answer)
        counts.pop("", None)
        completed = sum(lane.completed for lane in lanes)
        remaining = p.max_lanes - len(lanes)
        window = [
            normalize_answer(lane.answer) or None if lane.completed and lane.answer else None for lane in last
        ]
        leader, a, b = top_two(counts)
        size = min(p.window, remaining)
        stopped_by: str | None = None
        if (
            lanes
            and sum(counts.values()) >= p.min_quorum  # lanes that gave an answer, not just ran
            and remaining > 0
            and settled(p.rule, counts, window, remaining=remaining, threshold=p.threshold)
        ):
            stopped_by = p.rule
        elif remaining <= 0:
            stopped_by = "max_lanes"
        elif cut or not ctx.budget.can_afford(size, max_tokens, prompt=prompt):
            stopped_by = "budget"
        return {
            "lanes_used": len(lanes),
            "completed": completed,
            "counts": dict(counts),
            "leader": leader,
            "a": a,
            "b": b,
            "posterior": float(majority_posterior(a, b)),
            "stopped_by": stopped_by,
            "next": None if stopped_by else size,
        }
