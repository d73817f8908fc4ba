"""A stateful Hypothesis test of ledger + log + resume under crashes at any event.

A run is started, crashes at a random event (its log stops accepting writes, as a killed
process would), is resumed, crashes again, and so on, with random faults, concurrency and
budgets. Throughout: no completed lane is dispatched again, the budget is never exceeded, and
the log folds to the bill the run reported. At any point, a copy of the log with a forgery in
it (a lane its wave was not given, a negative or edited usage, a shrunk hold, an edited bill)
is refused by resume with exit 2, naming the forged line, and left as it was.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import lanefold
from lanefold.primitives import AnyEvent, Event, LanefoldError
from lanefold.stores.files import JsonlEventLog


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


Events = list[dict[str, Any]]
TOKENS = "gen_ai.usage.output_tokens"


def _first(events: Events, kind: str) -> int | None:
    return next((i for i, e in enumerate(events) if e["type"] == kind), None)


def _outside_its_wave(events: Events) -> int | None:
    """One more dispatch, right after a wave starts, of a lane the wave was not given."""
    at = _first(events, "wave.started")
    dispatched = next(
        (
            e
            for e in events
            if e["type"] == "lane.dispatched" and at is not None and e["wave"] == events[at]["wave"]
        ),
        None,
    )
    if at is None or dispatched is None:
        return None
    extra = json.loads(json.dumps(dispatched))
    given = events[at]["data"].get("lanes") or range(events[at]["data"]["k"])
    extra["lane"], extra["attempt"] = max(given) + 1, 1
    events.insert(at + 1, extra)
    return at + 2


def _edit(kind: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Events], int | None]:
    def forge(events: Events) -> int | None:
        at = _first(events, kind)
        if at is None:
            return None
        change(events[at]["data"])
        return at + 1

    return forge


def _usage(data: dict[str, Any], by: int) -> None:
    data["usage"][TOKENS] += by


def _bill(data: dict[str, Any]) -> None:
    data["result"]["usage"]["decode_tokens"] += 1


# forgery -> what it does to a log's events (in place), and the line it forged (None: nothing
# in this log to forge)
FORGERIES: dict[str, Callable[[Events], int | None]] = {
    "a lane outside its wave": _outside_its_wave,
    "a negative usage": _edit("lane.completed", lambda d: d["usage"].update({TOKENS: -1})),
    "a lane's usage edited": _edit("lane.completed", lambda d: _usage(d, 1)),
    "a hold shrunk": _edit(
        "lane.dispatched", lambda d: d["reserved"].update({TOKENS: d["reserved"][TOKENS] - 1})
    ),
    "the bill edited": _edit("run.completed", _bill),
}


def as_run(events: Events, run_id: str) -> Events:
    """The events as another run's, numbered 1..n as a writer numbers them."""
    for sequence, event in enumerate(events, 1):
        event.update(
            run_id=run_id, id=f"{run_id}:{sequence}", sequence=sequence, source=f"lanefold:run/{run_id}"
        )
        if event["type"] == "run.completed":
            event["data"]["result"]["run_id"] = run_id
    return events


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
        self.outcome: lanefold.RunResult | LanefoldError | None = None
        self.forged = 0

    @initialize(
        k=st.integers(2, 9),
        failure=st.sampled_from([0.0, 0.25, 0.5]),
        per_request=st.sampled_from([None, 1, 3]),
        concurrency=st.integers(1, 6),
        budget=st.sampled_from([None, 400, 900]),
        attempts=st.integers(1, 3),
        seed=st.integers(0, 5),
    )
    def setup(
        self,
        k: int,
        failure: float,
        per_request: int | None,
        concurrency: int,
        budget: int | None,
        attempts: int,
        seed: int,
    ) -> None:
        self.config = lanefold.parse_config(
            {
                "loop": {"k": k, "max_concurrency": concurrency, "seed": seed, "min_quorum": 1},
                "sampling": {"max_tokens": 40},
                "backend": {
                    "kind": "simulated",
                    "failure_rate": failure,
                    "prompt_tokens": 30,
                    "output_tokens": 25,
                    "lanes_per_request": per_request,
                },
                "budget": {"max_tokens": budget},
                "retry": {"max_attempts": attempts, "initial_backoff_s": 0.0005, "max_backoff_s": 0.001},
                "pricing": {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.25, "output_per_mtok": 3.0},
            }
        )
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
        self._attempt(lambda: lanefold.run(self.config, "q", runs_dir=self.runs, run_id="r", log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule(crash_at=st.integers(1, 60), tear=st.booleans())
    def resume(self, crash_at: int, tear: bool) -> None:
        if tear and self.path.stat().st_size:
            data = self.path.read_bytes()
            self.path.write_bytes(data[:-7])  # the last line was being written when it died
        log = CrashingLog(JsonlEventLog.open_for_resume(self.path), crash_at)
        self._attempt(lambda: lanefold.resume("r", runs_dir=self.runs, log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule()
    def resume_to_the_end(self) -> None:
        self._attempt(lambda: lanefold.resume("r", runs_dir=self.runs))
        assert self.finished

    @precondition(lambda self: self.finished)
    @rule()
    def resume_a_finished_run(self) -> None:
        """Resuming a finished run changes nothing and gives back what it gave."""
        size = self.path.stat().st_size
        try:
            again: object = lanefold.resume_sync("r", runs_dir=self.runs)
        except LanefoldError as exc:
            again = exc
        if isinstance(self.outcome, lanefold.RunResult):
            assert again == self.outcome
        else:
            assert isinstance(again, LanefoldError) and again.exit_code == self.outcome.exit_code
        assert self.path.stat().st_size == size

    def events(self) -> list[AnyEvent]:
        """The run's recorded events (none before its log exists); subclasses read other stores."""
        if not self.started or not self.path.exists():
            return []
        return list(JsonlEventLog(self.path).read())

    @precondition(lambda self: self.started)
    @rule(forgery=st.sampled_from(sorted(FORGERIES)))
    def a_forged_copy_is_refused(self, forgery: str) -> None:
        """A copy of the log as it stands, forged: resume refuses it, naming the forged line,
        and writes nothing to it."""
        events = [json.loads(e.model_dump_json(by_alias=True)) for e in self.events()]
        line = FORGERIES[forgery](events)
        if line is None:
            return
        copy = self.copy_id(f"forged{self.forged}")
        self.forged += 1
        self.write_copy(copy, as_run(events, copy))
        before = self.copy_record(copy)
        with pytest.raises(LanefoldError) as refused:
            self.resume_copy(copy)
        assert refused.value.exit_code == 2, refused.value
        assert f":{line}: corrupt event log line" in str(refused.value), (forgery, refused.value)
        assert self.copy_record(copy) == before

    def copy_id(self, name: str) -> str:
        """The run id a copy of the log is written under (subclasses share one store)."""
        return name

    def write_copy(self, run_id: str, events: Events) -> None:
        """A run's log holding `events` (subclasses write other stores)."""
        path = self.runs / run_id / "events.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in events))

    def copy_record(self, run_id: str) -> object:
        return (self.runs / run_id / "events.jsonl").read_bytes()

    def resume_copy(self, run_id: str) -> object:
        return lanefold.resume_sync(run_id, runs_dir=self.runs)

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
        state = lanefold.fold(self.events(), self.config.pricing)
        charged = sum(lane.hold.tokens for _, lane in state.in_flight() if lane.hold)
        assert state.spend.tokens + charged <= self.config.budget.max_tokens

    @invariant()
    def the_log_folds_to_the_reported_bill(self) -> None:
        if not isinstance(self.outcome, lanefold.RunResult):
            return
        state = lanefold.fold(self.events(), self.config.pricing)
        assert state.result == self.outcome.model_dump(mode="json")
        assert lanefold.UsageBreakdown.of(state.spend) == self.outcome.usage
        assert lanefold.CostBreakdown.of(state.spend) == self.outcome.cost
        assert state.reduce is not None and state.reduce.winner == self.outcome.answer


ResumeMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=8, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_resume_state_machine = ResumeMachine.TestCase
