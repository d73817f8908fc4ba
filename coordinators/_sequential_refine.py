"""sequential_refine: one chain of attempts, each prompt showing the earlier ones.

`steps` attempts, one lane (one governed wave) each. The prompt of an attempt is the config's
template (the question on its first line) followed by the last attempt (`mode = "markov"`) or
all of them (`"autoregressive"`), each with its answer on a line `Answer: X` and, where a
verifier is configured, its verdict on a line `Feedback: ...`. The chain stops after `steps`
attempts, at the first attempt the verifier passes (`stop_on_pass`), or when the budget cannot
fund another attempt; the answer is the last attempt's (`reduce = "last"`) or any registered
reducer's over all the attempts.

Gu et al. (2026) find parallel sampling beats this at equal budget: a chain that sees its own
attempts copies them. It is here so that claim can be checked, and for tasks whose verifier
gives feedback worth reading (failing tests, a checker's message).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lanefold.coordinators._parallel_sample import outcome_of
from lanefold.coordinators._reducer_keys import (
    TieBreak,
    Weighting,
    known_reducer,
    with_logprobs,
)
from lanefold.coordinators._reducers import VERIFIER_KEYS
from lanefold.coordinators._refine_audit import attempts, audit_refine, last_answered
from lanefold.primitives import (
    FRAME_TOKENS,
    TEMPLATE_TOKENS,
    Allowance,
    AuditFinding,
    ConfigError,
    CostShape,
    ExtractSpec,
    Lane,
    LaneJob,
    LoopContext,
    Outcome,
    ReduceOptions,
    Reducer,
    ReducerChoice,
    Reduction,
    RunState,
    Verdict,
    WaveShape,
    largest_within,
    reducer_traits,
    register_loop,
    resolve_reducer,
)

__all__ = (
    "EXPLORE",
    "SequentialRefine",
    "SequentialRefineParams",
    "TemperatureRamp",
    "feedback_line",
    "refine_prompt",
)

EXPLORE = (
    "Try a different approach from the earlier attempts: do not repeat their reasoning "
    "or restate their answers without checking them."
)
CLOSING = "Correct any mistake you find, then end with 'Answer: <answer>'."


class TemperatureRamp(BaseModel):
    """A linear temperature schedule: `start` at the first attempt, `end` at the last."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: float = Field(ge=0, le=5)
    end: float = Field(ge=0, le=5)


