"""One budget for several configs: their pilots, the default budget, each loop fitted to it.

    settled = await settle_budget(arms, items, "tokens", None, prefix="cmp", runs_dir="runs")

Every config first runs a pilot as it is configured: the eval `<prefix>-<name>.pilot` on the
first questions (`PILOT_QUESTIONS`; resumable, recorded like any eval). The pilot says what a
question paid (the default budget is the smallest fitted config's mean) and how each line of
the bill scales (`Rates`), which each loop's own `fit` searches. `compare` settles one budget,
`sweep` one per point; both call the same fit, and keep what it chose (`FitRecord`). Greedy
decoding (one lane at temperature 0) runs no pilot and is never fitted.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanefold.config import LoopConfig, parse_config
from lanefold.evaluate._equal_budget import (
    BUDGET_MODES,
    BudgetMode,
    checked_budget,
    fitted_keys,
    is_greedy,
    judge_worst,
    per_question_limit,
    prompt_tokens,
)
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import QuestionResult, read_results
from lanefold.evaluate._fit_record import FitRecord, PilotFigures, Priced, differing
from lanefold.evaluate._item import Item
from lanefold.evaluate._pilot import PILOT_QUESTIONS, Rates, first_lane, pilot_id, spread
from lanefold.execution import open_store
from lanefold.primitives import ConfigError, Pricing
from lanefold.primitives.internal import backend_prompt_tokens

__all__ = (
    "UNITS",
    "Arm",
    "EqualBudget",
    "Fitted",
    "Pilots",
    "check_floor",
    "check_pricing",
    "check_unit",
    "fit_arm",
    "run_pilots",
    "settle_budget",
)

Arm = tuple[str, str, LoopConfig]  # (name, source, config)
OnStart = Callable[[str, int, Sequence[QuestionResult]], None]
OnResult = Callable[[str, QuestionResult], None]
UNITS = {"tokens": "tokens", "cost": "USD", "lanes": "lanes"}


class EqualBudget(BaseModel):
    """How the configs were put on one budget: the unit, the budget a question (what it may
    pay), where it came from (the smallest pilot mean, or `--budget`), and each config's mean
    paid per question on its pilot of `pilot_questions` (empty where no pilot ran). Where the
    smallest pilot mean is below what some config pays at its least (one lane), the budget is
    raised to that, and `raised_for` names the config."""

    model_config = ConfigDict(frozen=True)

    mode: BudgetMode
    limit: float
    source: Literal["pilot", "--budget"]
    pilot_questions: int = 0
    pilot: dict[str, float] = {}
    raised_for: str | None = None  # the config whose least spend the pilot mean was raised to


@dataclass(frozen=True, slots=True)
class Pilots:
    """What the pilots measured: per config (by name), its pilot eval, its mean paid and its
    rates (None where its loop declares no cost shape). Greedy configs run none."""

    questions: int
    means: dict[str, float]
    rates: dict[str, Rates | None]
    eval_ids: dict[str, str]


@dataclass(frozen=True, slots=True)
class Fitted:
    """A config fitted to a budget: the config to run (fitted keys and limit written in), the
    keys its loop's fit set, and the record of the fit."""

    config: LoopConfig
    keys: dict[str, Any]
    record: FitRecord


def check_unit(mode: str) -> BudgetMode:
    if mode not in BUDGET_MODES:
        raise ConfigError(f"--equal-budget: unknown {mode!r}: tokens, cost or lanes")
    return mode  # narrowed to BudgetMode by the check above


def check_pricing(arms: Sequence[Arm], mode: BudgetMode | None) -> None:
    """Prices must be comparable: a budget in USD needs rates, and configs with `[pricing]`
    beside configs without would draw the unpriced at $0 (refused unless the budget is in
    tokens or lanes, which no price enters)."""
    if mode in ("tokens", "lanes"):
        return
    priced = [source for _, source, config in arms if config.pricing != Pricing()]
    unpriced = [source for _, source, config in arms if config.pricing == Pricing()]
    if priced and unpriced:
        raise ConfigError(
            f"[pricing]: {', '.join(priced)} priced, {', '.join(unpriced)} not (drawn at $0); "
            "give every config rates, or --equal-budget tokens"
        )
    if mode == "cost" and not priced:
        raise ConfigError(
            "--equal-budget cost: every config costs $0 (no [pricing] rates); equalise tokens, "
            "or give [pricing] rates"
        )


