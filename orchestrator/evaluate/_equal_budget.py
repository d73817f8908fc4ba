"""Equal budgets for `orchestrator compare`: what a config could spend on one question, one
per-question limit written into every config, and each loop fitted to it.

"Needs" is each config's worst case, known from its keys before anything runs (no pilot): the
loop declares its cost shape (lanes, their prompt tokens, the candidates its reducer judges, as
a function of its params and the first prompt's tokens), each lane may write `max_tokens`, and
the reducer declares its judge's tokens; cost prices those tokens at the config's own rates. The
estimate errs high, so the default limit (the largest need) never shrinks a config's waves.
Tokens and cost go into `[budget]` (`max_tokens`, `max_cost_usd`); then each loop's own `fit`
says how it spends the limit (under lanes, capping its own keys, since `max_requests` counts
requests and one request carries many lanes). Nothing here knows a loop or reducer by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from lanefold.config import LoopConfig, parse_config
from lanefold.primitives import (
    FRAME_TOKENS,
    Allowance,
    ConfigError,
    JudgeCall,
    Pricing,
    backend_prompt_tokens,
    cost_shape,
    fit_params,
    loop_reducer,
    plugin_folders,
    reducer_traits,
    resolve_reducer,
)

__all__ = (
    "BUDGET_MODES",
    "BudgetMode",
    "WorstCase",
    "apply_limit",
    "equal_limit",
    "fitted_keys",
    "lane_cap",
    "need",
    "prompt_tokens",
    "worst_case",
)

BudgetMode = Literal["tokens", "cost", "lanes"]
BUDGET_MODES: tuple[BudgetMode, ...] = ("tokens", "cost", "lanes")

_BYTE_MARGIN = 32  # as the dispatcher guesses a prompt it cannot count: bytes + 32


@dataclass(frozen=True, slots=True)
class WorstCase:
    """The most one question could spend under a config: its sampled lanes, their tokens
    (every prompt token counted as prefill) and its judge's tokens."""

    lanes: int
    prompt_tokens: int
    output_tokens: int
    judge_prompt_tokens: int = 0
    judge_output_tokens: int = 0

    @property
    def tokens(self) -> int:
        """What `[budget] max_tokens` counts: prefill, decode and judge tokens."""
        return self.prompt_tokens + self.output_tokens + self.judge_prompt_tokens + self.judge_output_tokens

    def cost_usd(self, pricing: Pricing) -> float:
        """Priced as the ledger prices it, a prompt token at the dearer of its two rates."""
        prefill = max(pricing.input_per_mtok, pricing.cached_input_per_mtok)
        sample = self.prompt_tokens * prefill + self.output_tokens * pricing.output_per_mtok
        if pricing.verifier_per_mtok is not None:
            judge = (self.judge_prompt_tokens + self.judge_output_tokens) * pricing.verifier_per_mtok
        else:
            judge = self.judge_prompt_tokens * prefill + self.judge_output_tokens * pricing.output_per_mtok
        return (sample + judge) * 1e-6


def prompt_tokens(config: LoopConfig, questions: Sequence[str]) -> int:
    """The largest first prompt of these questions, in tokens: the backend's own count where its
    settings know it (a test double's fixed count), else UTF-8 bytes + 32 (a byte-level
    tokenizer never makes more tokens than bytes)."""
    template = config.prompt.template
    prompts = [template.replace("{question}", q) for q in questions] or [template]
    declared = [backend_prompt_tokens(config.backend, prompt) for prompt in prompts]
    if all(count is not None for count in declared):
        return max(int(count or 0) for count in declared)
    return max(len(prompt.encode()) for prompt in prompts) + _BYTE_MARGIN


def worst_case(config: LoopConfig, prompt: int, params: BaseModel | None = None) -> WorstCase | None:
    """The worst case of one question under `config` (with `params` for its loop's, if given)
    and a first prompt of `prompt` tokens; None where the loop declares no cost shape or
    cannot bound its lanes."""
    loop = config.loop_class()
    params = params if params is not None else config.loop_params
    most = config.sampling.max_tokens
    shape = cost_shape(loop, params, prompt_tokens=prompt, max_tokens=most)
    if shape is None:
        return None
    judge_in = judge_out = 0
    choice = loop_reducer(loop, params)
    if choice is not None and choice.name:
        with plugin_folders(config.folder):  # a `module:Class` reducer beside the config first
            traits = reducer_traits(resolve_reducer(choice.name))
        judge = config.judge
        judge_in, judge_out = traits.judge_tokens(
            JudgeCall(
                candidates=shape.candidates,
                prompt_tokens=prompt,
                answer_tokens=most + FRAME_TOKENS,
                max_tokens=judge.max_tokens,
                template=judge.template is not None,
                verifier=judge.verifier is not None or judge.verifier_command is not None,
            )
        )
    return WorstCase(shape.lanes, shape.prompt_tokens, shape.lanes * most, judge_in, judge_out)


