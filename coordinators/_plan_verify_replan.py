"""plan_verify_replan: PLAN a DAG of sub-questions -> ANSWER in waves -> VERIFY -> REPLAN, then
SYNTHESIZE (after VMAO, Zhang et al. 2026).

A planner call (purpose "plan") turns the question into a small DAG of sub-questions; a bad plan
is asked for again, then fails the run (or, with `on_bad_plan = "direct"`, the question itself
becomes the one sub-question). Ready sub-questions run as waves of at most `batch_size` lanes,
one lane each, their prompts carrying their dependencies' answers; one verifier wave (purpose
"verify", billed as verifier) scores each new result; the stop rules are checked; a replanner
call (purpose "replan") retries or adds sub-questions, never touching accepted (complete)
results; a synthesis call (purpose "synthesize") gives the answer. Every decision that reads the
budget is recorded before it acts, so a resumed run takes the same path as the one it continues.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lanefold.coordinators._plan import (
    OPTIONAL_RULES,
    Attempt,
    Node,
    Plan,
    PlanError,
    Progress,
    StopRules,
    SubQuestion,
    fill,
    parse_plan,
    parse_replan,
    stop_rule,
)
from lanefold.coordinators._plan_record import audit_plan, fallback, progress, verdict_of
from lanefold.primitives import (
    Allowance,
    AuditFinding,
    BudgetExhaustedError,
    ConfigError,
    CostShape,
    ExtractSpec,
    Lane,
    LaneJob,
    LaneTokens,
    LoopContext,
    Outcome,
    ReducerChoice,
    RunError,
    RunState,
    register_loop,
)
from lanefold.primitives.events import Bill

__all__ = ("PlanRejectedError", "PlanVerifyReplan", "PlanVerifyReplanParams")

PLAN_TEMPLATE = (
    "Question: {question}\n"
    "Break this question into at most {max_nodes} smaller sub-questions that together answer "
    "it; a sub-question may use the answers of earlier ones. Reply with JSON only, shaped "
    "like:\n"
    '{"subquestions": [{"id": "q1", "question": "...", "depends_on": []}, '
    '{"id": "q2", "question": "...", "depends_on": ["q1"]}]}\n'
)
SUBQUESTION_TEMPLATE = (
    "Question: {subquestion}\n"
    "It is one step towards answering: {question}\n"
    "Known so far:\n{context}\n"
    "{feedback}Think briefly, then end with 'Answer: <answer>'.\n"
)
VERIFY_TEMPLATE = (
    "Question: {subquestion}\n"
    "Proposed result:\n{result}\n\n"
    "Does the result answer the question fully and correctly? Reply with JSON only, shaped "
    "like:\n"
    '{"status": "complete", "score": 0.9, "missing": []}\n'
    'status is "complete", "partial" or "failed"; score is from 0 to 1; missing lists what '
    "the result lacks.\n"
)
REPLAN_TEMPLATE = (
    "Question: {question}\n"
    "Sub-questions so far, with what a verifier found:\n{status}\n\n"
    "Retry the sub-questions that are not complete, or add at most {room} new ones to fill "
    "the gaps. Reply with JSON only, shaped like:\n"
    '{"retry": ["q2"], "add": [{"id": "q4", "question": "...", "depends_on": ["q1"]}]}\n'
)
SYNTHESIS_TEMPLATE = (
    "Question: {question}\n"
    "Answers to its sub-questions:\n{results}\n\n"
    "Combine them into one final answer. Think briefly, then end with 'Answer: <answer>'.\n"
)
RETRY_NOTE = (
    "\nYour previous reply was refused ({error}). Reply again with the JSON only, in the shape above.\n"
)
FEEDBACK = "An earlier answer was judged {status}; it missed: {missing}.\n"

_SLOTS: dict[str, tuple[str, ...]] = {
    "plan_template": ("question",),
    "subquestion_template": ("subquestion",),
    "verify_template": ("subquestion", "result"),
    "replan_template": ("status",),
    "synthesis_template": ("question", "results"),
}
_RESULT_CHARS = 2000  # of a result shown to the verifier; a prompt must stay bounded


class PlanRejectedError(RunError):
    """The planner gave no plan the loop accepts, after `loop.plan_attempts` calls."""


class PlanVerifyReplanParams(BaseModel):
    """`[loop]` keys of plan_verify_replan (the stop rules' defaults are VMAO's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_nodes: int = Field(8, ge=1, le=64, description="sub-questions a plan may hold, in all")
    batch_size: int = Field(3, ge=1, le=64, description="ready sub-questions per wave")
    plan_attempts: int = Field(2, ge=1, le=10, description="planner calls before giving up")
    on_bad_plan: Literal["fail", "direct"] = Field(
        "fail", description="no valid plan: fail, or answer the question as one sub-question"
    )
    max_iterations: int = Field(3, ge=1, le=20, description="answer-verify-replan rounds")
    stop_rules: list[Literal["ready", "high_confidence", "diminishing_returns"]] = Field(
        default_factory=lambda: list(OPTIONAL_RULES), description="the quality rules in force"
    )
    ready_threshold: float = Field(0.8, gt=0, le=1, description="share complete: ready")
    confidence_threshold: float = Field(0.75, gt=0, le=1, description="mean score: confident")
    confidence_min_complete: float = Field(0.5, ge=0, le=1, description="share complete the confidence needs")
    min_gain: float = Field(0.05, ge=0, le=1, description="mean score gain below which to stop")
    token_budget: int | None = Field(None, ge=1, description="tokens spent that end the loop")
    verifier_backend: Literal["main", "judge"] = "main"
    json_max_tokens: LaneTokens = Field(384, ge=1, description="of a plan, verdict or replan call")
    json_temperature: float = Field(0.0, ge=0, le=5)
    json_stop: list[str] = Field(default_factory=list, description="stop sequences of those calls")
    plan_template: str = PLAN_TEMPLATE
    subquestion_template: str = SUBQUESTION_TEMPLATE
    verify_template: str = VERIFY_TEMPLATE
    replan_template: str = REPLAN_TEMPLATE
    synthesis_template: str = SYNTHESIS_TEMPLATE

    @model_validator(mode="after")
    def _check(self) -> PlanVerifyReplanParams:
        for key, slots in _SLOTS.items():
            missing = [f"{{{slot}}}" for slot in slots if f"{{{slot}}}" not in getattr(self, key)]
            if missing:
                raise ValueError(f"loop.{key}: must contain {' and '.join(missing)}")
        if len(set(self.stop_rules)) != len(self.stop_rules):
            raise ValueError("loop.stop_rules: a rule is named twice")
        return self

    def rules(self) -> StopRules:
        return StopRules(
            tuple(self.stop_rules),
            self.ready_threshold,
            self.confidence_threshold,
            self.confidence_min_complete,
            self.min_gain,
            self.token_budget,
            self.max_iterations,
        )


@register_loop
class PlanVerifyReplan:
    """Plan sub-questions, answer them in waves, verify, replan, synthesize (after VMAO)."""

    name: ClassVar[str] = "plan_verify_replan"
    Params: ClassVar[type[BaseModel]] = PlanVerifyReplanParams

    def __init__(self, params: PlanVerifyReplanParams | None = None) -> None:
        self.params = params or PlanVerifyReplanParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        return await _Run(self.params, ctx, question).run()

    @staticmethod
    def cost_shape(
        params: PlanVerifyReplanParams, *, prompt_tokens: int, max_tokens: int
    ) -> CostShape | None:
        """Not known before it runs: its plan decides how many sub-questions it answers."""
        return None

    @staticmethod
    def fit(params: PlanVerifyReplanParams, budget: Allowance) -> PlanVerifyReplanParams:
        """Under tokens or cost, as configured (the per-question limit binds as it runs; its
        own `token_budget` is left as given); a lane budget is refused, as its plan, not a
        key, decides its lanes."""
        if budget.unit == "lanes":
            raise ConfigError(
                "loop.coordinator: --equal-budget lanes cannot cap the lanes of "
                "'plan_verify_replan' (its plan decides them); equalise tokens "
                "or cost"
            )
        return params

    @staticmethod
    def reducer(params: PlanVerifyReplanParams) -> ReducerChoice:
        """It answers from its synthesis or a sub-question, never by a reducer."""
        return ReducerChoice("")

    @staticmethod
    def audit(
        params: PlanVerifyReplanParams, state: RunState, *, extract: ExtractSpec, seed: int
    ) -> AuditFinding | None:
        """Its records and answer, replayed from its lanes (`_plan_record.py`)."""
        return audit_plan(params, state, extract=extract)


class _Run:
    """One run of the loop: the plan's nodes and what has been decided about them."""

    def __init__(self, params: PlanVerifyReplanParams, ctx: LoopContext, question: str) -> None:
        self.p, self.ctx, self.question = params, ctx, question
        self.nodes: dict[str, Node] = {}
        # JSON replies span lines: the answer lanes' stop sequences are not theirs.
        self.json = replace(
            ctx.sampling,
            temperature=params.json_temperature,
            max_tokens=params.json_max_tokens,
            stop=tuple(params.json_stop),
            logprobs=False,
        )
        self.out_of_budget = False  # a wave was cut short, or not funded, by the budget
        self.budget_stop = False  # the loop stopped because the budget could not fund more

    async def run(self) -> Outcome:
        plan, how = await self._plan()
        self.nodes = {spec.id: Node(spec) for spec in plan.subquestions}
        before: Progress | None = None
        iteration = 0
        rule: str | None = None
        while rule is None:
            iteration += 1
            await self._answer(iteration)
            await self._verify(iteration)
            now = self._progress(iteration)
            rule = stop_rule(now, before, self.p.rules())
            limit = "loop.token_budget" if rule == "token_budget" else None
            if rule is None and (
                self.out_of_budget or not self._funds([self._replan_prompt()], self.p.json_max_tokens)
            ):
                rule, limit = "token_budget", "budget"
            decided = self.ctx.record(
                "iteration",
                {
                    "iteration": iteration,
                    "nodes": now.nodes,
                    "complete": now.complete,
                    "completeness": now.completeness,
                    "confidence": now.confidence,
                    "tokens": now.tokens,
                    "stop": rule,
                    "limit": limit,
                },
            )
            rule = decided["stop"]
            self.budget_stop = decided.get("limit") == "budget"
            if rule is None and not await self._replan(iteration):
                rule = "no_new_work"
            before = now
        return await self._synthesize(rule, iteration, how)

    # -- plan ---------------------------------------------------------------------------------

    async def _plan(self) -> tuple[Plan, str]:
        p, ctx = self.p, self.ctx
        base = fill(p.plan_template, {"question": self.question, "max_nodes": str(p.max_nodes)})
        if not ctx.state.waves and not self._funds([base], p.json_max_tokens):
            # Nothing has run (a resumed run with waves in its log had funded this before).
            raise BudgetExhaustedError("budget: cannot fund the planner's call and an answer")
        prompt, error, attempt = base, "", 0
        for attempt in range(1, p.plan_attempts + 1):
            lane = _one(
                await ctx.wave(
                    [prompt], params=self.json, purpose="plan", quorum=0, extract=False, share_prefix=False
                )
            )
            try:
                if lane is None or not lane.completed:
                    raise PlanError(f"the planner's call failed: {lane.error if lane else '-'}")
                plan = parse_plan(lane.text or "", max_nodes=p.max_nodes)
            except PlanError as exc:
                error = str(exc)
                prompt = base + fill(RETRY_NOTE, {"error": error})
                retry = attempt < p.plan_attempts and self._funds([prompt], p.json_max_tokens) > 0
                decided = ctx.record(
                    "plan_rejected",
                    {
                        "attempt": attempt,
                        "error": error,
                        "retry": retry,
                        "reply": ((lane.text if lane else None) or "")[:500],
                    },
                    wave=lane.wave if lane else None,
                )
                if not decided["retry"]:
                    break
                continue
            ctx.record(
                "plan_accepted",
                {"attempt": attempt, "fallback": None, "subquestions": _dump(plan.subquestions)},
                wave=lane.wave,
            )
            return plan, "planned"
        if p.on_bad_plan == "fail":
            raise PlanRejectedError(
                f"plan_verify_replan: the planner gave no valid plan in {attempt} call(s) "
                f"(loop.plan_attempts = {p.plan_attempts}); the last plan was refused: {error}"
            )
        direct = SubQuestion.model_construct(id="q1", question=self.question, depends_on=())
        plan = Plan.model_construct(subquestions=(direct,))
        ctx.record(
            "plan_accepted",
            {"attempt": attempt, "fallback": "direct", "subquestions": _dump(plan.subquestions)},
        )
        return plan, "direct"

    # -- answer and verify --------------------------------------------------------------------

    def _ready(self, node: Node) -> bool:
        deps = [self.nodes[dep] for dep in node.spec.depends_on]
        return node.pending and all(not d.pending and d.latest is not None for d in deps)

    async def _answer(self, iteration: int) -> None:
        """Waves of ready sub-questions until none is ready (or the budget says stop)."""
        ctx = self.ctx
        while not self.out_of_budget:
            batch = [n for n in self.nodes.values() if self._ready(n)][: self.p.batch_size]
            if not batch:
                return
            prompts = [self._ask(node) for node in batch]
            funded = self._funds(prompts, ctx.sampling.max_tokens)
            decided = ctx.record(
                "answering",
                {
                    "iteration": iteration,
                    "nodes": [n.spec.id for n in batch[:funded]],
                    "deferred": [n.spec.id for n in batch[funded:]],
                },
            )
            ids: list[str] = decided["nodes"]
            self.out_of_budget = len(ids) < len(batch)
            if not ids:
                return
            lanes = await ctx.wave(
                [LaneJob(i, prompts[i]) for i in range(len(ids))],
                purpose="sample",
                quorum=0,
                share_prefix=False,
            )
            landed = {lane.lane: lane for lane in lanes}
            for i, node_id in enumerate(ids):
                lane = landed.get(i)
                if lane is None:  # the budget shrank the wave: it waits, and the loop stops
                    self.out_of_budget = True
                    continue
                node = self.nodes[node_id]
                node.pending = False
                node.attempts.append(Attempt(iteration, lane))

    def _ask(self, node: Node) -> str:
        deps = [self.nodes[dep] for dep in node.spec.depends_on]
        context = "\n".join(f"- {d.spec.question} -> {d.latest.result}" for d in deps if d.latest is not None)
        feedback = ""
        judged = next((a for a in reversed(node.attempts) if a.verdict is not None), None)
        if judged is not None and judged.verdict is not None:
            feedback = fill(
                FEEDBACK,
                {
                    "status": judged.verdict.status,
                    "missing": ", ".join(judged.verdict.missing) or "nothing named",
                },
            )
        return fill(
            self.p.subquestion_template,
            {
                "subquestion": node.spec.question,
                "question": self.question,
                "context": context or "(nothing yet)",
                "feedback": feedback,
            },
        )

    async def _verify(self, iteration: int) -> None:
        """One verifier wave over the results this iteration produced."""
        ctx, p = self.ctx, self.p
        todo = [
            (node, node.attempts[-1])
            for node in self.nodes.values()
            if node.attempts and node.attempts[-1].iteration == iteration and node.attempts[-1].lane.completed
        ]
        if not todo:
            return
        prompts = [
            fill(
                p.verify_template,
                {
                    "subquestion": node.spec.question,
                    "question": self.question,
                    "result": (attempt.lane.text or "").strip()[:_RESULT_CHARS],
                },
            )
            for node, attempt in todo
        ]
        funded = self._funds(prompts, p.json_max_tokens, bill="verifier")
        decided = ctx.record(
            "verifying",
            {
                "iteration": iteration,
                "nodes": [n.spec.id for n, _ in todo[:funded]],
                "unverified": [n.spec.id for n, _ in todo[funded:]],
            },
        )
        ids: list[str] = decided["nodes"]
        self.out_of_budget = self.out_of_budget or len(ids) < len(todo)
        if not ids:
            return
        lanes = await ctx.wave(
            [LaneJob(i, prompts[i]) for i in range(len(ids))],
            params=self.json,
            purpose="verify",
            bill="verifier",
            quorum=0,
            share_prefix=False,
            extract=False,
            backend=p.verifier_backend,
        )
        landed = {lane.lane: lane for lane in lanes}
        verdicts: dict[str, Any] = {}
        for i, (node, attempt) in enumerate(todo[: len(ids)]):
            lane = landed.get(i)
            if lane is None:
                self.out_of_budget = True
                continue
            attempt.verdict, parsed = verdict_of(lane)
            verdict = attempt.verdict
            verdicts[node.spec.id] = {
                "status": verdict.status,
                "score": verdict.value,
                "missing": list(verdict.missing),
                "parsed": parsed,
            }
        ctx.record(
            "verified", {"iteration": iteration, "verdicts": verdicts}, wave=lanes[0].wave if lanes else None
        )

    def _progress(self, iteration: int) -> Progress:
        return progress(self.nodes, iteration, self.ctx.budget.spent.tokens)

    # -- replan -------------------------------------------------------------------------------

    def _replan_prompt(self) -> str:
        lines = []
        for node in self.nodes.values():
            verdict, best = node.verdict, node.best
            score = f", {verdict.value:.2f}" if verdict is not None else ""
            line = f"{node.spec.id} [{node.status}{score}] {node.spec.question}"
            if node.spec.depends_on:
                line += f" (uses {', '.join(node.spec.depends_on)})"
            if best is not None:
                line += f" -> {best.result}"
            if verdict is not None and verdict.missing:
                line += f"; missing: {', '.join(verdict.missing)}"
            lines.append(line)
        return fill(
            self.p.replan_template,
            {
                "question": self.question,
                "status": "\n".join(lines),
                "room": str(max(self.p.max_nodes - len(self.nodes), 0)),
            },
        )

    async def _replan(self, iteration: int) -> bool:
        """One replanner call (never replanned itself); whether it left work to do."""
        ctx = self.ctx
        lane = _one(
            await ctx.wave(
                [self._replan_prompt()],
                params=self.json,
                purpose="replan",
                quorum=0,
                extract=False,
                share_prefix=False,
            )
        )
        specs = [node.spec for node in self.nodes.values()]
        accepted = [node.spec.id for node in self.nodes.values() if node.accepted]
        wave = lane.wave if lane is not None else None
        try:
            if lane is None or not lane.completed:
                raise PlanError(f"the replanner's call failed: {lane.error if lane else '-'}")
            retry, add, kept = parse_replan(
                lane.text or "", nodes=specs, accepted=accepted, max_nodes=self.p.max_nodes
            )
            ctx.record(
                "replan_accepted",
                {"iteration": iteration, "retry": retry, "add": _dump(add), "kept": kept},
                wave=wave,
            )
        except PlanError as exc:
            # The fallback retries what is not accepted and has been tried.
            retry = [n.spec.id for n in self.nodes.values() if not n.accepted and not n.pending]
            add = []
            ctx.record(
                "replan_rejected",
                {
                    "iteration": iteration,
                    "error": str(exc),
                    "retry": retry,
                    "reply": ((lane.text if lane else None) or "")[:500],
                },
                wave=wave,
            )
        for node_id in retry:
            self.nodes[node_id].pending = True
        for spec in add:
            self.nodes[spec.id] = Node(spec)
        return bool(retry or add)

    # -- synthesize ---------------------------------------------------------------------------

    def _synthesis_prompt(self) -> str:
        lines = [
            f"- {node.spec.question} -> {best.result}"
            for node in self.nodes.values()
            if (best := node.best) is not None
        ]
        return fill(
            self.p.synthesis_template, {"question": self.question, "results": "\n".join(lines) or "(none)"}
        )

    async def _synthesize(self, rule: str, iteration: int, how: str) -> Outcome:
        ctx = self.ctx
        prompt = self._synthesis_prompt()
        funded = ctx.budget.can_afford(1, ctx.sampling.max_tokens, prompt=prompt, share_prefix=False)
        decided = ctx.record("stopped", {"rule": rule, "iteration": iteration, "synthesis": funded})
        lane: Lane | None = None
        if decided["synthesis"]:
            lane = _one(await ctx.wave([prompt], purpose="synthesize", quorum=0, share_prefix=False))
        detail: dict[str, Any] = {
            "stop": rule,
            "iterations": iteration,
            "plan": how,
            "nodes": [node.summary() for node in self.nodes.values()],
            **(
                {"budget_stop": True} if self.budget_stop or not decided["synthesis"] else {}
            ),  # said only where it did
        }
        if lane is not None and lane.completed and lane.answer is not None:
            return Outcome(
                answer=lane.answer,
                winner_lane=lane.lane,
                winner_text=lane.text,
                winner_wave=lane.wave,
                detail={**detail, "answered_by": "synthesis", "winner_wave": lane.wave},
            )
        best = fallback(self.nodes)
        if best is None:
            why = (
                "the synthesis gave no answer and no sub-question has one"
                if decided["synthesis"]
                else "the budget cannot fund the synthesis and no sub-question has an answer"
            )
            return Outcome(
                status="no_answer", reason=why, detail={**detail, "answered_by": None, "winner_wave": None}
            )
        return Outcome(
            answer=best.answer,
            winner_lane=best.lane,
            winner_text=best.text,
            winner_wave=best.wave,
            detail={**detail, "answered_by": "fallback", "winner_wave": best.wave},
        )

    # -- budget -------------------------------------------------------------------------------

    def _funds(self, prompts: list[str], max_tokens: int, *, bill: Bill = "sample") -> int:
        """How many of `prompts` (a prefix) the budget funds while still funding a synthesis
        call after them (estimated as one more lane like the longest)."""
        reserve = self._synthesis_prompt()
        tokens = max(max_tokens, self.ctx.sampling.max_tokens)
        for m in range(len(prompts), 0, -1):
            longest = max([*prompts[:m], reserve], key=len)
            if self.ctx.budget.can_afford(m + 1, tokens, prompt=longest, bill=bill, share_prefix=False):
                return m
        return 0


def _one(lanes: list[Lane]) -> Lane | None:
    return lanes[0] if lanes else None


def _dump(specs: Any) -> list[dict[str, Any]]:
    return [spec.model_dump(mode="json") for spec in specs]
