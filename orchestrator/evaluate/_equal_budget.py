"""Equal budgets for `orchestrator compare`: what a config could spend on one question, and
one per-question limit written into every config before it runs.

"Needs" is each config's worst case, known from its keys before anything runs (no pilot):
lanes are the loop's own bound (k, max_lanes, steps, agents x (rounds + 1)); tokens are
those lanes' prompts and `max_tokens` outputs, with the earlier answers a refine or debate
prompt quotes and the judge's calls; cost prices those tokens at the config's own rates. The
estimate errs high, so the default limit (the largest need) never shrinks a config's waves.
Tokens and cost go into `[budget]` (`max_tokens`, `max_cost_usd`); lanes cap the loop's own
keys, since `max_requests` counts requests and one request carries many lanes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lanefold._config import LoopConfig, parse_config
from lanefold.primitives import ConfigError, Pricing

__all__ = ("BUDGET_MODES", "BudgetMode", "WorstCase", "apply_limit", "equal_limit", "lane_cap",
           "need", "prompt_tokens", "worst_case")

BudgetMode = Literal["tokens", "cost", "lanes"]
BUDGET_MODES: tuple[BudgetMode, ...] = ("tokens", "cost", "lanes")

# Generous allowances where a prompt holds more than the question: a loop's or a judge's own
# template around it, and the framing of each earlier answer it quotes (labels, feedback).
_TEMPLATE_TOKENS = 256
_FRAME_TOKENS = 64
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
        return (self.prompt_tokens + self.output_tokens + self.judge_prompt_tokens
                + self.judge_output_tokens)

    def cost_usd(self, pricing: Pricing) -> float:
        """Priced as the ledger prices it, a prompt token at the dearer of its two rates."""
        prefill = max(pricing.input_per_mtok, pricing.cached_input_per_mtok)
        sample = self.prompt_tokens * prefill + self.output_tokens * pricing.output_per_mtok
        if pricing.verifier_per_mtok is not None:
            judge = (self.judge_prompt_tokens + self.judge_output_tokens) * pricing.verifier_per_mtok
        else:
            judge = (self.judge_prompt_tokens * prefill
                     + self.judge_output_tokens * pricing.output_per_mtok)
        return (sample + judge) * 1e-6


def prompt_tokens(config: LoopConfig, questions: Sequence[str]) -> int:
    """The largest first prompt of these questions, in tokens: the simulated backend's own
    count, else UTF-8 bytes + 32 (a byte-level tokenizer never makes more tokens than bytes)."""
    backend = config.backend
    if backend.kind == "simulated":
        return int(getattr(backend, "prompt_tokens", 0))
    template = config.prompt.template
    return max((len(template.replace("{question}", q).encode()) for q in questions),
               default=len(template.encode())) + _BYTE_MARGIN


def worst_case(config: LoopConfig, prompt: int) -> WorstCase | None:
    """The worst case of one question under `config` with a first prompt of `prompt` tokens;
    None for a loop whose lanes this cannot bound (plan_verify_replan, a `module:Class`)."""
    p: Any = config.loop_params
    most = config.sampling.max_tokens
    quoted = most + _FRAME_TOKENS  # one earlier answer, quoted in a later prompt
    name = config.loop.coordinator
    if name == "parallel_sample":
        lanes, prompts, candidates = p.k, p.k * prompt, p.k
    elif name == "adaptive_sample":
        lanes, prompts, candidates = p.max_lanes, p.max_lanes * prompt, p.max_lanes
    elif name == "sequential_refine":
        shown = [i if p.mode == "autoregressive" else min(i, 1) for i in range(p.steps)]
        lanes, candidates = p.steps, p.steps
        prompts = sum(prompt + (_TEMPLATE_TOKENS + n * quoted if n else 0) for n in shown)
    elif name == "debate":
        seen = p.agents if p.visibility == "all" else min(p.agents, 3)
        lanes, candidates = p.agents * (p.rounds + 1), p.agents
        prompts = p.agents * prompt + p.agents * p.rounds * (
            prompt + _TEMPLATE_TOKENS + seen * quoted)
    else:
        return None
    reducer = getattr(p, "reducer", None) or getattr(p, "reduce", None)
    judge = config.judge
    judge_in = judge_out = 0
    if reducer == "usc":
        judge_in, judge_out = prompt + _TEMPLATE_TOKENS + candidates * quoted, judge.max_tokens
    elif reducer == "judge_argmax" and judge.template is not None and judge.verifier is None \
            and judge.verifier_command is None:
        judge_in = candidates * (prompt + _TEMPLATE_TOKENS + quoted)
        judge_out = candidates * judge.max_tokens
    return WorstCase(lanes, prompts, lanes * most, judge_in, judge_out)


def need(config: LoopConfig, mode: BudgetMode, questions: Sequence[str],
         source: str) -> float:
    """What `config` needs per question in `mode` (its worst case), or ConfigError."""
    case = worst_case(config, prompt_tokens(config, questions))
    if case is None:
        raise ConfigError(f"{source}: loop.coordinator: the worst case of "
                          f"{config.loop.coordinator!r} per question is not known; give "
                          f"--budget N for --equal-budget {mode}")
    if mode == "lanes":
        return float(case.lanes)
    if mode == "tokens":
        return float(case.tokens)
    return case.cost_usd(config.pricing)


def equal_limit(configs: Sequence[tuple[str, LoopConfig]], mode: BudgetMode,
                questions: Sequence[str], budget: float | None = None,
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
        raise ConfigError("--equal-budget cost: every config's worst case costs $0 (no "
                          "[pricing] rates); equalise tokens, or give [pricing] rates")
    return limit, needs


def _checked_budget(mode: BudgetMode, budget: float) -> float:
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(f"--budget: must be a positive number, got {budget:g}")
    if mode != "cost" and budget != int(budget):
        raise ConfigError(f"--budget: {mode} are counted in whole numbers, got {budget:g}")
    return budget


def apply_limit(config: LoopConfig, mode: BudgetMode, limit: float,
                source: str) -> LoopConfig:
    """`config` with the per-question limit written in: `[budget] max_tokens` or
    `max_cost_usd`; for lanes, the loop's own lane keys capped so its worst case fits."""
    raw = config.model_dump(mode="json")
    if mode == "tokens":
        raw["budget"]["max_tokens"] = int(limit)
    elif mode == "cost":
        raw["budget"]["max_cost_usd"] = limit
    else:
        raw["loop"].update(lane_cap(config, int(limit), source))
    return parse_config(raw, source=source)


def lane_cap(config: LoopConfig, lanes: int, source: str) -> dict[str, int]:
    """The loop keys that keep its sampled lanes per question at or under `lanes`."""
    p: Any = config.loop_params
    name = config.loop.coordinator
    if name == "parallel_sample":
        k = min(p.k, lanes)
        return {"k": k, "min_quorum": min(p.min_quorum, k)}
    if name == "adaptive_sample":
        most = min(p.max_lanes, lanes)
        return {"max_lanes": most, "window": min(p.window, most),
                "min_quorum": min(p.min_quorum, most)}
    if name == "sequential_refine":
        return {"steps": min(p.steps, lanes)}
    if name == "debate":
        if lanes < 2:
            raise ConfigError(f"{source}: --budget: a debate needs at least 2 lanes, got {lanes}")
        agents = min(p.agents, lanes)
        return {"agents": agents, "rounds": min(p.rounds, lanes // agents - 1)}
    raise ConfigError(f"{source}: loop.coordinator: --equal-budget lanes cannot cap the lanes "
                      f"of {name!r}; equalise tokens or cost")
