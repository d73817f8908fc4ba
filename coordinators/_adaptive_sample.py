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

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from pydantic import BaseModel

from lanefold.coordinators._adaptive_rule import (
    AdaptiveSampleParams,
    decision,
    majority_posterior,
    settled,
    top_two,
)
from lanefold.coordinators._audit import (
    answers,
    candidate_lanes,
    claims,
    earliest,
    outcome,
    records,
    reduced_status,
    waves_of,
)
from lanefold.coordinators._parallel_sample import outcome_of
from lanefold.primitives import (
    Allowance,
    AuditFinding,
    BudgetExhaustedError,
    CostShape,
    ExtractSpec,
    Lane,
    LaneJob,
    LoopContext,
    Outcome,
    QuorumNotMetError,
    ReducerChoice,
    RunState,
    WaveShape,
    largest_within,
    register_loop,
)

__all__ = (
    "AdaptiveSample",
    "AdaptiveSampleParams",
    "decision",
    "majority_posterior",
    "settled",
    "top_two",
)


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
        """The decision at a barrier (or before the first wave), the budget read as it stands."""
        return decision(
            self.params,
            lanes,
            last,
            cut=cut,
            affordable=lambda size: ctx.budget.can_afford(size, max_tokens, prompt=prompt),
        )

    @staticmethod
    def candidates(params: AdaptiveSampleParams, state: RunState) -> list[Lane]:
        """Its reduce read every lane of every wave, in the order they ran."""
        return candidate_lanes(state, waves_of(state, "sample"))

    @staticmethod
    def audit(
        params: AdaptiveSampleParams, state: RunState, *, extract: ExtractSpec, seed: int
    ) -> AuditFinding | None:
        """Each answer is the extractor's; each `checked` record is the decision its rule
        gives from the lanes before it (a stop for the budget is the writer's reading of its
        ledger, taken as recorded where the rule let sampling go on; in a log whose vote records
        no quorum, written before the quorum counted answers, a stop the rule gave then reads
        too); each wave is the one its decision allowed; the outcome and the status are what
        they give."""
        waves = waves_of(state, "sample")
        found = answers(state, waves, extract)
        checked = records(state, AdaptiveSample.name, "checked")
        vote = state.reduce.detail if state.reduce is not None else {}
        then = (False, True) if params.min_quorum > 1 and "quorum" not in vote else (False,)
        lanes: list[Lane] = []
        last: list[Lane] = []
        cut, stopped_by = False, None
        for i, record in enumerate(checked):
            for before_answers in then:
                expected = decision(
                    params, lanes, last, cut=cut, affordable=lambda size: True, before_answers=before_answers
                )
                if record.data.get("stopped_by") == "budget" and expected["stopped_by"] is None:
                    expected |= {"stopped_by": "budget", "next": None}
                wrong = claims(record.sequence, f"loop.{AdaptiveSample.name}.checked", record.data, expected)
                if wrong is None:
                    break
            stopped_by, size = expected["stopped_by"], expected["next"]
            if wrong is None and stopped_by is not None and len(waves) > i:
                wrong = record.sequence, f"the run stops here ({stopped_by}), and wave {waves[i]} follows"
            if wrong is None and stopped_by is None and i < len(waves):
                wrong = _allowed(state, waves[i], len(lanes), size, record.sequence)
            if wrong is not None:
                return earliest(found, wrong)
            if stopped_by is not None or i >= len(waves):
                break  # the run stopped here (or was cut before the wave this one allowed)
            last = candidate_lanes(state, [waves[i]])
            lanes += last
            cut = len(last) < size
        detail = {
            "lanes_used": len(lanes),
            "stopped_by": stopped_by,
            "waves": len(waves),
            "rule": params.rule,
            "completed": sum(lane.completed for lane in lanes),
        }
        return earliest(
            found, outcome(state, detail, budget_stop=stopped_by == "budget"), reduced_status(state)
        )


def _allowed(state: RunState, number: int, start: int, size: int, line: int) -> AuditFinding | None:
    """Wave `number` asked for the `size` lanes its decision allowed, numbered from `start`."""
    info = state.waves[number].info
    allowed = range(start, start + size)
    if info.k_requested != size or not set(info.lanes or allowed) <= set(allowed):
        return line, f"wave {number} is not the wave of {size} lanes from lane {start} this decision allows"
    return None
