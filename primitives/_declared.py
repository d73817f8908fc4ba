"""What a loop or a reducer declares for the facade, read with the defaults of one that does not.

The facade never tests a plug-in's name or class. It compares loops at equal budget from each
loop's `cost_shape` and `fit`, checks a run's record with the loop's `candidates` and `audit` (`audit_run`, in
`primitives/_audit.py`), finds the loop's reducer with `reducer`, and checks and shows a reducer
through what it declares (`needs_verifier`, `uses_model`, `replays`, `judge_keys`,
`judge_tokens`, `summary`). Every one of these is
optional on a plug-in; the functions here read it, or give its default:

- `cost_shape`: None, "not known" (so `compare --equal-budget` asks for `--budget N` rather than
  guess a loop's lanes);
- `fit`: the params unchanged for tokens and cost (the per-question `[budget]` limit binds as the
  loop runs), refused for lanes (a lane budget the loop cannot cap would not be equal);
- `reducer`: None, "the loop picks its reducers itself"; `candidates`: None, "not said" (its
  reduce is not re-run on reading); `audit`: none;
- `pool`: None, "a smaller budget's lanes are not a subset of a larger one's" (sweep samples
  each of its points);
- a reducer's `needs_verifier` False, `uses_model` True (it may call one), `replays` False (its
  reduce is not re-derived from a log), `judge_keys` None
  (any `[judge]` key), `judge_tokens` (0, 0), `summary` its votes or scores where it has them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._loop import ReduceOptions, Reduction

__all__ = (
    "FRAME_TOKENS",
    "TEMPLATE_TOKENS",
    "Allowance",
    "AuditFinding",
    "BudgetUnit",
    "CostShape",
    "JudgeCall",
    "ReducerChoice",
    "ReducerTraits",
    "cost_shape",
    "fit_params",
    "largest_within",
    "loop_reducer",
    "pooled_lanes",
    "reducer_traits",
    "score_summary",
    "scores_line",
    "tally",
    "vote_summary",
)

BudgetUnit = Literal["tokens", "cost", "lanes"]
AuditFinding = tuple[int, str]  # (line, what is wrong)

# Generous allowances where a prompt holds more than the question: a loop's or a judge's own
# template around it, and the framing of each earlier answer it quotes (labels, feedback).
TEMPLATE_TOKENS = 256
FRAME_TOKENS = 64


@dataclass(frozen=True, slots=True)
class CostShape:
    """The most one question asks of the sampling backend under a loop's params: lanes
    sampled, their prompt tokens in all (every one counted as prefill), and the candidates its
    final reducer judges. Each lane may write up to `[sampling] max_tokens`. `prefill_tokens`:
    of those prompt tokens, the ones computed where a backend shares a wave's prefix among its
    lanes (the rest are cached prefill); None: every one."""

    lanes: int
    prompt_tokens: int
    candidates: int
    prefill_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class JudgeCall:
    """What bounds a reducer's judging of one question: its candidates, the question's prompt
    tokens, the most one quoted candidate takes, the judge's `max_tokens` a call, and whether
    `[judge] template` and a verifier are configured."""

    candidates: int
    prompt_tokens: int
    answer_tokens: int
    max_tokens: int
    template: bool = False
    verifier: bool = False


@dataclass(frozen=True, slots=True)
class Allowance:
    """A per-question budget a loop is fitted to: `amount` in `unit`, and `price`, what a
    params is expected to pay per question in that unit (None: not known), so a fit can search
    its own params for those whose spend fills the budget without passing it."""

    unit: BudgetUnit
    amount: float
    price: Callable[[BaseModel], float | None] = field(default=lambda _params: None)


@dataclass(frozen=True, slots=True)
class ReducerChoice:
    """The reducer a loop's params name for its own reduce, as configured (a registered name
    or `module:Class`; "" where it answers without one), and the options it runs it with
    (seed 0: the run's seed is the config's); `judge_keys`, the `[judge]` keys the loop itself
    reads besides its reducer's (a verifier for feedback, say)."""

    name: str
    options: ReduceOptions = field(default_factory=ReduceOptions)
    judge_keys: frozenset[str] = frozenset()  # `[judge]` keys the loop reads itself


