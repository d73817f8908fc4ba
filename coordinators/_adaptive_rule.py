"""adaptive_sample's keys and its stopping rule, as pure functions of the lanes so far.

The loop (`_adaptive_sample.py`) asks `decision` at each barrier and records what it says; the
audit of a log asks it again over the lanes the log holds, so a recorded decision its rule
does not give is refused. One rule, read by both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from math import comb
from typing import Any, Literal

from pydantic import Field, model_validator

from lanefold.coordinators._reducer_keys import ReducerKeys
from lanefold.primitives import Lane, ReduceOptions, normalize_answer

__all__ = ("AdaptiveSampleParams", "Rule", "decision", "majority_posterior", "settled", "top_two")

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


def decision(
    params: AdaptiveSampleParams,
    lanes: Sequence[Lane],
    last: Sequence[Lane],
    *,
    cut: bool,
    affordable: Callable[[int], bool],
    before_answers: bool = False,
) -> dict[str, Any]:
    """The decision at a barrier (or before the first wave): what stopped, or the next wave's
    size, with the tally it was made from. `cut`: the budget shrank the last wave;
    `affordable(n)`: whether the budget funds a wave of n lanes (asked only where no rule
    stops first). A rule may stop once `min_quorum` lanes gave an answer; `before_answers`:
    once they completed, the rule as logs written before the quorum counted answers hold it
    (read back, never run)."""
    p = params
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
        and (completed if before_answers else sum(counts.values())) >= p.min_quorum
        and remaining > 0
        and settled(p.rule, counts, window, remaining=remaining, threshold=p.threshold)
    ):
        stopped_by = p.rule
    elif remaining <= 0:
        stopped_by = "max_lanes"
    elif cut or not affordable(size):
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
