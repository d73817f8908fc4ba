"""A stateful Hypothesis test of ledger + log + resume under crashes at any event.

A run is started, crashes at a random event (its log stops accepting writes, as a killed
process would), is resumed, crashes again, and so on, with random faults, concurrency and
budgets. Throughout: no completed lane is dispatched again, the budget is never exceeded, and
the log folds to the bill the run reported.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import orchestrator
from primitives import AnyEvent, Event, JsonlEventLog, LanefoldError


class Crash(Exception):
    """The process died: nothing more reaches the log."""


class CrashingLog:
    """Wraps a JSONL log; after `budget` appends every write fails, like a killed process."""

    def __init__(self, inner: JsonlEventLog, budget: int) -> None:
        self.inner, self.budget = inner, budget

    @property
    def last_sequence(self) -> int:
        return self.inner.last_sequence

    def append(self, event: Event) -> None:
        if self.budget <= 0:
            raise Crash
        self.budget -= 1
        self.inner.append(event)

    def sync(self) -> None:
        self.inner.sync()

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        return self.inner.read(from_sequence)

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        return self.inner.follow(from_sequence)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def crashed(exc: BaseException) -> bool:
    if isinstance(exc, Crash):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(crashed(e) for e in exc.exceptions)
    return exc.__cause__ is not None and crashed(exc.__cause__)


class ResumeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runs = Path(tempfile.mkdtemp()) / "runs"
        self.started = self.finished = False
        self.outcome: orchestrator.RunResult | LanefoldError | None = None

    @initialize(k=st.integers(2, 9), failure=st.sampled_from([0.0, 0.25, 0.5]),
                per_request=st.sampled_from([None, 1, 3]), concurrency=st.integers(1, 6),
                budget=st.sampled_from([None, 400, 900]), attempts=st.integers(1, 3),
                seed=st.integers(0, 5))
    def setup(self, k: int, failure: float, per_request: int | None, concurrency: int,
              budget: int | None, attempts: int, seed: int) -> None:
        self.config = orchestrator.parse_config({
            "loop": {"k": k, "max_concurrency": concurrency, "seed": seed, "min_quorum": 1},
            "sampling": {"max_tokens": 40},
            "backend": {"kind": "simulated", "failure_rate": failure, "prompt_tokens": 30,
                        "output_tokens": 25, "lanes_per_request": per_request},
            "budget": {"max_tokens": budget},
            "retry": {"max_attempts": attempts, "initial_backoff_s": 0.0005,
                      "max_backoff_s": 0.001},
            "pricing": {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.25,
                        "output_per_mtok": 3.0},
        })
        self.path = self.runs / "r" / "events.jsonl"

    def _attempt(self, call: Any) -> None:
        try:
            self.outcome = anyio.run(call)
            self.finished = True
        except LanefoldError as exc:  # a governed end: budget, quorum; recorded as run.failed
            self.outcome = exc
            self.finished = crashed(exc) is False
        except (Crash, BaseExceptionGroup) as exc:
            assert crashed(exc), exc

    @precondition(lambda self: not self.started)
    @rule(crash_at=st.integers(1, 60))
    def start(self, crash_at: int) -> None:
        self.started = True
        log = CrashingLog(JsonlEventLog.create(self.path), crash_at)
        self._attempt(lambda: orchestrator.run(self.config, "q", runs_dir=self.runs, run_id="r",
                                               log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule(crash_at=st.integers(1, 60), tear=st.booleans())
    def resume(self, crash_at: int, tear: bool) -> None:
        if tear and self.path.stat().st_size:
            data = self.path.read_bytes()
            self.path.write_bytes(data[:-7])  # the last line was being written when it died
        log = CrashingLog(JsonlEventLog.open_for_resume(self.path), crash_at)
        self._attempt(lambda: orchestrator.resume("r", runs_dir=self.runs, log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule()
    def resume_to_the_end(self) -> None:
        self._attempt(lambda: orchestrator.resume("r", runs_dir=self.runs))
        assert self.finished

    @precondition(lambda self: self.finished)
    @rule()
    def resume_a_finished_run(self) -> None:
        """Resuming a finished run changes nothing and gives back what it gave."""
        size = self.path.stat().st_size
        try:
            again: object = orchestrator.resume_sync("r", runs_dir=self.runs)
        except LanefoldError as exc:
            again = exc
        if isinstance(self.outcome, orchestrator.RunResult):
            assert again == self.outcome
        else:
            assert isinstance(again, LanefoldError) and again.exit_code == self.outcome.exit_code
        assert self.path.stat().st_size == size

    def events(self) -> list[AnyEvent]:
        """The run's recorded events (none before its log exists); subclasses read other stores."""
        if not self.started or not self.path.exists():
            return []
        return list(JsonlEventLog(self.path).read())

    @invariant()
    def no_completed_lane_is_dispatched_again(self) -> None:
        done: set[tuple[int | None, int | None]] = set()
        for event in self.events():
            key = (event.wave, event.lane)
            if event.type == "lane.dispatched":
                assert key not in done, f"lane {key} dispatched after it completed"
            elif event.type == "lane.completed":
                done.add(key)

    @invariant()
    def the_budget_is_never_exceeded(self) -> None:
        if not self.started or self.config.budget.max_tokens is None:
            return
        state = orchestrator.fold(self.events(), self.config.pricing)
        charged = sum(lane.hold.tokens for _, lane in state.in_flight() if lane.hold)
        assert state.spend.tokens + charged <= self.config.budget.max_tokens

    @invariant()
    def the_log_folds_to_the_reported_bill(self) -> None:
        if not isinstance(self.outcome, orchestrator.RunResult):
            return
        state = orchestrator.fold(self.events(), self.config.pricing)
        assert state.result == self.outcome.model_dump(mode="json")
        assert orchestrator.UsageBreakdown.of(state.spend) == self.outcome.usage
        assert orchestrator.CostBreakdown.of(state.spend) == self.outcome.cost
        assert state.reduce is not None and state.reduce.winner == self.outcome.answer


ResumeMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=8, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_resume_state_machine = ResumeMachine.TestCase
