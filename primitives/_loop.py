"""The loop seam: what a loop is, what it may do, and what it returns.

A loop (`Loop`) is a class with a `name`, a pydantic `Params` model for its `[loop]` keys, a
constructor taking its validated `Params`, and `async run(ctx, question) -> Outcome`. It talks
to the governed path only through its `LoopContext`: `ctx.wave(...)` dispatches lanes through
the one dispatch path (budget, concurrency, retries, the log), `ctx.reduce(...)` runs a
registered `Reducer`, `ctx.record(...)` logs the loop's own events. Everything a loop decides
from is in the log, so a resumed loop replays its waves from the record instead of sampling
again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from lanefold.primitives._answers import ExtractSpec
from lanefold.primitives._backend import Backend, SamplingParams
from lanefold.primitives._budget import Spend
from lanefold.primitives._dispatch import LaneJob
from lanefold.primitives._state import LaneState, RunState
from lanefold.primitives._verifier import Verdict, Verifier
from lanefold.primitives.events import Bill

__all__ = (
    "Budget",
    "JudgeSettings",
    "Lane",
    "Loop",
    "LoopContext",
    "Outcome",
    "ReduceOptions",
    "Reducer",
    "Reduction",
    "Remaining",
)


@dataclass(frozen=True, slots=True)
class Lane:
    """One lane of a wave as a loop sees it: where it ran, what it said, how it ended.

    `status` is "completed", "failed" (for good), "interrupted" or "pending"; `answer` is what
    the wave's extractor found in `text` (None: nothing, or no extractor; `answer_error` then
    says why, where the extractor says: an invalid call or value).
    """

    wave: int
    lane: int
    status: str
    text: str | None = None
    answer: str | None = None
    logprob_mean: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    prompt: str | None = None
    answer_error: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @classmethod
    def of(cls, wave: int, state: LaneState, prompt: str | None = None) -> Lane:
        return cls(
            wave,
            state.lane,
            state.status,
            state.text,
            state.answer,
            state.logprob_mean,
            state.finish_reason,
            state.error,
            prompt,
            state.answer_error,
        )


@dataclass(frozen=True, slots=True)
class Reduction:
    """What a reducer decided over a set of lanes.

    `votes` (answer -> its ballots: a count for a plain vote, a total weight for a weighted
    one) and `scores` (lane -> score, None an abstention) are filled by the reducers that have
    them; `agreement` is the winner's share of the answered lanes, `margin` its lead over the
    runner-up (in votes or in score).
    """

    reducer: str
    winner: str | None
    winner_lane: int | None
    votes: Mapping[str, int] | Mapping[str, float] = field(default_factory=dict)
    scores: Mapping[int, float | None] = field(default_factory=dict)
    tie_break: str = "none"
    tied: tuple[Any, ...] = ()
    abstentions: int = 0
    agreement: float | None = None
    margin: float | None = None
    reason: str | None = None  # why there is no winner, when there is none
    detail: Mapping[str, Any] = field(default_factory=dict)
    wave: int | None = None  # the candidates' wave, when they came from one
    winner_wave: int | None = None  # the winning lane's wave


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a loop returns; the runner adds the bill and the run's identity.

    Only `answer` is needed: `status` is "answered" when there is an answer, else
    "no_answer" (with `reason`). `detail` lands in the result as `outcome`; `reduction`, where
    a reducer decided, fills the result's `reducer`, `votes` and `scores`.
    """

    answer: str | None = None
    winner_lane: int | None = None
    winner_text: str | None = None
    status: Literal["answered", "no_answer"] | None = None
    reason: str | None = None
    agreement: float | None = None
    margin: float | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    reduction: Reduction | None = None
    winner_wave: int | None = None

    @property
    def answered(self) -> bool:
        return self.status == "answered" if self.status is not None else self.answer is not None


@dataclass(frozen=True, slots=True)
class Remaining:
    """What the budget has left to reserve; None where there is no limit."""

    tokens: int | None
    cost_usd: float | None
    requests: int | None
    seconds: float | None


class Budget(Protocol):
    """The run's budget as a loop may consult it (the dispatch path enforces it anyway)."""

    def remaining(self) -> Remaining:
        """What is left after spend and the holds of lanes in flight."""
        ...

    def can_afford(
        self, n: int, max_tokens: int, *, prompt: str = "", bill: Bill = "sample", share_prefix: bool = True
    ) -> bool:
        """Whether a wave of `n` lanes of `max_tokens` each (on `prompt`) can be funded now:
        one shared request with `share_prefix`, else a request per lane (lanes with prompts
        of their own, as a debate round's or a judge's)."""
        ...

    @property
    def spent(self) -> Spend:
        """The bill so far (a copy)."""
        ...


@dataclass(frozen=True, slots=True)
class JudgeSettings:
    """The `[judge]` section as reducers use it: an LLM judge's template and sampling."""

    template: str | None = None
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=64))
    score_regex: str | None = None
    usc_template: str | None = None


@dataclass(frozen=True, slots=True)
class ReduceOptions:
    """How a reducer breaks ties and weighs lanes; the seed makes `random` reproducible.
    `quorum`: the lanes that must give an answer (cast a ballot) before a vote names a winner;
    a lane that completed with nothing extracted is no ballot."""

    tie_break: str = "first_lane"
    weighting: str = "none"  # "none", "mean_logprob" or "verifier"
    seed: int = 0
    quorum: int = 1


