"""The pure parts of plan_verify_replan: the JSON it reads, the DAG checks, the stop rules.

A model's reply is read by pydantic models, not `.get()` chains: the first JSON object in the
reply that validates is taken (models wrap JSON in prose or code fences), and anything else is
a `PlanError` saying why, which the loop records and acts on (retry the planner, fall back).
The stop rules are VMAO's (Zhang et al. 2026), as one pure function of two iterations' figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lanefold.primitives import Lane

__all__ = (
    "OPTIONAL_RULES",
    "Attempt",
    "Node",
    "Plan",
    "PlanError",
    "Progress",
    "Replan",
    "StopRules",
    "SubQuestion",
    "Verdict",
    "check_dag",
    "fill",
    "parse_plan",
    "parse_replan",
    "parse_verdict",
    "read_json",
    "stop_rule",
)

StopRule = Literal["ready", "high_confidence", "diminishing_returns", "token_budget", "max_iterations"]
OptionalRule = Literal["ready", "high_confidence", "diminishing_returns"]
OPTIONAL_RULES: tuple[OptionalRule, ...] = ("ready", "high_confidence", "diminishing_returns")
_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")
M = TypeVar("M", bound=BaseModel)


class PlanError(ValueError):
    """A reply the loop refuses (a bad plan, verdict or replan); the message says why."""


def _as_id(value: Any) -> Any:
    """Models number sub-questions 1, 2, 3 as often as "q1": both name a node."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class SubQuestion(BaseModel):
    """One node of the plan: an id, its question, the ids whose answers it needs."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    question: str = Field(min_length=1, max_length=2000)
    depends_on: tuple[str, ...] = ()

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> Any:
        value = _as_id(value)
        if isinstance(value, str) and not _ID.fullmatch(value):
            raise ValueError("an id is 1-32 letters, digits, '_', '.' or '-'")
        return value

    @field_validator("question", mode="before")
    @classmethod
    def _strip(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("depends_on", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        if isinstance(value, str | int):
            value = [value]
        return [_as_id(v) for v in value] if isinstance(value, list) else value


class Plan(BaseModel):
    """The planner's reply: `{"subquestions": [{"id", "question", "depends_on"}, ...]}`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    subquestions: tuple[SubQuestion, ...] = Field(min_length=1)