def _in_mode(case: WorstCase, mode: BudgetMode, pricing: Pricing) -> float:
    if mode == "lanes":
        return float(case.lanes)
    if mode == "tokens":
        return float(case.tokens)
    return case.cost_usd(pricing)


def need(config: LoopConfig, mode: BudgetMode, questions: Sequence[str], source: str) -> float:
    """What `config` needs per question in `mode` (its worst case), or ConfigError."""
    case = worst_case(config, prompt_tokens(config, questions))
    if case is None:
        raise ConfigError(
            f"{source}: loop.coordinator: the worst case of "
            f"{config.loop.coordinator!r} per question is not known; give "
            f"--budget N for --equal-budget {mode}"
        )
    return _in_mode(case, mode, config.pricing)


def equal_limit(
    configs: Sequence[tuple[str, LoopConfig]],
    mode: BudgetMode,
    questions: Sequence[str],
    budget: float | None = None,
) -> tuple[float, list[float | None]]:
    """The one limit every config gets (`budget`, else the largest need) and each config's
    need, in order (None where it is not known and `budget` was given). `configs` are
    (source, config) pairs; an error names the source."""
    if budget is not None:
        budget = _checked_budget(mode, budget)
    needs: list[float | None] = []
    for source, config in configs:
        try:
            needs.append(need(config, mode, questions, source))
        except ConfigError:
            if budget is None:
                raise
            needs.append(None)
    if budget is not None:
        return budget, needs
    limit = max(value for value in needs if value is not None)
    if mode == "cost" and limit <= 0:
        raise ConfigError(
            "--equal-budget cost: every config's worst case costs $0 (no "
            "[pricing] rates); equalise tokens, or give [pricing] rates"
        )
    return limit, needs


def _checked_budget(mode: BudgetMode, budget: float) -> float:
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(f"--budget: must be a positive number, got {budget:g}")
    if mode != "cost" and budget != int(budget):
        raise ConfigError(f"--budget: {mode} are counted in whole numbers, got {budget:g}")
    return budget


def apply_limit(
    config: LoopConfig, mode: BudgetMode, limit: float, source: str, questions: Sequence[str] = ()
) -> LoopConfig:
    """`config` with the per-question limit written in (`[budget] max_tokens` or
    `max_cost_usd`; none for lanes) and its loop's keys as the loop's `fit` sets them."""
    raw = config.model_dump(mode="json")
    if mode == "tokens":
        raw["budget"]["max_tokens"] = int(limit)
    elif mode == "cost":
        raw["budget"]["max_cost_usd"] = limit
    raw["loop"].update(fitted_keys(config, mode, limit, source, questions))
    return parse_config(raw, source=source, folder=config.folder)


def fitted_keys(
    config: LoopConfig, mode: BudgetMode, limit: float, source: str, questions: Sequence[str] = ()
) -> dict[str, Any]:
    """The `[loop]` keys the loop's `fit` sets to spend `limit` per question (those it gives
    in `params.model_copy(update=...)`, or in a new params); {} where it keeps its params.
    An error names `source`."""
    params = config.loop_params
    # Fitted from a copy that says no key was set, so the keys the fit sets are its own.
    bare = type(params).model_construct(_fields_set=set(), **dict(params))
    prompt = prompt_tokens(config, questions)

    def price(candidate: BaseModel) -> float | None:
        case = worst_case(config, prompt, candidate)
        return None if case is None else _in_mode(case, mode, config.pricing)

    allowance = Allowance(mode, limit if mode == "cost" else int(limit), price)
    try:
        fitted = fit_params(config.loop_class(), bare, allowance)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return {
        key: value for key, value in fitted.model_dump(mode="json").items() if key in fitted.model_fields_set
    }


def lane_cap(config: LoopConfig, lanes: int, source: str) -> dict[str, Any]:
    """The loop keys that keep its sampled lanes per question at or under `lanes`."""
    return fitted_keys(config, "lanes", lanes, source)
