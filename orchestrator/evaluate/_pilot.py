"""What a config pays per question, measured on a pilot and modelled for other params.

A budget is what is paid, not a worst case: computed tokens (prefill, decode, verifier and
cut-off tokens; cached prefill is not computed again, so it counts zero tokens), or USD (every
line at its own price, cached prefill included), or lanes. A pilot runs the config as it is
on the first questions (a real eval, resumable); its records say what each question paid by
line and how many lanes it ran. The loop's declared waves (`cost_shape`) say what a question
sends: each wave's requests on the backend at hand, their prefill passes (`_waves`), its
lanes, its judge's candidates. The pilot measures, against that model, what the backend
computes of a prompt sent again (`reuse`: 0 where it keeps no prefix across requests, 1 where
its cache serves all of it), each lane's decode and each candidate's judging, and where each
question stopped (an early stop: adaptive_sample's vote settled, a debate's agents agreed).
`Rates.expected(params)` is then the mean a question of those params is expected to pay, which
each loop's own `fit` searches (`Allowance.price`); `Rates.ceiling(params)` the per-question
limit that lets the params' every wave run whole when the waves before it spent as expected.
Nothing here knows a loop by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from lanefold.config import LoopConfig
from lanefold.evaluate._eval_records import PAID_TOKENS, QuestionResult
from lanefold.evaluate._waves import Passes, Serving, passes, path, worst
from lanefold.primitives import CostShape, WaveShape
from lanefold.primitives.internal import cost_shape, shape_waves

__all__ = ("PILOT_QUESTIONS", "Rates", "first_lane", "frontier", "is_pilot", "paid", "pilot_id", "spread")

PILOT_QUESTIONS = 10
_PILOT = ".pilot"  # how a pilot eval's id ends: never a compared config's, nor a sweep's point


def pilot_id(prefix: str, name: str) -> str:
    """The pilot eval of config `name` in the compare or sweep `prefix`: `<prefix>-<name>.pilot`."""
    return f"{prefix}-{name}{_PILOT}"


def is_pilot(eval_id: str) -> bool:
    """Whether `eval_id` is a compare's or a sweep's pilot (listed apart, never compared)."""
    return eval_id.endswith(_PILOT)


def paid(row: QuestionResult, unit: str) -> float:
    """What one question's run paid in `unit`: tokens computed, USD, or lanes."""
    if unit == "lanes":
        return float(row.lanes)
    if unit == "cost":
        return row.cost
    return float(sum(row.tokens.get(line, 0) for line in PAID_TOKENS))


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


def _candidates(shape: CostShape, lanes: int) -> int:
    """The candidates judged when `lanes` of the shape ran: every lane where each is one."""
    return min(shape.candidates, lanes) if shape.candidates == shape.lanes else shape.candidates