@runtime_checkable
class LoopContext(Protocol):
    """What a running loop may do: dispatch waves, reduce, record, read state and budget."""

    question: str
    seed: int  # the run's seed (`loop.seed`); lane seeds derive from it
    sampling: SamplingParams  # the config's `[sampling]`
    extract: ExtractSpec  # the config's `[extract]`
    judge: JudgeSettings
    verifier: Verifier | None  # the configured verifier, if any
    judge_backend: Backend | None  # the configured judge backend, if any

    @property
    def state(self) -> RunState:
        """The run's state as folded from its log (read it; never change it)."""
        ...

    @property
    def budget(self) -> Budget: ...

    def prompt(self, question: str | None = None) -> str:
        """The config's `[prompt]` template filled with the question (this run's by default)."""
        ...

    async def wave(
        self,
        prompts: Sequence[str | LaneJob],
        *,
        params: SamplingParams | None = None,
        purpose: str = "sample",
        bill: Bill | None = None,
        quorum: int = 1,
        share_prefix: bool = True,
        extract: ExtractSpec | bool | None = True,
        backend: Literal["main", "judge"] = "main",
    ) -> list[Lane]:
        """One governed wave: a lane per prompt (or per `LaneJob`), in order.

        Sampling defaults to the config's, answers are extracted with the config's extractor
        (`extract=False`: none; an `ExtractSpec`: that one), `bill` defaults to "verifier" for
        purpose "judge" and "sample" otherwise; `quorum` lanes must complete or the run fails.
        On resume a wave already in the log is returned from it (finishing its missing lanes),
        and one asked for with another spec raises NonDeterminismError.
        """
        ...

    async def reduce(
        self,
        lanes: Sequence[Lane],
        reducer: str | Reducer = "majority_vote",
        *,
        options: ReduceOptions | None = None,
    ) -> Reduction:
        """Reduce `lanes` with a registered reducer (by name) and record `reduce.completed`."""
        ...

    async def verify(self, lanes: Sequence[Lane]) -> dict[int, Verdict]:
        """The configured verifier's verdict on each completed lane, recorded as
        `judge.completed` (a lane judged before a crash is not judged again), by lane number:
        the lanes may span waves where their numbers differ (ConfigError where two share one)."""
        ...

    def record(
        self, noun: str, data: Mapping[str, Any], *, wave: int | None = None, lane: int | None = None
    ) -> Mapping[str, Any]:
        """Record `loop.<loop name>.<noun>` with `data` (JSON). On resume, the n-th record of
        a replayed loop returns what the log holds instead of writing it again."""
        ...

    def record_verdict(
        self,
        lane: Lane,
        score: float | None,
        judge: str,
        *,
        detail: str = "",
        passed: bool | None = None,
        error: str | None = None,
        wave: int | None = None,
    ) -> None:
        """Record a judge's verdict on `lane` (`judge.completed`), once per lane and reduction
        (a reducer that scores lanes itself, as an LLM judge does, records each score here)."""
        ...


@runtime_checkable
class Loop(Protocol):
    """A coordination loop: `Loop(params)` then `await loop.run(ctx, question)`.

    What the facade needs besides, a loop declares on its class (each optional; the defaults
    are `loop_reducer` and, in `lanefold.primitives.internal`, `cost_shape`, `fit_params`,
    `reduced_lanes` and `audit_run`): `cost_shape(params, *, prompt_tokens, max_tokens) -> CostShape | None`
    (its worst case for a question), `fit(params, budget: Allowance) -> params` (how it spends
    a per-question budget, for `compare --equal-budget`), `reducer(params) -> ReducerChoice |
    None` (the reducer of its own reduce), `candidates(params, state) -> list[Lane] | None`
    (the lanes that reduce read, from the log: a reader runs a `replays` reducer again over
    them) and `audit(params, state, *, extract, seed)` (a claim of its log that does not
    follow from it). So nothing outside the loop knows it by name.
    """

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]]

    def __init__(self, params: BaseModel) -> None: ...  # its own `Params`, validated

    async def run(self, ctx: LoopContext, question: str) -> Outcome: ...


@runtime_checkable
class Reducer(Protocol):
    """Turns a wave's lanes into one answer. `Reducer(options)` then `await reduce(ctx, lanes)`.

    `needs_judge` reducers need `[judge] template` or a verifier. A reducer that calls a model
    (a judge, usc) does it through `ctx.wave`, so it is governed, priced and resumable.

    It may declare besides (read with their defaults by `reducer_traits`): `needs_verifier`
    (it ranks by a verifier's verdicts), `verifier_weighting` (it weighs lanes by a verifier's
    scores under `weighting = "verifier"`), `uses_model` (it may call a model: a re-reduction
    builds a backend for it), `replays` (its reduce is a function of the log, so a reader runs
    it again there: `primitives/_replay.py`), `judge_keys` (the `[judge]` keys it reads), `judge_tokens(call:
    JudgeCall) -> (prompt, output)` (its judge's worst case for a question) and
    `summary(reduction) -> str | None` (a one-line account of its result, for `show`).
    """

    name: ClassVar[str]
    needs_judge: ClassVar[bool]

    def __init__(self, options: ReduceOptions | None = None) -> None: ...

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction: ...
