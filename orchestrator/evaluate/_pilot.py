"""What a config pays per question, measured on a pilot and modelled for other params.

A budget is what is paid, not a worst case: computed tokens (prefill, decode, verifier and
cut-off tokens; cached prefill is not computed again, so it counts zero tokens), or USD (every
line at its own price, cached prefill included), or lanes. A pilot runs the config as it is
on the first questions (a real eval, resumable); its records say what one question paid by
line. The loop's declared cost shape says how each line scales with its params: prompt tokens
with the shape's prompt (as prefill only where a wave's lanes cannot share their prefix),
decode, cut-off and KV residency with its lanes, the judge's tokens with its candidates. So
`Rates.expected(params)` is the expected paid spend of any params, which each loop's own `fit`
searches (`Allowance.price`). Nothing here knows a loop by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from lanefold.config import LoopConfig
from lanefold.evaluate._eval_records import QuestionResult
from lanefold.primitives import CostShape, Pricing, cost_shape

__all__ = ("PILOT_QUESTIONS", "Rates", "first_lane", "frontier", "paid", "spread")

PILOT_QUESTIONS = 10
_PAID_TOKENS = ("prefill", "decode", "verifier", "cut_off")  # computed: what `max_tokens` counts


def paid(row: QuestionResult, unit: str) -> float:
    """What one question's run paid in `unit`: tokens computed, USD, or lanes."""
    if unit == "lanes":
        return float(row.lanes)
    if unit == "cost":
        return row.cost
    return float(sum(row.tokens.get(line, 0) for line in _PAID_TOKENS))


def spread(rows: Sequence[QuestionResult], unit: str) -> tuple[float, float, float]:
    """(mean, least, most) paid per question over `rows`; zeros where there are none."""
    values = [paid(row, unit) for row in rows]
    if not values:
        return 0.0, 0.0, 0.0
    return math.fsum(values) / len(values), min(values), max(values)


def _shape(config: LoopConfig, params: BaseModel, prompt: int) -> CostShape | None:
    return cost_shape(
        config.loop_class(), params, prompt_tokens=prompt, max_tokens=config.sampling.max_tokens
    )


def _computed(shape: CostShape, shared: bool) -> int:
    """The prompt tokens a shape computes: its `prefill_tokens` where a wave's lanes share
    their prefix, else every one."""
    if shared and shape.prefill_tokens is not None:
        return shape.prefill_tokens
    return shape.prompt_tokens