@dataclass(frozen=True, slots=True)
class Rates:
    """One config's paid spend per question, by what it scales with, as its pilot measured it.

    A prompt token the model counts as `base` per token of each lane's first prompt
    (`prompt_tokens`, as the fit counts it) and `growth` per token a later prompt adds (counted
    at its worst by the shape); where the backend counts prompts itself (`exact`) the first
    prompts are taken as counted. Of the prefill passes (`_waves`), the first of each prompt is
    computed and `reuse` of each later one is not (served from a cross-request cache;
    `reuse_measured`: the pilot sent a prompt again, else `reuse` is 0, as a cache that keeps
    whole blocks may keep nothing of a short prompt); `prefill` scales what the model says is
    computed to what was (below 1 where a cache kept a prefix shared by different prompts).
    `decode`, `cut_off` and `kv_usd` per lane, `judge` tokens and `judge_usd` per candidate.
    `stops`: the lanes each pilot question ran, None where it ran the pilot's whole path (it
    would have gone on)."""

    config: LoopConfig
    prompt_tokens: int
    serving: Serving
    base: float
    growth: float
    reuse: float
    reuse_measured: bool
    prefill: float
    decode: float
    cut_off: float
    kv_usd: float
    judge: float
    judge_usd: float
    stops: tuple[int | None, ...]

    @classmethod
    def measure(
        cls, config: LoopConfig, rows: Sequence[QuestionResult], prompt: int, *, exact: bool = False
    ) -> Rates | None:
        """The rates of `config` from its pilot's rows, its first prompts `prompt` tokens
        (`exact`: as the backend counts them); None where its loop declares no cost shape or
        the pilot ran no lane."""
        shape = _shape(config, config.loop_params, prompt)
        if shape is None or not rows or shape.lanes <= 0:
            return None
        serving, waves = Serving.of(config), shape_waves(shape)
        ran = [min(row.lanes, shape.lanes) for row in rows]
        if sum(ran) <= 0:
            return None
        model = [passes(path(waves, lanes), prompt, serving) for lanes in ran]

        def total(line: str, table: str = "tokens") -> float:
            return math.fsum(float(getattr(row, table).get(line, 0)) for row in rows)

        def summed(part: str, at: int) -> float:
            return math.fsum(getattr(m, part)[at] for m in model)

        computed, seen = total("prefill"), total("prefill") + total("cached_prefill")
        firsts, extra = summed("seen", 0), summed("seen", 1)
        if exact and firsts > 0:
            base = min(1.0, seen / firsts)
            growth = max(0.0, seen - firsts) / extra if extra > 0 else 0.0
        else:
            base = growth = seen / (firsts + extra) if firsts + extra > 0 else 0.0
        fresh = base * summed("fresh", 0) + growth * summed("fresh", 1)
        again = base * summed("again", 0) + growth * summed("again", 1)
        # What a declared cache keeps of the prompt as the model counts it (not as estimated).
        reuse, measured, scale = serving.declared_reuse(round(base * prompt)), False, 1.0
        if again > 0 and serving.across is not False:  # the pilot sent a prompt again
            measured = True
            if computed >= fresh:
                reuse = min(1.0, (fresh + again - computed) / again)
            else:  # less than every prompt's first pass: a cache kept a prefix they share
                reuse, scale = 1.0, computed / fresh if fresh > 0 else 1.0
        elif fresh + again > 0:
            scale = computed / (fresh + (1.0 - reuse) * again)
        lanes = float(sum(ran))
        candidates = float(sum(_candidates(shape, n) for n in ran))
        return cls(
            config=config,
            prompt_tokens=prompt,
            serving=serving,
            base=base,
            growth=growth,
            reuse=reuse,
            reuse_measured=measured,
            prefill=scale,
            decode=total("decode") / lanes,
            cut_off=total("cut_off") / lanes,
            kv_usd=total("kv_residency", "cost_by_line") / lanes,
            judge=total("verifier") / candidates if candidates else 0.0,
            judge_usd=total("verifier", "cost_by_line") / candidates if candidates else 0.0,
            stops=tuple(None if n >= shape.lanes else n for n in ran),
        )

    def _spend(
        self, shape: CostShape, waves: Sequence[WaveShape], lanes: int, unit: str, *, judged: bool = True
    ) -> float:
        """What a question pays in `unit` when it runs `lanes` lanes of `waves` (a path), its
        candidates judged after them (`judged`)."""
        model: Passes = passes(path(waves, lanes), self.prompt_tokens, self.serving)
        seen = self.base * model.seen[0] + self.growth * model.seen[1]
        fresh = self.base * model.fresh[0] + self.growth * model.fresh[1]
        again = self.base * model.again[0] + self.growth * model.again[1]
        prefill = min(seen, self.prefill * (fresh + (1.0 - self.reuse) * again))
        ran = model.lanes
        decode, cut_off = self.decode * ran, self.cut_off * ran
        candidates = _candidates(shape, ran) if judged else 0
        if unit == "lanes":
            return float(ran)
        if unit == "tokens":
            return prefill + decode + cut_off + self.judge * candidates
        price = self.config.pricing
        return (
            prefill * price.input_per_mtok * 1e-6
            + (seen - prefill) * price.cached_input_per_mtok * 1e-6
            + (decode + cut_off) * price.output_per_mtok * 1e-6
            + self.kv_usd * ran
            + self.judge_usd * candidates
        )

    def expected(self, params: BaseModel, unit: str) -> float | None:
        """The mean a question of `params` is expected to pay in `unit`: each pilot question
        stopping where it stopped, one that ran the pilot's whole path running every lane of
        `params` (what the pilot never saw stop is not assumed to: a loop fitted beyond its
        pilot errs under its budget, never over), and, where `params` run more lanes than the
        pilot could, one question more that runs them all. None where its shape is not known."""
        shape = _shape(self.config, params, self.prompt_tokens)
        if shape is None:
            return None
        waves = shape_waves(shape)
        reach = [shape.lanes if stop is None else min(stop, shape.lanes) for stop in self.stops]
        if shape.lanes > self._pilot_lanes():
            reach.append(shape.lanes)
        spends = [self._spend(shape, waves, lanes, unit) for lanes in reach]
        return math.fsum(spends) / len(spends) if spends else None

    def ceiling(self, params: BaseModel, unit: str, judge_worst: float = 0.0) -> float | None:
        """The least per-question limit with which every wave of `params` runs whole when the
        waves before it spent as the pilot expects (the ledger holds a wave's worst case
        before it runs), the judge's worst (`judge_worst`) after them; None where unknown."""
        shape = _shape(self.config, params, self.prompt_tokens)
        if shape is None:
            return None
        waves = shape_waves(shape)
        most, before = 0.0, 0
        max_tokens = self.config.sampling.max_tokens
        for wave in waves:
            spent = self._spend(shape, waves, before, unit, judged=False)
            most = max(most, spent + worst(wave, self.serving, max_tokens, self.config.pricing, unit))
            before += wave.lanes
        return max(most, self._spend(shape, waves, before, unit, judged=False) + judge_worst)

    def _pilot_lanes(self) -> int:
        shape = _shape(self.config, self.config.loop_params, self.prompt_tokens)
        return shape.lanes if shape is not None else 0


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
