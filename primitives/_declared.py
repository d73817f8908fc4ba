"""What a loop or a reducer declares for the facade, read with the defaults of one that does not.

The facade never tests a plug-in's name or class. It compares loops at equal budget from each
loop's `cost_shape` and `fit`, checks a run's record with the loop's `candidates` and `audit`
(`audit_run`, in `primitives/_audit.py`), finds the loop's reducer with `reducer`, and checks and
shows a reducer through what it declares (`needs_verifier`, `uses_model`, `replays`,
`judge_keys`, `judge_tokens`, `summary`). Every one of these is optional on a plug-in; the
functions here read it, or give its default:

- `cost_shape`: None, "not known" (so `compare --equal-budget` asks for `--budget N` rather than
  guess a loop's lanes);
- `fit`: the params unchanged for tokens and cost (the per-question `[budget]` limit binds as the
  loop runs), refused for lanes (a lane budget the loop cannot cap would not be equal);
- `reducer`: None, "the loop picks its reducers itself"; `candidates`: None, "not said" (its
  reduce is not re-run on reading); `audit`: none;
- a budget stop: a loop that stops because its budget cannot fund its next step says
  `budget_stop: true` in its outcome's detail (`stopped_for_budget`), so an eval can say the
  question was cut at its cap;
- `pool`: None, "a smaller budget's lanes are not a subset of a larger one's" (sweep samples
  each of its points);
- a reducer's `needs_verifier` False, `uses_model` True (it may call one), `replays` False (its
  reduce is not re-derived from a log), `judge_keys` None
  (any `[judge]` key), `judge_tokens` (0, 0), `summary` its votes or scores where it has them;
- a reducer's or a verifier's `extract_methods` None, "any answer" (one that reads JSON values
  or calls names the `[extract]` methods whose answers it reads: `extract_mismatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._loop import Loop, ReduceOptions, Reducer, Reduction
from lanefold.primitives._shape import Allowance, BudgetUnit, CostShape, largest_within, readable_number
from lanefold.primitives._structured import describe_answer

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
    "extract_methods",
    "extract_mismatch",
    "fit_params",
    "largest_within",
    "loop_reducer",
    "pooled_lanes",
    "reducer_traits",
    "score_summary",
    "scores_line",
    "stopped_for_budget",
    "tally",
    "vote_summary",
)

AuditFinding = tuple[int, str]
"""One thing `audit_run` found wrong in a run's log: (the line, what is wrong)."""

TEMPLATE_TOKENS = 256
"""A generous allowance, in tokens, for a loop's or a judge's own template around the question."""
FRAME_TOKENS = 64
"""A generous allowance, in tokens, for the framing of each earlier answer a prompt quotes
(labels, feedback)."""


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


def pooled_lanes(loop: type[Any], params: BaseModel) -> int | None:
    """The lanes of one question under `params` where the loop declares them a pool (its
    `pool`): i.i.d. lanes of one prompt, plainly voted, so a run with fewer is a subsample of
    them and `sweep` reads smaller budgets from the largest's lanes; None where it does not."""
    declared = getattr(loop, "pool", None)
    if declared is None:
        return None
    lanes: int | None = declared(params)
    return lanes


def loop_reducer(loop: type[Loop], params: BaseModel) -> ReducerChoice | None:
    """The reducer the loop's params name for its own reduce; None where the loop (a plug-in
    that declares none) picks its reducers itself."""
    declared = getattr(loop, "reducer", None)
    if declared is None:
        return None
    choice: ReducerChoice | None = declared(params)
    return choice


def stopped_for_budget(detail: Mapping[str, Any]) -> bool:
    """Whether a loop's outcome detail says it stopped because the budget could not fund its
    next step (`budget_stop: true`)."""
    return detail.get("budget_stop") is True


# -- reducers -----------------------------------------------------------------------------------


def tally(votes: Mapping[str, float]) -> str:
    """`15 ×5 · 14 ×2`: answers by weight, integers when the vote was unweighted; a call or a
    JSON value as a person reads it (`get_weather(city="Paris") ×3`)."""
    ranked = sorted(votes.items(), key=lambda item: -item[1])
    return " · ".join(f"{describe_answer(answer)} ×{readable_number(weight)}" for answer, weight in ranked)


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
    extract_methods: frozenset[str] | None = None

    def wants_verifier(self, weighting: str) -> bool:
        """Whether reducing with `weighting` needs a verifier's scores."""
        return self.needs_verifier or (self.verifier_weighting and weighting == "verifier")


def reducer_traits(reducer: type[Reducer]) -> ReducerTraits:
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
        extract_methods=extract_methods(reducer),
    )


def extract_methods(plugin: object) -> frozenset[str] | None:
    """The `[extract]` methods whose answers a reducer or a verifier reads (its
    `extract_methods`); None: any."""
    methods = getattr(plugin, "extract_methods", None)
    return frozenset(methods) if methods is not None else None


def extract_mismatch(plugin: object, method: str, what: str) -> str | None:
    """Why `plugin` (a reducer or a verifier, called `what`) cannot read the answers of
    `[extract] method = method`, or None where it can."""
    methods = extract_methods(plugin)
    if methods is None or method in methods:
        return None
    return f"{what} reads answers extracted as {' or '.join(sorted(methods))}, not {method!r}"