def check_floor(arms: Sequence[Arm], mode: BudgetMode, budget: float, questions: Sequence[str]) -> None:
    """A budget below one lane of some config is refused before anything runs."""
    for _, source, config in arms:
        if is_greedy(config):
            continue  # never fitted: it pays what one lane pays, whatever the budget
        # The backend's own count where it has one; else nothing is known to be paid.
        template = config.prompt.template
        counted = [
            backend_prompt_tokens(config.backend, template.replace("{question}", q)) for q in questions
        ]
        prompt = min((int(n) for n in counted if n is not None), default=0)
        least = first_lane(config, prompt, mode)
        if budget < least:
            raise ConfigError(
                f"{source}: --budget {budget:g} {UNITS[mode]} a question is below one lane of "
                f"this config ({least:g} {UNITS[mode]})"
            )
        if mode == "lanes":  # the loop's own fit says whether it can run in so few
            fitted_keys(config, mode, budget, source, questions)


async def run_pilots(
    arms: Sequence[Arm],
    items: Sequence[Item],
    mode: BudgetMode,
    *,
    prefix: str,
    runs_dir: str,
    concurrency: int,
    scorer: str | None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> Pilots:
    """Run each config as configured on the first questions (the eval
    `<prefix>-<name>.pilot`, resumable) and measure what a question paid; greedy configs,
    never fitted, run none."""
    first = list(items[:PILOT_QUESTIONS])
    questions = [item.question for item in items]
    means: dict[str, float] = {}
    rates: dict[str, Rates | None] = {}
    eval_ids: dict[str, str] = {}
    for name, _, config in arms:
        if is_greedy(config):
            continue
        eval_id = eval_ids[name] = pilot_id(prefix, name)
        label = f"{name} (pilot)"
        await run_eval(
            config,
            first,
            eval_id=eval_id,
            runs_dir=runs_dir,
            concurrency=concurrency,
            scorer=scorer,
            on_start=functools.partial(on_start, label) if on_start else None,
            on_result=functools.partial(on_result, label) if on_result else None,
            stop_reason=stop_reason,
        )
        store = open_store(config.store.url, runs_dir, config.store.password_env)
        wanted = {item.index for item in first}
        rows = [row for i, row in read_results(store.eval_record(eval_id)).items() if i in wanted]
        means[name] = spread(rows, mode)[0]
        exact = backend_prompt_tokens(config.backend, config.prompt.template) is not None
        rates[name] = Rates.measure(config, rows, prompt_tokens(config, questions), exact=exact)
    return Pilots(len(first), means, rates, eval_ids)


def fit_arm(
    arm: Arm, mode: BudgetMode, budget: float, questions: Sequence[str], pilots: Pilots | None
) -> Fitted:
    """`arm`'s config fitted to `budget` by its loop's `fit`, priced by its pilot's rates, its
    per-question limit written in, and the record of the fit; a greedy config as it is. A
    budget below what the loop must spend: BudgetTooSmallError, naming its source."""
    name, source, config = arm
    if is_greedy(config):
        return Fitted(config, {}, FitRecord(unit=mode, budget=budget, greedy=True))
    rates = pilots.rates.get(name) if pilots is not None else None
    priced: list[Priced] = []
    bare = config.loop_params

    def price(params: BaseModel) -> float | None:
        assert rates is not None  # priced only where there are rates
        value = rates.expected(params, mode)
        priced.append(Priced(keys=differing(params, bare), expected=value))
        return value

    keys = fitted_keys(config, mode, budget, source, questions, price if rates and mode != "lanes" else None)
    raw = config.model_dump(mode="json")
    raw["loop"].update(keys)
    fitted = parse_config(raw, source=source, folder=config.folder)
    limit: float | None = None
    expected: float | None = None
    if mode != "lanes":
        prompt = prompt_tokens(config, questions)

        def ceiling(params: BaseModel) -> float | None:
            if rates is None:
                return None
            return rates.ceiling(params, mode, judge_worst(fitted, mode, prompt, params))

        limit = per_question_limit(fitted, mode, budget, questions, ceiling)
        if mode == "tokens":
            limit = float(math.ceil(limit))
        raw["budget"]["max_tokens" if mode == "tokens" else "max_cost_usd"] = (
            int(limit) if mode == "tokens" else limit
        )
        fitted = parse_config(raw, source=source, folder=config.folder)
        expected = rates.expected(fitted.loop_params, mode) if rates is not None else None
    figures = None
    if rates is not None and pilots is not None:
        figures = PilotFigures.of(rates, pilots.eval_ids[name], pilots.means[name])
    record = FitRecord(
        unit=mode, budget=budget, keys=keys, expected=expected, limit=limit, priced=priced, pilot=figures
    )
    return Fitted(fitted, keys, record)


def least_spend(arm: Arm, mode: BudgetMode, questions: Sequence[str], pilots: Pilots) -> float | None:
    """The least `arm`'s loop can be expected to pay a question: the cheapest params its fit
    prices when given nothing (None where it prices none)."""
    name, source, config = arm
    rates = pilots.rates.get(name)
    if rates is None or mode == "lanes":
        return None
    asked: list[float] = []

    def price(params: BaseModel) -> float | None:
        value = rates.expected(params, mode)
        if value is not None:
            asked.append(value)
        return value

    with contextlib.suppress(ConfigError):  # a fit refuses a budget of nothing; it asked first
        fitted_keys(config, mode, 0.0, source, questions, price)
    return min(asked, default=None)


async def settle_budget(
    arms: Sequence[Arm],
    items: Sequence[Item],
    mode: BudgetMode,
    budget: float | None,
    *,
    prefix: str,
    runs_dir: str,
    concurrency: int,
    scorer: str | None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> tuple[EqualBudget, list[Fitted]]:
    """The one budget (`budget`, else the smallest pilot mean) and every config fitted to it.
    Bad input is refused before any pilot runs; a lane budget that is given runs no pilot."""
    questions = [item.question for item in items]
    given = budget is not None
    check_pricing(arms, mode)
    if budget is not None:
        budget = checked_budget(mode, budget)
        check_floor(arms, mode, budget, questions)
    pilots = None
    if budget is None or mode != "lanes":
        pilots = await run_pilots(
            arms,
            items,
            mode,
            prefix=prefix,
            runs_dir=runs_dir,
            concurrency=concurrency,
            scorer=scorer,
            on_start=on_start,
            on_result=on_result,
            stop_reason=stop_reason,
        )
    raised_for = None
    if budget is None:
        assert pilots is not None  # run above whenever no budget was given
        if not pilots.means:
            raise ConfigError(
                f"--equal-budget {mode}: every config is greedy (one lane at T = 0); give --budget N"
            )
        smallest = min(pilots.means.values())  # the fitted configs': greedy runs no pilot
        budget = smallest if mode == "cost" else float(max(1, round(smallest)))
        if budget <= 0:
            raise ConfigError(f"--equal-budget {mode}: the pilots paid nothing; give --budget N")
        floors = {arm[0]: least_spend(arm, mode, questions, pilots) for arm in arms if arm[0] in pilots.means}
        name, floor = max(floors.items(), key=lambda item: item[1] if item[1] is not None else -1.0)
        if floor is not None and floor > budget:  # a budget some config cannot run in at all
            budget, raised_for = (floor if mode == "cost" else float(math.ceil(floor))), name
    fitted = [fit_arm(arm, mode, budget, questions, pilots) for arm in arms]
    settled = EqualBudget(
        mode=mode,
        limit=budget,
        source="--budget" if given else "pilot",
        pilot_questions=pilots.questions if pilots else 0,
        pilot=dict(pilots.means) if pilots else {},
        raised_for=raised_for,
    )
    return settled, fitted
