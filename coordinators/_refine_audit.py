"""sequential_refine's record, checked: its attempts, where it stopped, and its answer.

What the chain decided is in its log: each attempt is a wave of one lane (lane number = its
step), each verdict a `judge.completed`, and its records (`attempted`, `stopped`). So reading
the log checks that each `attempted` record is its lane's status and answer and its verdict's,
that the chain stopped where its rule says (at the first attempt the verifier passed, under
`stop_on_pass`; else after `steps`; else, fewer, for the budget, the writer's reading of its
ledger), and that `reduce = "last"` answers with the last attempt that gave an answer (one rule,
`last_answered`, read by the loop too). A reducer's answer is re-run by `audit_run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lanefold.coordinators._audit import (
    answers,
    candidate_lanes,
    chosen,
    claims,
    earliest,
    outcome,
    records,
    reduced_status,
    waves_of,
)
from lanefold.primitives import AuditFinding, ExtractSpec, Lane, RunState

if TYPE_CHECKING:
    from lanefold.coordinators._sequential_refine import SequentialRefineParams

__all__ = ("attempts", "audit_refine", "last_answered")

NAME = "sequential_refine"


def last_answered(attempts: Sequence[Lane]) -> Lane | None:
    """`reduce = "last"`'s answer: the latest attempt that gave one (a failed one gives none)."""
    answered = [lane for lane in attempts if lane.completed and lane.answer]
    return answered[-1] if answered else None


def attempts(state: RunState) -> list[Lane]:
    """The chain's attempts as the log holds them, one lane a wave, in order (a wave the
    budget shrank to nothing holds none)."""
    return candidate_lanes(state, waves_of(state, "refine"))


def audit_refine(
    params: SequentialRefineParams, state: RunState, *, extract: ExtractSpec
) -> AuditFinding | None:
    """The first claim of a chain's log that does not follow from its lanes and verdicts."""
    tried = attempts(state)
    found = answers(state, waves_of(state, "refine"), extract)
    passed: list[int] = []
    wrong = None
    for step, (lane, record) in enumerate(zip(tried, records(state, NAME, "attempted"), strict=False)):
        # The verifier's verdict on the attempt, recorded before it (a judge reducer's come after).
        key = (1, lane.wave, lane.lane)
        verdict = (
            state.verdicts.get(key)
            if state.verdict_sequences.get(key, record.sequence) < record.sequence
            else None
        )
        if verdict is not None and verdict.passed:
            passed.append(step)
        expected = {
            "step": step,
            "status": lane.status,
            "answer": lane.answer,
            "passed": verdict.passed if verdict else None,
            "score": verdict.score if verdict else None,
        }
        wrong = wrong or claims(record.sequence, f"loop.{NAME}.attempted", record.data, expected)
        if wrong is None and lane.lane != step:
            wrong = record.sequence, f"attempt {step} ran as lane {lane.lane}"
    reason = None
    for record in records(state, NAME, "stopped")[:1]:
        last = len(tried) - 1
        if params.stop_on_pass and passed and passed[0] < last:
            wrong = wrong or (record.sequence, f"attempt {passed[0]} passed, and the chain went on")
        reason = (
            "passed"
            if params.stop_on_pass and passed[-1:] == [last]
            else "steps"
            if len(tried) >= params.steps
            else "budget"
        )
        wrong = wrong or claims(
            record.sequence, f"loop.{NAME}.stopped", record.data, {"reason": reason, "attempts": len(tried)}
        )
    detail = {
        "attempts": len(tried),
        "reduce": params.reduce,
        "mode": params.mode,
        "stopped": reason,
        "answers": [lane.answer if lane.completed else None for lane in tried],
    }
    answered = (
        chosen(state, last_answered(tried), "the last attempt that gave an answer is")
        if params.reduce == "last"
        else reduced_status(state)
    )
    return earliest(found, wrong, outcome(state, detail, budget_stop=reason == "budget"), answered)