class SequentialRefineParams(BaseModel):
    """`[loop]` keys of sequential_refine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(4, ge=1, le=1000, description="attempts, one lane each")
    mode: Literal["markov", "autoregressive"] = Field(
        "autoregressive", description="show the last attempt, or all of them"
    )
    explore: Literal["none", "different_approach"] = Field(
        "none", description="ask each attempt to differ from the earlier ones"
    )
    temperature_schedule: list[float] | TemperatureRamp | None = Field(
        None, description="a temperature per attempt (the last one holds), or {start, end}"
    )
    show: Literal["text", "answer"] = Field(
        "text", description="an earlier attempt's whole text, or only its answer"
    )
    feedback: bool = Field(True, description="put the verifier's verdict in the next prompt")
    stop_on_pass: bool = Field(True, description="stop at the first attempt the verifier passes")
    reduce: str = Field("last", description='"last", or a registered reducer over the attempts')
    tie_break: TieBreak = "first_lane"
    weighting: Weighting = "none"

    @field_validator("reduce")
    @classmethod
    def _known_reducer(cls, value: str) -> str:
        return value if value == "last" else known_reducer(value, "loop.reduce")

    @field_validator("temperature_schedule")
    @classmethod
    def _temperatures(
        cls, value: list[float] | TemperatureRamp | None
    ) -> list[float] | TemperatureRamp | None:
        if isinstance(value, list):
            if not value:
                raise ValueError("give at least one temperature (or leave the key out)")
            bad = [t for t in value if not 0 <= t <= 5]
            if bad:
                raise ValueError(f"temperatures must be between 0 and 5, got {bad[0]}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SequentialRefineParams:
        schedule = self.temperature_schedule
        if isinstance(schedule, list) and len(schedule) > self.steps:
            raise ValueError(
                f"loop.temperature_schedule: {len(schedule)} temperatures for {self.steps} steps"
            )
        if self.weighting == "verifier" and self.reduce != "weighted_vote":
            raise ValueError(
                f'loop.weighting: "verifier" weighs a weighted_vote; reduce = "{self.reduce}" would ignore it'
            )
        return self

    def temperature(self, step: int, default: float) -> float:
        """The temperature of attempt `step` (0-based); `default` without a schedule."""
        schedule = self.temperature_schedule
        if schedule is None:
            return default
        if isinstance(schedule, list):
            return schedule[min(step, len(schedule) - 1)]
        if self.steps == 1:
            return schedule.start
        return round(schedule.start + (schedule.end - schedule.start) * step / (self.steps - 1), 6)


@register_loop
class SequentialRefine:
    """One chain of `steps` attempts, each shown the earlier ones (and their feedback)."""

    name: ClassVar[str] = "sequential_refine"
    Params: ClassVar[type[BaseModel]] = SequentialRefineParams

    def __init__(self, params: SequentialRefineParams | None = None) -> None:
        self.params = params or SequentialRefineParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        reducer = None if p.reduce == "last" else resolve_reducer(p.reduce, key="loop.reduce")
        if ctx.verifier is None and (
            p.weighting == "verifier" or (reducer is not None and reducer_traits(reducer).needs_verifier)
        ):
            raise ConfigError(
                f'judge.verifier: reduce = "{p.reduce}" needs a verifier '
                f"(judge.verifier or judge.verifier_command)"
            )
        base = ctx.prompt(question)
        attempts: list[Lane] = []
        verdicts: dict[int, Verdict] = {}
        stopped = "steps"
        feedback = p.feedback and ctx.verifier is not None
        for step in range(p.steps):
            prompt = refine_prompt(base, self._shown(attempts), verdicts, p, feedback=feedback)
            if not self._may_start(ctx, prompt, attempts):
                stopped = "budget"
                break
            lane = await self._attempt(ctx, prompt, step, verdicts)
            if lane is None:  # the budget shrank the wave to nothing
                stopped = "budget"
                break
            attempts.append(lane)
            verdict = verdicts.get(lane.lane)
            if verdict is not None and verdict.passed and p.stop_on_pass:
                stopped = "passed"
                break
        ctx.record("stopped", {"reason": stopped, "attempts": len(attempts)})
        answers = [lane.answer if lane.completed else None for lane in attempts]
        detail = {
            "attempts": len(attempts),
            "reduce": p.reduce,
            "mode": p.mode,
            "stopped": stopped,
            "answers": answers,
            **({"budget_stop": True} if stopped == "budget" else {}),  # said only where it did
        }
        if reducer is None:
            return _last(attempts, detail)
        over = _OverAttempts(
            reducer(ReduceOptions(tie_break=p.tie_break, weighting=p.weighting, seed=ctx.seed))
        )
        reduction = await ctx.reduce(attempts, cast(Reducer, over))
        return replace(outcome_of(reduction, attempts), detail=detail)

    @staticmethod
    def cost_shape(params: SequentialRefineParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        """`steps` lanes, one a step; each prompt after the first quotes the earlier
        attempts (markov: the last one; autoregressive: all), every attempt a candidate."""
        quoted = max_tokens + FRAME_TOKENS  # one earlier answer, quoted in a later prompt
        shown = [i if params.mode == "autoregressive" else min(i, 1) for i in range(params.steps)]
        waves = [WaveShape(1, prompt_tokens + (TEMPLATE_TOKENS + n * quoted if n else 0)) for n in shown]
        return CostShape.of(waves, candidates=params.steps)

    @staticmethod
    def fit(params: SequentialRefineParams, budget: Allowance) -> SequentialRefineParams:
        """Under a lane budget, steps at most the budget; under tokens or cost, the steps
        whose expected spend fills the budget (as configured where its price is not known: the
        chain stops when the budget cannot fund the next attempt)."""
        if budget.unit == "lanes":
            return params.model_copy(update={"steps": min(params.steps, int(budget.amount))})
        found = largest_within(budget, 1, lambda n: params.model_copy(update={"steps": n}), most=1000)
        return params if found is None else params.model_copy(update={"steps": found})

    @staticmethod
    def reducer(params: SequentialRefineParams) -> ReducerChoice:
        """`reduce = "last"` answers without a reducer (its choice is "")."""
        name = "" if params.reduce == "last" else params.reduce
        return ReducerChoice(
            name,
            ReduceOptions(tie_break=params.tie_break, weighting=params.weighting),
            judge_keys=VERIFIER_KEYS,
        )  # its feedback and stop_on_pass

    @staticmethod
    def candidates(params: SequentialRefineParams, state: RunState) -> list[Lane]:
        """Its reduce (where one is configured) read every attempt."""
        return attempts(state)

    @staticmethod
    def audit(
        params: SequentialRefineParams, state: RunState, *, extract: ExtractSpec, seed: int
    ) -> AuditFinding | None:
        """Its attempts, its stop and its answer, checked against its lanes and verdicts."""
        return audit_refine(params, state, extract=extract)

    def _may_start(self, ctx: LoopContext, prompt: str, attempts: Sequence[Lane]) -> bool:
        """Whether the next attempt runs: as the log says where it already decided (a wave it
        started, a stop it recorded), else whether the budget can fund one more lane."""
        if any(
            e.type == f"loop.{self.name}.stopped" and e.data.get("attempts") == len(attempts)
            for e in ctx.state.loop_events
        ):
            return False  # the run stopped here before a crash: it stops here again
        nxt = attempts[-1].wave + 1 if attempts else None
        if (nxt is None and ctx.state.waves) or (nxt is not None and nxt in ctx.state.waves):
            return True
        return ctx.budget.can_afford(1, ctx.sampling.max_tokens, prompt=prompt)

    async def _attempt(
        self, ctx: LoopContext, prompt: str, step: int, verdicts: dict[int, Verdict]
    ) -> Lane | None:
        """Attempt `step`: its wave of one lane (lane number `step`), its verdict, its record."""
        p = self.params
        params = replace(ctx.sampling, temperature=p.temperature(step, ctx.sampling.temperature))
        params = with_logprobs(params, p.reduce, p.weighting)
        lanes = await ctx.wave([LaneJob(step, prompt)], params=params, purpose="refine", quorum=0)
        if not lanes:
            return None
        (lane,) = lanes
        verdict = None
        if ctx.verifier is not None and lane.completed:
            verdict = (await ctx.verify([lane])).get(lane.lane)
            if verdict is not None:
                verdicts[lane.lane] = verdict
        ctx.record(
            "attempted",
            {
                "step": step,
                "status": lane.status,
                "answer": lane.answer,
                "temperature": params.temperature,
                "passed": verdict.passed if verdict else None,
                "score": verdict.score if verdict else None,
            },
            wave=lane.wave,
            lane=lane.lane,
        )
        return lane

    def _shown(self, attempts: Sequence[Lane]) -> list[Lane]:
        """The earlier attempts the next prompt shows: every completed one, or the last."""
        done = [lane for lane in attempts if lane.completed]
        return done[-1:] if self.params.mode == "markov" else done


def refine_prompt(
    base: str,
    shown: Sequence[Lane],
    verdicts: Mapping[int, Verdict],
    params: SequentialRefineParams,
    *,
    feedback: bool,
) -> str:
    """The prompt of the next attempt: `base` (the question on its first line), then each
    shown attempt (its text quoted, its answer on a line `Answer: X`, its verifier feedback),
    then the exploration instruction and a closing instruction. No earlier attempt: `base`."""
    if not shown:
        return base
    lines = [
        base.rstrip("\n"),
        "Your last attempt at this question:"
        if params.mode == "markov" and len(shown) == 1
        else "Your earlier attempts at this question, oldest first:",
    ]
    for lane in shown:
        lines.append(f"Attempt {lane.lane + 1}:")
        if params.show == "text":
            lines.extend("> " + line for line in (lane.text or "").strip("\n").splitlines())
        lines.append(f"Answer: {lane.answer}" if lane.answer else "(no answer found)")
        verdict = verdicts.get(lane.lane)
        if feedback and verdict is not None:
            lines.append(feedback_line(verdict))
    if params.explore == "different_approach":
        lines.append(EXPLORE)
    lines.append(CLOSING)
    return "\n".join(lines) + "\n"


def feedback_line(verdict: Verdict) -> str:
    """`Feedback: passed (score 1)`, `Feedback: failed (score 0): <detail>`, or, when the
    verifier gave none, `Feedback: no verdict: <why>`; one line, the detail's own lines
    indented."""
    if verdict.error or (verdict.score is None and verdict.passed is None):
        head = "no verdict"
    else:
        head = {True: "passed", False: "failed", None: "scored"}[verdict.passed]
        if verdict.score is not None:
            head += f" (score {verdict.score:g})"
    detail = verdict.detail.strip()
    if verdict.error and not detail:
        detail = verdict.error
    if detail:
        head += ": " + "\n  ".join(detail.splitlines())
    return f"Feedback: {head}"


def _last(attempts: Sequence[Lane], detail: dict[str, Any]) -> Outcome:
    """`reduce = "last"`: the latest attempt that gave an answer (a failed one gives none)."""
    last = last_answered(attempts)
    if last is None:
        return Outcome(
            status="no_answer",
            detail=detail,
            reason=f"none of {len(attempts)} attempts gave an answer"
            if attempts
            else "the budget could not fund one attempt",
        )
    return Outcome(
        answer=last.answer, winner_lane=last.lane, winner_wave=last.wave, winner_text=last.text, detail=detail
    )


class _OverAttempts:
    """A reducer over the attempts: each attempt is its own wave, while `ctx.verify` takes
    the lanes of one wave, so verdicts are asked wave by wave (attempt i is lane i, so they
    stay apart when merged) and the recorded ones are reused."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.needs_judge: bool = getattr(inner, "needs_judge", False)

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        reduction: Reduction = await self.inner.reduce(cast(LoopContext, _PerWave(ctx)), lanes)
        return reduction


class _PerWave:
    """`ctx` with a `verify` that takes lanes of several waves."""

    def __init__(self, ctx: LoopContext) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    async def verify(self, lanes: Sequence[Lane]) -> dict[int, Verdict]:
        verdicts: dict[int, Verdict] = {}
        for wave in sorted({lane.wave for lane in lanes}):
            verdicts.update(await self._ctx.verify([lane for lane in lanes if lane.wave == wave]))
        return dict(sorted(verdicts.items()))
