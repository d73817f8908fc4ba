"""How a loop declares what a question costs it, and how it searches a budget: its waves.

A loop's `cost_shape` says, for a question, the waves it may run at most (`WaveShape`: lanes,
each lane's prompt, how many distinct prompts, whether a wave resends an earlier one's
prompt) and the candidates its reducer judges. The facade prices each wave as the backend at
hand runs it: split into requests by the dispatcher's rule (`request_size`), the prompt
prefilled once a request where the backend shares a request's prefix, and again by every
request where it keeps no prefix from one request to the next. A loop's `fit` searches its own
params for those whose price (`Allowance.price`) fills the budget (`largest_within`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from lanefold.primitives._errors import BudgetTooSmallError

__all__ = ("Allowance", "BudgetUnit", "CostShape", "WaveShape", "largest_within", "shape_waves")

BudgetUnit = Literal["tokens", "cost", "lanes"]
"""What a budget is counted in: tokens, USD (`cost`) or lanes."""


@dataclass(frozen=True, slots=True)
class WaveShape:
    """One wave a question may run, at its most: `lanes` lanes, each sending a prompt of at
    most `prompt_tokens`; `prompts`, how many distinct prompts they send (1: every lane the
    same one, as parallel_sample's wave; `lanes`: each its own, as a debate's rebuttals);
    `shared`, whether lanes of one prompt may share a request (`ctx.wave(share_prefix=...)`);
    `repeat`, whether its prompt was sent by an earlier wave of the question (adaptive_sample's
    later waves), so that a backend's cross-request cache may serve it."""

    lanes: int
    prompt_tokens: int
    prompts: int = 1
    shared: bool = True
    repeat: bool = False

    def requests(self, size: int) -> int:
        """The requests this wave goes out as, `size` lanes of one prompt at most a request."""
        if self.lanes <= 0:
            return 0
        prompts = max(1, min(self.prompts, self.lanes))
        if not self.shared or prompts >= self.lanes:
            return self.lanes
        return sum(math.ceil(n / max(1, size)) for n in _spread(self.lanes, prompts))

    def truncated(self, lanes: int) -> WaveShape:
        """This wave with only its first `lanes` lanes."""
        return WaveShape(
            min(lanes, self.lanes), self.prompt_tokens, min(self.prompts, lanes), self.shared, self.repeat
        )


def _spread(lanes: int, prompts: int) -> list[int]:
    """`lanes` dealt to `prompts` as evenly as they go."""
    return [lanes // prompts + (i < lanes % prompts) for i in range(prompts)]


@dataclass(frozen=True, slots=True)
class CostShape:
    """The most one question asks of the sampling backend under a loop's params: lanes
    sampled, their prompt tokens in all, and the candidates its final reducer judges; each
    lane may write up to `[sampling] max_tokens`. `waves`, the waves in the order they run
    (what the facade prices by request); `prefill_tokens`, for a shape that lists no waves: of
    its prompt tokens, those computed where a wave's lanes share their prefix (None: all).
    `CostShape.of(waves, candidates)` fills the totals from the waves."""

    lanes: int
    prompt_tokens: int
    candidates: int
    prefill_tokens: int | None = None
    waves: tuple[WaveShape, ...] = ()

    @classmethod
    def of(cls, waves: Sequence[WaveShape], candidates: int) -> CostShape:
        """A shape from its waves: their lanes and prompt tokens summed, each prompt once."""
        return cls(
            lanes=sum(w.lanes for w in waves),
            prompt_tokens=sum(w.lanes * w.prompt_tokens for w in waves),
            candidates=candidates,
            prefill_tokens=sum(min(w.prompts, w.lanes) * w.prompt_tokens for w in waves if not w.repeat),
            waves=tuple(waves),
        )


def shape_waves(shape: CostShape) -> tuple[WaveShape, ...]:
    """The shape's waves; for one that lists none, one wave of its lanes: one shared prompt
    where its `prefill_tokens` say the prefix is computed once, else a prompt a lane."""
    if shape.waves:
        return shape.waves
    if shape.lanes <= 0:
        return ()
    each = math.ceil(shape.prompt_tokens / shape.lanes)
    if shape.prefill_tokens is None or each <= 0:
        return (WaveShape(shape.lanes, each, prompts=shape.lanes),)
    prompts = max(1, min(shape.lanes, round(shape.prefill_tokens / each)))
    return (WaveShape(shape.lanes, each, prompts=prompts),)


@dataclass(frozen=True, slots=True)
class Allowance:
    """A per-question budget a loop is fitted to: `amount` in `unit`, and `price`, what a
    params is expected to pay per question in that unit (None: not known), so a fit can search
    its own params for those whose spend fills the budget without passing it."""

    unit: BudgetUnit
    amount: float
    price: Callable[[BaseModel], float | None] = field(default=lambda _params: None)


def largest_within(
    budget: Allowance, least: int, candidate: Callable[[int], BaseModel], most: int = 4096
) -> int | None:
    """The largest n in [least, most] whose `candidate(n)` the budget's price keeps within its
    amount (spend grows with n: doubled, then halved down); None where its price is not known.
    A BudgetTooSmallError where even `least` passes it: the budget is below what the loop must
    spend."""

    def fits(n: int) -> bool | None:
        price = budget.price(candidate(n))
        return None if price is None else price <= budget.amount

    first = fits(least)
    if first is None:
        return None
    if not first:
        price = budget.price(candidate(least)) or 0.0
        raise BudgetTooSmallError(
            f"--budget: {budget.amount:g} {budget.unit} a question is below what the loop "
            f"pays at its least ({readable_number(price)} {budget.unit})"
        )

    def grown(n: int) -> int:
        return min(most, max(n * 2, n + 1))

    low = least
    while low < most and fits(grown(low)):
        low = grown(low)
    high = grown(low)
    while low < high:  # low fits; high is the first power beyond it that may not
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def readable_number(value: float) -> str:
    """A vote, score or spend for a person: an integer where it is one, else three figures."""
    if float(value).is_integer():
        return str(int(value))
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e+" in text else text  # 1234.5 reads as 1234, not 1.23e+03