@dataclass(frozen=True, slots=True)
class Rates:
    """One config's paid spend per question, by line, per unit of what it scales with.

    Prompt tokens seen: `base` per token of each lane's first prompt (`prompt_tokens` a lane)
    and `growth` per token the shape adds beyond them (later prompts quoting earlier answers,
    counted at their worst). Where the backend counts prompts itself (`exact`), the tokens seen
    go to the first prompts first and only the rest to growth, as a worst case errs high;
    else both are the pilot's share of the shape's prompt tokens. Of those seen, `prefill`
    is computed per token the shape says must be where a wave's lanes share their prefix
    (below 1 where a server's cache kept a prefix from one question to the next), and
    `computed` the share computed where it says nothing. `decode`, `cut_off` and `kv_usd` per
    lane, `judge` tokens and `judge_usd` per candidate; `shared`, whether a wave's lanes
    shared their prefix (assumed where the pilot could not tell); `lane_share`, the lanes run
    per lane the shape allows (an early stop runs fewer)."""

    config: LoopConfig
    prompt_tokens: int
    base: float
    growth: float
    shared: bool
    prefill: float
    computed: float
    lane_share: float
    decode: float
    cut_off: float
    kv_usd: float
    judge: float
    judge_usd: float

    @classmethod
    def measure(
        cls, config: LoopConfig, rows: Sequence[QuestionResult], prompt: int, *, exact: bool = False
    ) -> Rates | None:
        """The rates of `config` from its pilot's rows, its first prompts `prompt` tokens
        (`exact`: as the backend counts them); None where its loop declares no cost shape or
        the pilot ran nothing."""
        shape = _shape(config, config.loop_params, prompt)
        if shape is None or not rows or shape.lanes <= 0:
            return None
        n = len(rows)

        def mean(line: str, table: str = "tokens") -> float:
            return math.fsum(float(getattr(row, table).get(line, 0)) for row in rows) / n

        lanes = math.fsum(row.lanes for row in rows) / n or float(shape.lanes)
        prefill, cached = mean("prefill"), mean("cached_prefill")
        could_share = shape.prefill_tokens is not None and shape.prefill_tokens < shape.prompt_tokens
        shared = cached > 0 or not could_share
        basis = _computed(shape, shared)
        lane_share = min(1.0, lanes / shape.lanes)
        seen = prefill + cached
        firsts = lanes * prompt  # each lane's first prompt, as run
        extra = (shape.prompt_tokens - shape.lanes * prompt) * lane_share  # growth, as run
        if exact and firsts > 0:
            base = min(1.0, seen / firsts)
            growth = max(0.0, seen - firsts) / extra if extra > 0 else 0.0
        else:
            base = growth = seen / shape.prompt_tokens if shape.prompt_tokens else 0.0
        return cls(
            config=config,
            prompt_tokens=prompt,
            base=base,
            growth=growth,
            shared=shared,
            prefill=prefill / basis if basis else 0.0,
            computed=prefill / seen if seen > 0 else 1.0,
            lane_share=lane_share,
            decode=mean("decode") / lanes,
            cut_off=mean("cut_off") / lanes,
            kv_usd=mean("kv_residency", "cost_by_line") / lanes,
            judge=mean("verifier") / shape.candidates if shape.candidates else 0.0,
            judge_usd=mean("verifier", "cost_by_line") / shape.candidates if shape.candidates else 0.0,
        )

    def expected(self, params: BaseModel, unit: str) -> float | None:
        """The expected paid spend per question of `params` in `unit`; None where its shape is
        not known."""
        shape = _shape(self.config, params, self.prompt_tokens)
        if shape is None:
            return None
        lanes = shape.lanes * self.lane_share
        if unit == "lanes":
            return lanes
        firsts = shape.lanes * self.prompt_tokens
        seen = (
            self.base * firsts * self.lane_share
            + self.growth * (shape.prompt_tokens - firsts) * self.lane_share
        )
        if self.shared and shape.prefill_tokens is not None:
            prefill = min(seen, self.prefill * shape.prefill_tokens)
        else:
            prefill = seen * self.computed
        cached = seen - prefill
        decode, cut_off = self.decode * lanes, self.cut_off * lanes
        judge = self.judge * shape.candidates
        if unit == "tokens":
            return prefill + decode + cut_off + judge
        price: Pricing = self.config.pricing
        return (
            prefill * price.input_per_mtok * 1e-6
            + cached * price.cached_input_per_mtok * 1e-6
            + (decode + cut_off) * price.output_per_mtok * 1e-6
            + self.kv_usd * lanes
            + self.judge_usd * shape.candidates
        )


def first_lane(config: LoopConfig, prompt: int, unit: str) -> float:
    """The least one lane can pay before anything runs: its prompt as prefill and one decoded
    token (USD at the config's rates); 1 in lanes."""
    if unit == "lanes":
        return 1.0
    if unit == "cost":
        price = config.pricing
        return (prompt * price.input_per_mtok + price.output_per_mtok) * 1e-6
    return float(prompt + 1)


def frontier(points: Sequence[tuple[float, float]]) -> set[int]:
    """The Pareto frontier of (paid, accuracy) points: the indices no other point beats, at
    least as accurate for no more paid and better in one of the two."""
    return {
        i
        for i, (paid_i, accuracy_i) in enumerate(points)
        if not any(
            paid_j <= paid_i and accuracy_j >= accuracy_i and (paid_j, accuracy_j) != (paid_i, accuracy_i)
            for paid_j, accuracy_j in points
        )
    }
