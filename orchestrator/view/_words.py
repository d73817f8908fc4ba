"""What the view says in words: a run's status, why it has no answer, a failed lane's error,
the command that continues a run, money as money.

One place decides each: the templates only place these words, and each is read from what the
run's record already says (its result's `status`, `reason` and outcome, its `run.failed`,
`run.interrupted`, a lane's `lane.failed`), never worked out again from its lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

from lanefold.execution import resume_command
from lanefold.primitives import LaneState, RunState

__all__ = ("LaneError", "Reason", "lane_error", "lane_state", "money", "run_status", "why")

# A lane's state in the page (`data-state`) by its state in the fold.
_STATES = {
    "pending": "dispatched",
    "dispatched": "dispatched",
    "completed": "landed",
    "failed": "failed",
    "interrupted": "interrupted",
}

# A run's failure by its error's class: the headline over its message (which holds the figures).
ReasonKind = Literal["no_answer", "budget", "quorum", "lanes_failed", "failed", "interrupted", "stopped"]
_FAILURES: dict[str, tuple[ReasonKind, str]] = {
    "BudgetExhaustedError": ("budget", "budget exhausted"),
    "QuorumNotMetError": ("quorum", "quorum not reached"),
}


def lane_state(status: str) -> str:
    """The page's word for a lane's fold status: dispatched, landed, failed or interrupted."""
    return _STATES.get(status, "dispatched")


def run_status(state: RunState, cut_off: bool = False) -> str:
    """The run's status as the list and `show` word it: its result's, else failed, interrupted,
    stopped (unfinished with no writer: a kill or a crash cut it off) or running."""
    if state.result is not None:
        return str(state.result.get("status", "answered"))
    if cut_off:
        return "stopped"
    return "failed" if state.failure else "interrupted" if state.interrupted else "running"


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a run has no answer: `kind` (the page's `data-kind`), a headline and the record's
    own line with its figures, and the command that continues the run where one does."""

    kind: ReasonKind
    headline: str
    line: str
    resume: str | None = None


def why(state: RunState, where: Sequence[str], *, cut_off: bool = False) -> Reason | None:
    """Why the run has no answer (None where it has one or is still going): its result's
    reason, its failure's class and message, its interruption; a stopped or interrupted run
    with the command that continues it."""
    result = state.result
    if result is not None:
        if result.get("status") == "answered":
            return None
        detail = result.get("outcome") or {}
        budget = isinstance(detail, dict) and detail.get("budget_stop") is True
        line = str(result.get("reason") or "the loop gave no answer")
        if budget:  # the loop stopped for the budget (its outcome says so), then found no answer
            return Reason("budget", "budget exhausted", f"the loop stopped for the budget; {line}")
        return Reason("no_answer", "no answer", line)
    if state.failure is not None:
        return _failed(state, state.failure.error, state.failure.message)
    if state.interrupted is not None:
        cut = len(state.interrupted.in_flight)
        line = f"interrupted by {state.interrupted.reason}, {cut} lane{'s' * (cut != 1)} cut off"
        return Reason("interrupted", "interrupted", line, resume_command(_id(state), where))
    if cut_off:
        line = "no writer and no ending recorded: a kill or a crash cut it off"
        return Reason("stopped", "stopped", line, resume_command(_id(state), where))
    return None


def _failed(state: RunState, error: str, message: str) -> Reason:
    """A `run.failed`: its class decides the headline, its message holds the figures."""
    line = f"{error}: {message}"
    lanes = [lane for wave in state.waves.values() for lane in wave.lanes.values()]
    if error == "QuorumNotMetError" and lanes and all(lane.status == "failed" for lane in lanes):
        return Reason("lanes_failed", "every lane failed", line)
    kind, headline = _FAILURES.get(error, ("failed", "failed"))
    return Reason(kind, headline, line)


def _id(state: RunState) -> str:
    return state.run_id or state.expected_run_id or ""


@dataclass(frozen=True, slots=True)
class LaneError:
    """A failed lane's error: its class and its message, as `lane.failed` recorded them."""

    error: str
    message: str


def lane_error(lane: LaneState) -> LaneError | None:
    """The error of a lane whose last attempt failed (the fold keeps it as "Class: message")."""
    if lane.status != "failed" or not lane.error:
        return None
    error, _, message = lane.error.partition(": ")
    return LaneError(error, message)


def money(usd: float) -> str:
    """Dollars as money: to the cent, half a cent up; an amount under a cent (most runs') to two
    significant figures, never rounded to nothing. The exact figure is the page's `data-usd`."""
    exact = Decimal(repr(abs(usd)))  # the float as it is written, not its binary expansion
    sign = "-" if usd < 0 else ""
    if exact == 0 or exact >= Decimal("0.005"):
        return f"{sign}${exact.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    step = Decimal(1).scaleb(exact.adjusted() - 1)  # the second significant figure's place
    return f"{sign}${exact.quantize(step, ROUND_HALF_UP):f}"