def cost_shape(
    loop: type[Any], params: BaseModel, *, prompt_tokens: int, max_tokens: int
) -> CostShape | None:
    """The loop's declared cost shape for a question whose first prompt has `prompt_tokens`;
    None where the loop declares none or cannot bound it."""
    declared = getattr(loop, "cost_shape", None)
    if declared is None:
        return None
    shape: CostShape | None = declared(params, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    return shape


def fit_params(loop: type[Any], params: BaseModel, budget: Allowance) -> BaseModel:
    """The params with which the loop spends `budget` per question (its declared `fit`); a
    loop that declares none keeps its params for tokens and cost, and is refused for lanes."""
    declared = getattr(loop, "fit", None)
    if declared is None:
        if budget.unit == "lanes":
            raise ConfigError(
                f"loop.coordinator: --equal-budget lanes cannot cap the lanes of "
                f"{loop.name!r} (it declares no fit); equalise tokens or cost"
            )
        return params
    fitted: BaseModel = declared(params, budget)
    return fitted


def largest_within(
    budget: Allowance, least: int, candidate: Callable[[int], BaseModel], most: int = 4096
) -> int | None:
    """The largest n in [least, most] whose `candidate(n)` the budget's price keeps within its
    amount (spend grows with n: doubled, then halved down); None where its price is not known.
    A ConfigError where even `least` passes it: the budget is below what the loop must spend."""

    def fits(n: int) -> bool | None:
        price = budget.price(candidate(n))
        return None if price is None else price <= budget.amount

    first = fits(least)
    if first is None:
        return None
    if not first:
        price = budget.price(candidate(least)) or 0.0
        raise ConfigError(
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


def pooled_lanes(loop: type[Any], params: BaseModel) -> int | None:
    """The lanes of one question under `params` where the loop declares them a pool (its
    `pool`): i.i.d. lanes of one prompt, plainly voted, so a run with fewer is a subsample of
    them and `sweep` reads smaller budgets from the largest's lanes; None where it does not."""
    declared = getattr(loop, "pool", None)
    if declared is None:
        return None
    lanes: int | None = declared(params)
    return lanes


def loop_reducer(loop: type[Any], params: BaseModel) -> ReducerChoice | None:
    """The reducer the loop's params name for its own reduce; None where the loop (a plug-in
    that declares none) picks its reducers itself."""
    declared = getattr(loop, "reducer", None)
    if declared is None:
        return None
    choice: ReducerChoice | None = declared(params)
    return choice


# -- reducers -----------------------------------------------------------------------------------


def readable_number(value: float) -> str:
    """A vote or score for a person: an integer where it is one, else three figures."""
    if float(value).is_integer():
        return str(int(value))
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e+" in text else text  # 1234.5 reads as 1234, not 1.23e+03


def tally(votes: Mapping[str, float]) -> str:
    """`15 ×5 · 14 ×2`: answers by weight, integers when the vote was unweighted."""
    ranked = sorted(votes.items(), key=lambda item: -item[1])
    return " · ".join(f"{answer} ×{readable_number(weight)}" for answer, weight in ranked)


def scores_line(scores: Mapping[int, float | None]) -> str:
    """`lane 0: 7 · lane 1: -`: judge scores by lane, `-` for an abstention."""
    return " · ".join(
        f"lane {lane}: {readable_number(score) if score is not None else '-'}"
        for lane, score in sorted(scores.items())
    )


def vote_summary(reduction: Reduction) -> str:
    """`votes: 15 ×5 · 14 ×2  (agreement 71%)`, or `votes: no votes`."""
    return f"votes: {tally(reduction.votes) if reduction.votes else 'no votes'}" + (
        f"  (agreement {reduction.agreement:.0%})" if reduction.agreement is not None else ""
    )


def score_summary(reduction: Reduction) -> str:
    """`scores: lane 0: 7 · lane 1: -  (margin 2)`, or `scores: none`."""
    return f"scores: {scores_line(reduction.scores) or 'none'}" + (
        f"  (margin {readable_number(reduction.margin)})" if reduction.margin is not None else ""
    )


def _any_summary(reduction: Reduction) -> str | None:
    if reduction.votes:
        return vote_summary(reduction)
    if reduction.scores:
        return score_summary(reduction)
    return None


def _no_judge(call: JudgeCall) -> tuple[int, int]:
    return 0, 0


@dataclass(frozen=True, slots=True)
class ReducerTraits:
    """What a reducer class declares, its defaults filled in (see the module's docstring)."""

    name: str
    needs_judge: bool
    needs_verifier: bool
    verifier_weighting: bool
    uses_model: bool
    replays: bool
    judge_keys: frozenset[str] | None
    judge_tokens: Callable[[JudgeCall], tuple[int, int]]
    summary: Callable[[Reduction], str | None]

    def wants_verifier(self, weighting: str) -> bool:
        """Whether reducing with `weighting` needs a verifier's scores."""
        return self.needs_verifier or (self.verifier_weighting and weighting == "verifier")


def reducer_traits(reducer: type[Any]) -> ReducerTraits:
    """What `reducer` declares, with the defaults of what it does not."""
    keys = getattr(reducer, "judge_keys", None)
    return ReducerTraits(
        name=str(reducer.name),
        needs_judge=bool(getattr(reducer, "needs_judge", False)),
        needs_verifier=bool(getattr(reducer, "needs_verifier", False)),
        verifier_weighting=bool(getattr(reducer, "verifier_weighting", False)),
        uses_model=bool(getattr(reducer, "uses_model", True)),
        replays=bool(getattr(reducer, "replays", False)),
        judge_keys=frozenset(keys) if keys is not None else None,
        judge_tokens=getattr(reducer, "judge_tokens", _no_judge),
        summary=getattr(reducer, "summary", _any_summary),
    )
