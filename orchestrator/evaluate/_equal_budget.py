"""Equal budgets for `orchestrator compare` and `sweep`: one budget per question, what is
paid, and each loop fitted to it through its own `fit`.

The budget is what a question pays (`_pilot`): tokens computed, USD, or lanes. Each loop's
`fit` searches its own params with `Allowance.price`, the expected paid spend a pilot measured
(`Rates`); under lanes, with its worst case in lanes, known from its keys. The per-question
limit written into `[budget]` (`max_tokens`, `max_cost_usd`) is the budget or, where larger,
the fitted params' worst case: the ledger reserves a wave's worst case before it runs, so a
limit at the expected spend would shrink the waves the fit chose, while the worst case still
caps a question that runs away. A loop whose spend the fit cannot shape (no cost shape) has
the budget itself as its limit, which binds as it runs. Nothing here knows a loop or reducer by
name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    "Price",
    "WorstCase",
    "apply_limit",
    "checked_budget",
    "fitted_keys",
    "lane_cap",
    "prompt_tokens",
    "worst_case",
    "worst_in",
)

BudgetMode = Literal["tokens", "cost", "lanes"]
BUDGET_MODES: tuple[BudgetMode, ...] = ("tokens", "cost", "lanes")
Price = Callable[[BaseModel], "float | None"]

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


def worst_in(
    config: LoopConfig, mode: BudgetMode, prompt: int, params: BaseModel | None = None
) -> float | None:
    """`config`'s worst case per question in `mode` (with `params`); None where not known."""
    case = worst_case(config, prompt, params)
    return None if case is None else _in_mode(case, mode, config.pricing)


def checked_budget(mode: BudgetMode, budget: float) -> float:
    """`--budget`, refused unless a positive number (whole, but for cost)."""
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(f"--budget: must be a positive number, got {budget:g}")
    if mode != "cost" and budget != int(budget):
        raise ConfigError(f"--budget: {mode} are counted in whole numbers, got {budget:g}")
    return budget


def apply_limit(
    config: LoopConfig,
    mode: BudgetMode,
    budget: float,
    source: str,
    questions: Sequence[str] = (),
    price: Price | None = None,
) -> LoopConfig:
    """`config` with its loop's keys as the loop's `fit` sets them for `budget` (see
    `fitted_keys`) and the per-question limit written in: `[budget] max_tokens` or
    `max_cost_usd`, the budget or the fitted params' worst case where larger; none for lanes."""
    raw = config.model_dump(mode="json")
    raw["loop"].update(fitted_keys(config, mode, budget, source, questions, price))
    fitted = parse_config(raw, source=source, folder=config.folder)
    if mode == "lanes":
        return fitted
    worst = worst_in(fitted, mode, prompt_tokens(fitted, questions))
    limit = max(budget, worst) if worst is not None else budget
    if mode == "tokens":
        raw["budget"]["max_tokens"] = math.ceil(limit)
    else:
        raw["budget"]["max_cost_usd"] = limit
    return parse_config(raw, source=source, folder=config.folder)


def fitted_keys(
    config: LoopConfig,
    mode: BudgetMode,
    budget: float,
    source: str,
    questions: Sequence[str] = (),
    price: Price | None = None,
) -> dict[str, Any]:
    """The `[loop]` keys the loop's `fit` sets to spend `budget` per question (those it gives
    in `params.model_copy(update=...)`, or in a new params); {} where it keeps its params.
    `price` is a params' expected paid spend (a pilot's `Rates.expected`); without one, a
    lane budget prices a params by its worst case and tokens or cost by nothing (not known).
    An error names `source`."""
    params = config.loop_params
    # Fitted from a copy that says no key was set, so the keys the fit sets are its own.
    bare = type(params).model_construct(_fields_set=set(), **dict(params))
    prompt = prompt_tokens(config, questions)

    def worst(candidate: BaseModel) -> float | None:
        return worst_in(config, mode, prompt, candidate) if mode == "lanes" else None

    allowance = Allowance(mode, budget if mode == "cost" else int(budget), price or worst)
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