class Verdict(BaseModel):
    """The verifier's reply: `{"status", "score", "missing"}`; a missing score follows the
    status (complete 1, partial 0.5, failed 0)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["complete", "partial", "failed"]
    score: float | None = Field(None, ge=0, le=1)
    missing: tuple[str, ...] = ()

    @field_validator("status", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("missing", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value] if value.strip() else []
        return [str(v) for v in value] if isinstance(value, list) else value

    @property
    def value(self) -> float:
        if self.score is not None:
            return self.score
        return {"complete": 1.0, "partial": 0.5, "failed": 0.0}[self.status]


class Replan(BaseModel):
    """The replanner's reply: `{"retry": [ids], "add": [sub-questions]}`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    retry: tuple[str, ...] = ()
    add: tuple[SubQuestion, ...] = ()

    @field_validator("retry", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        return [_as_id(v) for v in value] if isinstance(value, list) else value


def fill(template: str, values: Mapping[str, str]) -> str:
    """`template` with each `{name}` of `values` replaced in one pass; every other brace is
    literal (the templates hold JSON examples, and a value may hold braces of its own)."""
    slot = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")
    return slot.sub(lambda match: values[match.group(1)], template)


def read_json(text: str, model: type[M]) -> M:
    """The first JSON object in `text` that `model` accepts; else PlanError naming why."""
    decoder = json.JSONDecoder()
    first_error: str | None = None
    for match in re.finditer(r"\{", text):
        try:
            found, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if not isinstance(found, dict):
            continue
        try:
            return model.model_validate(found)
        except ValidationError as exc:
            if first_error is None:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"]) or "(top level)"
                first_error = f"{where}: {error['msg']}"
    if first_error is not None:
        raise PlanError(f"the JSON does not have the shape asked for: {first_error}")
    raise PlanError("no JSON object in the reply")


def check_dag(nodes: Sequence[SubQuestion], *, max_nodes: int, known: Iterable[str] = ()) -> None:
    """Refuse duplicate ids, unknown or self dependencies, cycles and more than `max_nodes`
    nodes (`known`: ids already in the plan, which new nodes may depend on)."""
    before = list(known)
    if len(before) + len(nodes) > max_nodes:
        raise PlanError(f"{len(before) + len(nodes)} sub-questions, more than loop.max_nodes ({max_nodes})")
    ids = set(before)
    for node in nodes:
        if node.id in ids:
            raise PlanError(f"sub-question id {node.id!r} is used twice")
        ids.add(node.id)
    edges = {node.id: node.depends_on for node in nodes}
    for node in nodes:
        for dep in node.depends_on:
            if dep == node.id:
                raise PlanError(f"sub-question {node.id!r} depends on itself")
            if dep not in ids:
                raise PlanError(f"sub-question {node.id!r} depends on unknown {dep!r}")
    cycle = _cycle(edges)
    if cycle:
        raise PlanError(f"the dependencies form a cycle: {' -> '.join(cycle)}")


def _cycle(edges: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle among `edges` (node -> the nodes it depends on) as a path, or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for dep in edges.get(node, ()):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep in edges and dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in edges:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def parse_plan(text: str, *, max_nodes: int) -> Plan:
    """The planner's reply as a checked DAG, or PlanError."""
    plan = read_json(text, Plan)
    check_dag(plan.subquestions, max_nodes=max_nodes)
    return plan


def parse_verdict(text: str) -> Verdict:
    return read_json(text, Verdict)


def parse_replan(
    text: str, *, nodes: Sequence[SubQuestion], accepted: Iterable[str], max_nodes: int
) -> tuple[list[str], list[SubQuestion], list[str]]:
    """The replanner's reply as (ids to retry, nodes to add, accepted ids it asked to retry,
    which are kept as they are); PlanError for unknown ids or a bad DAG."""
    replan = read_json(text, Replan)
    ids = [node.id for node in nodes]
    for node_id in replan.retry:
        if node_id not in ids:
            raise PlanError(f"retry names unknown sub-question {node_id!r}")
    check_dag(replan.add, max_nodes=max_nodes, known=ids)
    keep = set(accepted)
    retry = list(dict.fromkeys(i for i in replan.retry if i not in keep))
    kept = list(dict.fromkeys(i for i in replan.retry if i in keep))
    return retry, list(replan.add), kept


@dataclass(frozen=True, slots=True)
class StopRules:
    """VMAO's stop conditions and their defaults."""

    rules: tuple[OptionalRule, ...] = OPTIONAL_RULES
    ready: float = 0.8  # share of sub-questions complete
    confidence: float = 0.75  # mean verifier score ...
    confidence_complete: float = 0.5  # ... with at least this share complete
    min_gain: float = 0.05  # a smaller gain in mean score is diminishing returns
    token_budget: int | None = None  # tokens spent (the run's bill) that end the loop
    max_iterations: int = 3


@dataclass(frozen=True, slots=True)
class Progress:
    """Where an iteration left the plan: its size, how much is complete, the mean score."""

    iteration: int
    nodes: int
    complete: int
    confidence: float  # mean verifier score over every sub-question (0 for unscored ones)
    tokens: int

    @property
    def completeness(self) -> float:
        return self.complete / self.nodes if self.nodes else 0.0


def stop_rule(now: Progress, before: Progress | None, rules: StopRules) -> StopRule | None:
    """The first stop rule that fires after an iteration, or None to replan and go on."""
    on = set(rules.rules)
    if "ready" in on and now.completeness >= rules.ready:
        return "ready"
    if (
        "high_confidence" in on
        and now.confidence >= rules.confidence
        and now.completeness >= rules.confidence_complete
    ):
        return "high_confidence"
    if (
        "diminishing_returns" in on
        and before is not None
        and now.confidence - before.confidence < rules.min_gain
    ):
        return "diminishing_returns"
    if rules.token_budget is not None and now.tokens >= rules.token_budget:
        return "token_budget"
    if now.iteration >= rules.max_iterations:
        return "max_iterations"
    return None


@dataclass(slots=True)
class Attempt:
    """One answer to a sub-question: its lane, and the verifier's verdict once there is one."""

    iteration: int
    lane: Lane
    verdict: Verdict | None = None

    @property
    def result(self) -> str:
        return self.lane.answer or (self.lane.text or "").strip()[:400]


@dataclass(slots=True)
class Node:
    """A sub-question as the loop tracks it."""

    spec: SubQuestion
    pending: bool = True  # to be answered (first time, or a retry)
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def latest(self) -> Attempt | None:
        """The newest attempt with text (what dependents are shown)."""
        return next((a for a in reversed(self.attempts) if a.lane.completed), None)

    @property
    def best(self) -> Attempt | None:
        """The best-scored verified attempt (the newest on a tie), else the newest."""
        scored = [a for a in self.attempts if a.verdict is not None]
        if scored:
            return max(reversed(scored), key=lambda a: a.verdict.value if a.verdict else 0.0)
        return self.latest

    @property
    def verdict(self) -> Verdict | None:
        best = self.best
        return best.verdict if best is not None else None

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.status == "complete"

    @property
    def status(self) -> str:
        if self.verdict is not None:
            return self.verdict.status
        if self.latest is not None:
            return "unverified"
        return "pending" if self.pending else "failed"

    def summary(self) -> dict[str, Any]:
        best, verdict = self.best, self.verdict
        return {
            "id": self.spec.id,
            "question": self.spec.question,
            "depends_on": list(self.spec.depends_on),
            "status": self.status,
            "score": verdict.value if verdict else None,
            "answer": best.lane.answer if best else None,
            "attempts": len(self.attempts),
        }
