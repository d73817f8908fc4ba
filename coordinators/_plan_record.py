"""plan_verify_replan's record: the rules it decides by, and their replay over a log.

The loop (`_plan_verify_replan.py`) records each step before it acts: the plan it accepted
(`plan_rejected`, `plan_accepted`), the sub-questions each wave answers (`answering`), those
the verifier wave judges (`verifying`) and its verdicts (`verified`), the figures and stop rule
of each iteration (`iteration`), each replan (`replan_accepted`, `replan_rejected`) and the
end (`stopped`). Every wave it runs, planner's, verifier's and replanner's included, is in the
log, so `audit_plan` replays the run from its records and lanes with the rules the loop itself
uses (`parse_plan`, `verdict_of`, `stop_rule`, `parse_replan`, `fallback`) and refuses the
first record that does not follow. Taken as recorded: what reads the budget (whether the
planner is retried, how many sub-questions a wave funds, whether the synthesis is funded, a
stop for the budget) and the tokens an iteration reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lanefold.coordinators._audit import answers, candidate_lanes, chosen, claims, earliest, outcome, waves_of
from lanefold.coordinators._plan import (
    Attempt,
    Node,
    PlanError,
    Progress,
    SubQuestion,
    Verdict,
    parse_plan,
    parse_replan,
    parse_verdict,
    stop_rule,
)
from lanefold.primitives import AuditFinding, ExtractSpec, Lane, RunState
from lanefold.primitives.events import LoopEvent

if TYPE_CHECKING:
    from lanefold.coordinators._plan_verify_replan import PlanVerifyReplanParams

__all__ = ("audit_plan", "fallback", "progress", "verdict_of")

NAME = "plan_verify_replan"
PURPOSES = ("plan", "sample", "verify", "replan", "synthesize")


def verdict_of(lane: Lane) -> tuple[Verdict, bool]:
    """The verifier's verdict in its lane's reply, and whether the reply held one (a reply
    without one is no evidence for the result: failed)."""
    try:
        if not lane.completed:
            raise PlanError(f"the verifier's call failed: {lane.error}")
        return parse_verdict(lane.text or ""), True
    except PlanError as exc:
        return Verdict(status="failed", score=0.0, missing=(f"no verdict: {exc}",)), False


def progress(nodes: Mapping[str, Node], iteration: int, tokens: int) -> Progress:
    """Where an iteration leaves the plan: its size, the sub-questions complete, the mean score."""
    scores = [n.verdict.value if n.verdict is not None else 0.0 for n in nodes.values()]
    return Progress(
        iteration, len(nodes), sum(n.accepted for n in nodes.values()), sum(scores) / len(nodes), tokens
    )


def fallback(nodes: Mapping[str, Node]) -> Lane | None:
    """Without a synthesis: the best answer of a sub-question no other one builds on."""
    used = {dep for node in nodes.values() for dep in node.spec.depends_on}
    ranked = [
        (
            (node.spec.id not in used, node.accepted, node.verdict.value if node.verdict else 0.0, -order),
            best.lane,
        )
        for order, node in enumerate(nodes.values())
        if (best := node.best) is not None and best.lane.answer is not None
    ]
    return max(ranked, key=lambda pair: pair[0])[1] if ranked else None


def _dump(specs: Any) -> list[dict[str, Any]]:
    return [spec.model_dump(mode="json") for spec in specs]


def _reply(lane: Lane | None) -> str:
    return ((lane.text if lane else None) or "")[:500]


class _Replay:
    """The loop's state rebuilt record by record: its nodes, iteration and stop rule."""

    def __init__(self, params: PlanVerifyReplanParams, state: RunState) -> None:
        self.p, self.state = params, state
        self.question = state.started.question if state.started else ""
        self.waves = {purpose: iter(waves_of(state, purpose)) for purpose in PURPOSES}
        self.nodes: dict[str, Node] = {}
        self.iteration, self.plans = 1, 0
        self.how: str | None = None
        self.rule: str | None = None
        self.before: Progress | None = None
        self.todo: list[tuple[Node, Attempt]] = []
        self.verify_lanes: dict[int, Lane] = {}
        self.winner: Lane | None = None
        self.budget_stop = False  # the last iteration stopped for the budget, or no synthesis was funded

    def lanes(self, purpose: str) -> dict[int, Lane]:
        number = next(self.waves[purpose], None)
        return {lane.lane: lane for lane in candidate_lanes(self.state, [] if number is None else [number])}

    def expected(self, noun: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """What the record `noun` must hold, given what the loop holds so far (and the
        decisions taken as recorded); the loop's state moves on as it did."""
        step = getattr(self, f"_{noun}", None)
        if step is None:
            raise PlanError(f"loop.{NAME}.{noun} is no record the loop writes")
        found: dict[str, Any] = step(data)
        return found

    def _plan_rejected(self, data: Mapping[str, Any]) -> dict[str, Any]:
        self.plans += 1
        lane = self.lanes("plan").get(0)
        try:
            if lane is None or not lane.completed:
                raise PlanError(f"the planner's call failed: {lane.error if lane else '-'}")
            parse_plan(lane.text or "", max_nodes=self.p.max_nodes)
            error = None  # a plan the loop accepts was rejected
        except PlanError as exc:
            error = str(exc)
        retry = data.get("retry") if self.plans < self.p.plan_attempts else False
        return {"attempt": self.plans, "error": error, "retry": retry, "reply": _reply(lane)}

    def _plan_accepted(self, data: Mapping[str, Any]) -> dict[str, Any]:
        if data.get("fallback") == "direct" and self.p.on_bad_plan == "direct":
            specs: tuple[SubQuestion, ...] = (
                SubQuestion.model_construct(id="q1", question=self.question, depends_on=()),
            )
            self.how = "direct"
        else:
            self.plans += 1
            lane = self.lanes("plan").get(0)
            specs = parse_plan(lane.text or "" if lane else "", max_nodes=self.p.max_nodes).subquestions
            self.how = "planned"
        self.nodes = {spec.id: Node(spec) for spec in specs}
        fallback_ = "direct" if self.how == "direct" else None
        return {"attempt": self.plans, "fallback": fallback_, "subquestions": _dump(specs)}

    def _ready(self, node: Node) -> bool:
        deps = [self.nodes[dep] for dep in node.spec.depends_on]
        return node.pending and all(not d.pending and d.latest is not None for d in deps)

    def _answering(self, data: Mapping[str, Any]) -> dict[str, Any]:
        batch = [n.spec.id for n in self.nodes.values() if self._ready(n)][: self.p.batch_size]
        funded = len(data.get("nodes") or [])
        if funded:
            landed = self.lanes("sample")
            for i, node_id in enumerate(batch[:funded]):
                if i in landed:
                    self.nodes[node_id].pending = False
                    self.nodes[node_id].attempts.append(Attempt(self.iteration, landed[i]))
        return {"iteration": self.iteration, "nodes": batch[:funded], "deferred": batch[funded:]}

    def _verifying(self, data: Mapping[str, Any]) -> dict[str, Any]:
        self.todo = [
            (node, node.attempts[-1])
            for node in self.nodes.values()
            if node.attempts
            and node.attempts[-1].iteration == self.iteration
            and node.attempts[-1].lane.completed
        ]
        funded = len(data.get("nodes") or [])
        self.verify_lanes = self.lanes("verify") if funded else {}
        ids = [node.spec.id for node, _ in self.todo]
        self.todo = self.todo[:funded]
        return {"iteration": self.iteration, "nodes": ids[:funded], "unverified": ids[funded:]}

    def _verified(self, data: Mapping[str, Any]) -> dict[str, Any]:
        verdicts: dict[str, Any] = {}
        for i, (node, attempt) in enumerate(self.todo):
            if i in self.verify_lanes:
                attempt.verdict, parsed = verdict_of(self.verify_lanes[i])
                verdict = attempt.verdict
                verdicts[node.spec.id] = {
                    "status": verdict.status,
                    "score": verdict.value,
                    "missing": list(verdict.missing),
                    "parsed": parsed,
                }
        return {"iteration": self.iteration, "verdicts": verdicts}

    def _iteration(self, data: Mapping[str, Any]) -> dict[str, Any]:
        tokens = data.get("tokens")
        now = progress(self.nodes, self.iteration, tokens if isinstance(tokens, int) else 0)
        rule = stop_rule(now, self.before, self.p.rules())
        limit = "loop.token_budget" if rule == "token_budget" else None
        if rule is None and (data.get("stop"), data.get("limit")) == ("token_budget", "budget"):
            rule, limit = "token_budget", "budget"
        self.rule, self.before, self.budget_stop = rule, now, limit == "budget"
        return {
            "iteration": self.iteration,
            "nodes": now.nodes,
            "complete": now.complete,
            "completeness": now.completeness,
            "confidence": now.confidence,
            "stop": rule,
            "limit": limit,
        }

    def _replan(self, accepted: bool) -> dict[str, Any]:
        lane = self.lanes("replan").get(0)
        specs = [node.spec for node in self.nodes.values()]
        done = [node.spec.id for node in self.nodes.values() if node.accepted]
        expected: dict[str, Any] = {"iteration": self.iteration}
        try:
            if lane is None or not lane.completed:
                raise PlanError(f"the replanner's call failed: {lane.error if lane else '-'}")
            retry, add, kept = parse_replan(
                lane.text or "", nodes=specs, accepted=done, max_nodes=self.p.max_nodes
            )
            expected |= {"retry": retry, "add": _dump(add), "kept": kept}
            expected |= {} if accepted else {"error": None}  # a replan it accepts was rejected
        except PlanError as exc:
            retry, add = [n.spec.id for n in self.nodes.values() if not n.accepted and not n.pending], []
            expected |= {"error": str(exc), "retry": retry, "reply": _reply(lane)}
            expected |= {"add": None} if accepted else {}  # a replan it refuses was accepted
        for node_id in retry:
            self.nodes[node_id].pending = True
        self.nodes |= {spec.id: Node(spec) for spec in add}
        if retry or add:
            self.iteration += 1
        else:
            self.rule = "no_new_work"
        return expected

    def _replan_accepted(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return self._replan(accepted=True)

    def _replan_rejected(self, data: Mapping[str, Any]) -> dict[str, Any]:
        return self._replan(accepted=False)

    def _stopped(self, data: Mapping[str, Any]) -> dict[str, Any]:
        lane = self.lanes("synthesize").get(0) if data.get("synthesis") else None
        self.budget_stop = self.budget_stop or not data.get("synthesis")
        self.winner = lane if lane is not None and lane.completed and lane.answer is not None else None
        return {"rule": self.rule, "iteration": self.iteration, "synthesis": data.get("synthesis")}


def audit_plan(
    params: PlanVerifyReplanParams, state: RunState, *, extract: ExtractSpec
) -> AuditFinding | None:
    """The first record, or claim of the result, that the replay of the run does not give."""
    replay = _Replay(params, state)
    found = answers(state, [*waves_of(state, "sample"), *waves_of(state, "synthesize")], extract)
    mine = [e for e in state.loop_events if e.type.startswith(f"loop.{NAME}.")]
    for record in mine:
        wrong = _checked(replay, record)
        if wrong is not None:
            return earliest(found, wrong)
    if state.result is None or not any(e.type.endswith(".stopped") for e in mine):
        return found
    line = state.result_sequence or 0
    extra = [(purpose, n) for purpose, left in replay.waves.items() for n in left]
    if extra:
        return earliest(
            found, (line, f"wave {extra[0][1]} ({extra[0][0]}) is no wave the loop's records account for")
        )
    by = "synthesis" if replay.winner is not None else None
    winner = replay.winner or fallback(replay.nodes)
    by = by or ("fallback" if winner is not None else None)
    rule = (
        "the synthesis answered: its lane is"
        if by == "synthesis"
        else "without a synthesis, the best sub-question is"
    )
    detail = {
        "stop": replay.rule,
        "iterations": replay.iteration,
        "plan": replay.how,
        "nodes": [node.summary() for node in replay.nodes.values()],
        "answered_by": by,
        "winner_wave": winner.wave if winner is not None else None,
    }
    told = outcome(state, detail, budget_stop=replay.budget_stop)
    return earliest(found, chosen(state, winner, rule), told)


def _checked(replay: _Replay, record: LoopEvent) -> AuditFinding | None:
    noun = record.type.rsplit(".", 1)[1]
    try:
        expected = replay.expected(noun, record.data)
    except PlanError as exc:
        return record.sequence, f"{record.type}: {exc}"
    except Exception as exc:  # a record the replay cannot follow (a sub-question the plan lacks)
        return record.sequence, f"{record.type} does not follow from the plan ({type(exc).__name__}: {exc})"
    return claims(record.sequence, record.type, record.data, expected, "the replies give")
