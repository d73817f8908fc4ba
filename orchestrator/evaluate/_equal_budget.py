"""Equal budgets for `orchestrator compare` and `sweep`: one budget per question, what is
paid, and each loop fitted to it through its own `fit`.

The budget is what a question pays (`_pilot`): tokens computed, USD, or lanes. Each loop's
`fit` searches its own params with `Allowance.price`, the expected paid spend a pilot measured
(`Rates`); under lanes, with its worst case in lanes, known from its keys. The per-question
limit written into `[budget]` (`max_tokens`, `max_cost_usd`) is in the budget's own unit: the
budget, or, where larger, what the fitted params need for each wave to run whole when the
waves before it spent as expected (`Rates.ceiling`: the ledger holds a wave's worst case before
it runs, so a limit at the expected spend would shrink the very waves the fit chose). A question
that spends past it is cut there, and says so (a shrunk or unfunded wave, a loop's
`budget_stop`). A loop whose spend the fit cannot shape (no cost shape) has the budget itself as
its limit, which binds as it runs. Nothing here knows a loop or reducer by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from lanefold.config import LoopConfig, parse_config
from lanefold.evaluate._waves import Serving, worst
from lanefold.primitives import (
    FRAME_TOKENS,
    Allowance,
    ConfigError,
    JudgeCall,
    Pricing,
    loop_reducer,
    reducer_traits,
    resolve_reducer,
)
from lanefold.primitives.internal import (
    backend_prompt_tokens,
    cost_shape,
    fit_params,
    plugin_folders,
    shape_waves,
)

__all__ = (
    "BUDGET_MODES",
    "BudgetMode",
    "Price",
    "WorstCase",
    "apply_limit",
    "checked_budget",
    "fitted_keys",
    "is_greedy",
    "judge_worst",
    "lane_cap",
    "per_question_limit",
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
    """The most one question could pay under a config on the backend at hand, as the ledger
    holds it: its sampled lanes; their prompt tokens computed (`prompt_tokens`: a pass a
    request, or a lane where the backend shares nothing) and cached (`cached_tokens`, the rest
    of the lanes' prompts); each lane's `max_tokens` (`output_tokens`); its judge's tokens."""

    lanes: int
    prompt_tokens: int
    output_tokens: int
    judge_prompt_tokens: int = 0
    judge_output_tokens: int = 0
    cached_tokens: int = 0

    @property
    def tokens(self) -> int:
        """What `[budget] max_tokens` counts: prefill, decode and judge tokens (cached
        prefill is not computed again)."""
        return self.prompt_tokens + self.output_tokens + self.judge_prompt_tokens + self.judge_output_tokens

    def cost_usd(self, pricing: Pricing) -> float:
        """Priced as the ledger prices it: prefill, cached prefill and decode at their rates."""
        sample = (
            self.prompt_tokens * pricing.input_per_mtok
            + self.cached_tokens * pricing.cached_input_per_mtok
            + self.output_tokens * pricing.output_per_mtok
        )
        return (sample + _judge_usd(self.judge_prompt_tokens, self.judge_output_tokens, pricing)) * 1e-6


def _judge_usd(prompt: int, output: int, pricing: Pricing) -> float:
    """A judge's tokens in micro-USD: every one at `verifier_per_mtok` where set, else prompt
    at the dearer prompt rate and output at the output rate."""
    if pricing.verifier_per_mtok is not None:
        return (prompt + output) * pricing.verifier_per_mtok
    return (
        prompt * max(pricing.input_per_mtok, pricing.cached_input_per_mtok) + output * pricing.output_per_mtok
    )


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


def judge_tokens(config: LoopConfig, prompt: int, params: BaseModel, candidates: int) -> tuple[int, int]:
    """The most the loop's reducer's judging of `candidates` asks (prompt, output tokens), as
    the reducer declares it; (0, 0) where it judges nothing."""
    choice = loop_reducer(config.loop_class(), params)
    if choice is None or not choice.name:
        return 0, 0
    with plugin_folders(config.folder):  # a `module:Class` reducer beside the config first
        traits = reducer_traits(resolve_reducer(choice.name))
    judge = config.judge
    return traits.judge_tokens(
        JudgeCall(
            candidates=candidates,
            prompt_tokens=prompt,
            answer_tokens=config.sampling.max_tokens + FRAME_TOKENS,
            max_tokens=judge.max_tokens,
            template=judge.template is not None,
            verifier=judge.verifier is not None or judge.verifier_command is not None,
        )
    )


def worst_case(config: LoopConfig, prompt: int, params: BaseModel | None = None) -> WorstCase | None:
    """The worst case of one question under `config` (with `params` for its loop's, if given)
    and a first prompt of `prompt` tokens, on the backend at hand; None where the loop declares
    no cost shape or cannot bound its lanes."""
    params = params if params is not None else config.loop_params
    most = config.sampling.max_tokens
    shape = cost_shape(config.loop_class(), params, prompt_tokens=prompt, max_tokens=most)
    if shape is None:
        return None
    serving = Serving.of(config)
    waves = shape_waves(shape)
    computed = sum(int(worst(w, serving, 0, Pricing(), "tokens")) for w in waves)
    seen = sum(w.lanes * w.prompt_tokens for w in waves)
    judge_in, judge_out = judge_tokens(config, prompt, params, shape.candidates)
    return WorstCase(shape.lanes, computed, shape.lanes * most, judge_in, judge_out, seen - computed)


def judge_worst(config: LoopConfig, mode: BudgetMode, prompt: int, params: BaseModel) -> float:
    """The most `params`' judge may pay a question in `mode` (0 where it judges nothing)."""
    case = worst_case(config, prompt, params)
    if case is None or mode == "lanes":
        return 0.0
    if mode == "tokens":
        return float(case.judge_prompt_tokens + case.judge_output_tokens)
    return _judge_usd(case.judge_prompt_tokens, case.judge_output_tokens, config.pricing) * 1e-6


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


def is_greedy(config: LoopConfig) -> bool:
    """One lane at temperature 0, as configured: greedy decoding, which an equal budget never
    fits (more lanes at temperature 0 are the same answer again) but draws at its real spend."""
    shape = cost_shape(config.loop_class(), config.loop_params, prompt_tokens=0, max_tokens=1)
    return shape is not None and shape.lanes == 1 and config.sampling.temperature == 0


def checked_budget(mode: BudgetMode, budget: float) -> float:
    """`--budget`, refused unless a positive number (whole, but for cost)."""
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(f"--budget: must be a positive number, got {budget:g}")
    if mode != "cost" and budget != int(budget):
        raise ConfigError(f"--budget: {mode} are counted in whole numbers, got {budget:g}")
    return budget


def per_question_limit(
    config: LoopConfig,
    mode: BudgetMode,
    budget: float,
    questions: Sequence[str] = (),
    ceiling: Price | None = None,
) -> float:
    """The per-question limit for `config` (its loop's keys already fitted) at `budget`: the
    budget, or, where larger, `ceiling(params)` (what each wave needs to run whole when those
    before it spent as expected) or, without one, the params' worst case; the budget itself
    where the loop declares no cost shape."""
    params = config.loop_params
    needed = ceiling(params) if ceiling is not None else None
    if needed is None:
        needed = worst_in(config, mode, prompt_tokens(config, questions), params)
    return budget if needed is None else max(budget, needed)


def apply_limit(
    config: LoopConfig,
    mode: BudgetMode,
    budget: float,
    source: str,
    questions: Sequence[str] = (),
    price: Price | None = None,
    ceiling: Price | None = None,
) -> LoopConfig:
    """`config` with its loop's keys as the loop's `fit` sets them for `budget` (see
    `fitted_keys`) and the per-question limit written in: `[budget] max_tokens` or
    `max_cost_usd` (`per_question_limit`); none for lanes."""
    raw = config.model_dump(mode="json")
    raw["loop"].update(fitted_keys(config, mode, budget, source, questions, price))
    fitted = parse_config(raw, source=source, folder=config.folder)
    if mode == "lanes":
        return fitted
    limit = per_question_limit(fitted, mode, budget, questions, ceiling)
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
        raise type(exc)(f"{source}: {exc}") from None
    return {
        key: value for key, value in fitted.model_dump(mode="json").items() if key in fitted.model_fields_set
    }


def lane_cap(config: LoopConfig, lanes: int, source: str) -> dict[str, Any]:
    """The loop keys that keep its sampled lanes per question at or under `lanes`."""
    return fitted_keys(config, "lanes", lanes, source)
