"""The dispatch path: merging, concurrency, retries, timeouts, isolation, fatal errors, budget."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import (
    AuthenticationError,
    BackendError,
    BudgetExhaustedError,
    LaneFailure,
    LaneJob,
    LaneOutcome,
    Ledger,
    Limits,
    MemoryEventLog,
    Pricing,
    QuorumNotMetError,
    RateLimitError,
    RequestRejectedError,
    RunState,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    Usage,
    fold,
    hash_config,
    sample_all,
)
from lanefold.primitives.events import RunResumed, RunResumedData, RunStarted, RunStartedData
from lanefold.primitives.internal import Dispatcher, Recorder, RetryPolicy, WaveSpec, closing, lane_seed

pytestmark = pytest.mark.anyio

Script = Callable[[SampleRequest, int], Sequence[Sample | BackendError]]


@dataclass
class ScriptedBackend:
    """A test double whose every lane outcome is decided by a script (request, lane index)."""

    decide: Callable[[int, int], Sample | BackendError | None] = lambda lane, attempt: None
    delay: float = 0.0
    lanes_per_request: int | None = None
    prefix: bool = True
    requests: list[SampleRequest] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0

    name = "scripted"

    @property
    def max_lanes_per_request(self) -> int | None:
        return self.lanes_per_request

    @property
    def shares_prefix(self) -> bool:
        return self.prefix

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 10

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.requests.append(request)
        self.in_flight += len(request.lanes)
        self.peak = max(self.peak, self.in_flight)
        try:
            await anyio.sleep(self.delay)
        finally:
            self.in_flight -= len(request.lanes)
        for i, lane in enumerate(request.lanes):
            decided = self.decide(lane.lane, lane.attempt)
            if decided is None:
                usage = Usage(0, 10, 5) if (request.share_prefix and i) else Usage(10, 0, 5)
                decided = Sample(lane.lane, f"Answer: {lane.lane % 2}", "stop", usage)
            yield decided if isinstance(decided, Sample) else LaneFailure(lane.lane, decided)

    async def aclose(self) -> None:
        pass


def make(
    backend: object,
    *,
    limits: Limits | None = None,
    concurrency: int = 64,
    attempts: int = 3,
    timeout: float | None = None,
    sleeps: list[float] | None = None,
    limiter: anyio.CapacityLimiter | None = None,
) -> Dispatcher:
    state = RunState(pricing=Pricing(input_per_mtok=1, output_per_mtok=2))
    recorder = Recorder(MemoryEventLog(), "t", state)
    started(recorder)

    async def fake_sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    return Dispatcher(
        backend,
        recorder,
        Ledger(limits or Limits(), state.pricing),  # type: ignore[arg-type]
        run_seed=1,
        max_concurrency=concurrency,
        retry=RetryPolicy(max_attempts=attempts, initial_backoff_s=0.01),
        timeout_s=timeout,
        limiter=limiter,
        sleep=fake_sleep if sleeps is not None else anyio.sleep,
    )


def started(recorder: Recorder) -> None:
    """Every log opens with run.started; the dispatcher's waves follow it."""
    recorder.emit(
        RunStarted,
        RunStartedData(
            config={},
            config_hash=hash_config({}),
            question="q",
            coordinator="test",
            backend="scripted",
            library_version="test",
        ),
    )


def spec(k: int, quorum: int = 1, max_tokens: int = 5) -> WaveSpec:
    return WaveSpec(
        1,
        "sample",
        tuple(LaneJob(i, "p") for i in range(k)),
        SamplingParams(max_tokens=max_tokens),
        min_quorum=quorum,
        annotate=lambda s: s.text.split(":")[-1].strip(),
    )


def types(d: Dispatcher) -> list[str]:
    """The event types the dispatcher wrote (after the run.started every log opens with)."""
    return [e.type for e in d.recorder.log.read()][1:]


async def test_lanes_with_one_prompt_travel_in_one_request_and_prefill_once() -> None:
    backend = ScriptedBackend()
    d = make(backend)
    wave = await d.run_wave(spec(8))
    assert len(backend.requests) == 1 and len(backend.requests[0].lanes) == 8
    assert len(wave.completed()) == 8
    assert d.ledger.spent.prefill_tokens == 10 and d.ledger.spent.cached_prefill_tokens == 70
    assert d.ledger.reserved_tokens == 0
    assert types(d) == ["wave.started"] + ["lane.dispatched"] * 8 + ["lane.completed"] * 8 + ["wave.barrier"]


async def test_concurrency_is_bounded_in_lanes() -> None:
    backend = ScriptedBackend(delay=0.01, lanes_per_request=1)
    d = make(backend, concurrency=3)
    await d.run_wave(spec(12))
    assert backend.peak == 3
    assert len(backend.requests) == 12


async def test_a_shared_limiter_bounds_lanes_across_dispatchers() -> None:
    backend = ScriptedBackend(delay=0.01, lanes_per_request=2)
    limiter = anyio.CapacityLimiter(4)
    ds = [make(backend, concurrency=4, limiter=limiter) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for d in ds:
            tg.start_soon(d.run_wave, spec(6))
    assert backend.peak == 4


async def test_a_failed_lane_is_isolated_and_the_wave_goes_on() -> None:
    def decide(lane: int, attempt: int) -> BackendError | None:
        return RequestRejectedError("bad lane") if lane == 2 else None

    d = make(ScriptedBackend(decide=decide))
    wave = await d.run_wave(spec(4, quorum=3))
    assert [s.lane for s in wave.completed()] == [0, 1, 3]
    assert [s.lane for s in wave.failed()] == [2]
    failed = [e for e in d.recorder.log.read() if e.type == "lane.failed"]
    assert len(failed) == 1 and failed[0].data.final and not failed[0].data.retryable


async def test_retryable_faults_are_retried_with_backoff_that_honours_retry_after() -> None:
    def decide(lane: int, attempt: int) -> BackendError | None:
        if lane == 1 and attempt == 1:
            return RateLimitError("slow down", retry_after=2.5)
        if lane == 2 and attempt < 3:
            return ServerError("503")
        return None

    sleeps: list[float] = []
    d = make(ScriptedBackend(decide=decide), sleeps=sleeps)
    wave = await d.run_wave(spec(4))
    assert len(wave.completed()) == 4
    assert max(sleeps) >= 2.5
    attempts = {s.lane: s.attempts for s in wave.completed()}
    assert attempts == {0: 1, 1: 2, 2: 3, 3: 1}
    failures = [(e.lane, e.attempt, e.data.final) for e in d.recorder.log.read() if e.type == "lane.failed"]
    assert sorted(failures) == [(1, 1, False), (2, 1, False), (2, 2, False)]


async def test_a_lane_that_keeps_failing_stops_after_max_attempts() -> None:
    d = make(
        ScriptedBackend(decide=lambda lane, a: ServerError("down") if lane == 0 else None),
        attempts=3,
        sleeps=[],
    )
    wave = await d.run_wave(spec(3, quorum=2))
    assert [s.lane for s in wave.failed()] == [0]
    assert [(e.attempt, e.data.final) for e in d.recorder.log.read() if e.type == "lane.failed"] == [
        (1, False),
        (2, False),
        (3, True),
    ]


async def test_timeouts_fail_the_attempt_and_charge_its_whole_hold() -> None:
    backend = ScriptedBackend(delay=5.0)
    d = make(backend, timeout=0.05, attempts=2, sleeps=[])
    with pytest.raises(QuorumNotMetError):
        await d.run_wave(spec(2, max_tokens=7))
    errors = [e.data.error for e in d.recorder.log.read() if e.type == "lane.failed"]
    assert errors == ["BackendTimeoutError"] * 4
    # Two attempts of a two-lane request, each possibly billed in full: 2 * (10 + 7 + 7).
    assert d.ledger.spent.tokens == 2 * (10 + 7 + 7)
    assert d.ledger.reserved_tokens == 0


async def test_a_fatal_error_cancels_the_rest_of_the_wave() -> None:
    def decide(lane: int, attempt: int) -> BackendError | None:
        return AuthenticationError("bad key") if lane == 0 else None

    backend = ScriptedBackend(decide=decide, lanes_per_request=1)

    async def slow_unless_first(request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        if request.lanes[0].lane != 0:
            await anyio.sleep(10)
        async with closing(ScriptedBackend.sample(backend, request)) as outcomes:
            async for outcome in outcomes:
                yield outcome

    backend.sample = slow_unless_first  # type: ignore[method-assign]
    d = make(backend)
    with anyio.fail_after(5), pytest.raises(AuthenticationError):
        await d.run_wave(spec(4))
    failed = {e.lane: e.data.error for e in d.recorder.log.read() if e.type == "lane.failed"}
    assert failed == {0: "AuthenticationError", 1: "Cancelled", 2: "Cancelled", 3: "Cancelled"}


async def test_budget_shrinks_k_never_below_the_quorum() -> None:
    # prompt 10 once + 5 per lane: 40 tokens fund 6 lanes
    d = make(ScriptedBackend(), limits=Limits(max_tokens=40))
    wave = await d.run_wave(spec(8, quorum=3))
    assert len(wave.completed()) == 6
    shrunk = [e for e in d.recorder.log.read() if e.type == "budget.wave_shrunk"]
    assert [(e.data.k_requested, e.data.k, e.data.limit) for e in shrunk] == [(8, 6, "max_tokens")]
    assert d.ledger.spent.tokens <= 40


async def test_budget_below_the_quorum_stops_with_a_budget_error() -> None:
    backend = ScriptedBackend()
    d = make(backend, limits=Limits(max_tokens=24))
    with pytest.raises(BudgetExhaustedError, match="below the quorum of 4"):
        await d.run_wave(spec(8, quorum=4))
    assert backend.requests == []
    assert types(d) == ["budget.exhausted"]


async def test_max_seconds_cancels_lanes_and_is_a_budget_error() -> None:
    backend = ScriptedBackend(delay=5.0)
    d = make(backend, limits=Limits(max_seconds=0.1))
    with anyio.fail_after(5), pytest.raises(BudgetExhaustedError, match="max_seconds"):
        await d.run_wave(spec(3, quorum=2))
    failed = [e.data for e in d.recorder.log.read() if e.type == "lane.failed"]
    assert len(failed) == 3 and all(f.final and f.error == "Cancelled" for f in failed)
    assert "max_seconds" in failed[0].message
    assert types(d)[-2:] == ["wave.barrier", "budget.exhausted"]


async def test_a_resumed_wave_dispatches_only_unfinished_lanes() -> None:
    backend = ScriptedBackend(decide=lambda lane, a: ServerError("x") if lane == 3 else None)
    d = make(backend, attempts=1)
    with pytest.raises(QuorumNotMetError):
        await d.run_wave(spec(4, quorum=4))
    # The same log cut where a crash would have left it: lane 3 dispatched, never landed.
    events = list(d.recorder.log.read())
    cut = next(i for i, e in enumerate(events) if e.type == "lane.failed" and e.lane == 3)
    log = MemoryEventLog()
    for event in events[:cut]:
        log.append(event)
    state = fold(log.read(), d.recorder.state.pricing)
    recorder = Recorder(log, "t", state)
    recorder.emit(
        RunResumed,
        RunResumedData(
            resumed_after_sequence=state.last_sequence,
            in_flight=[(1, 3)],
            active_seconds_before=state.active_seconds(),
        ),
    )
    backend2 = ScriptedBackend()
    d2 = Dispatcher(
        backend2,
        recorder,
        Ledger(Limits(), state.pricing, spent=state.spend),  # type: ignore[arg-type]
        run_seed=1,
        max_concurrency=64,
    )
    wave = await d2.run_wave(spec(4, quorum=4))
    assert [lane.lane for r in backend2.requests for lane in r.lanes] == [3]
    assert backend2.requests[0].lanes[0].attempt == 2
    assert len(wave.completed()) == 4


async def test_closed_waves_are_returned_without_dispatch() -> None:
    backend = ScriptedBackend()
    d = make(backend)
    first = await d.run_wave(spec(3))
    again = await d.run_wave(spec(3))
    assert again is first and len(backend.requests) == 1


async def test_the_live_state_is_the_fold_of_the_log() -> None:
    d = make(SimulatedBackend(SimulatedConfig(failure_rate=0.4, lanes_per_request=2)), sleeps=[])
    await d.run_wave(spec(10, quorum=1))
    folded = fold(d.recorder.log.read(), d.recorder.state.pricing)
    assert folded.waves == d.recorder.state.waves
    assert folded.spend == d.ledger.spent


def test_lane_seeds_are_stable_and_distinct() -> None:
    seeds = {lane_seed(7, w, lane) for w in range(3) for lane in range(100)}
    assert len(seeds) == 300
    assert lane_seed(7, 1, 2) == lane_seed(7, 1, 2) != lane_seed(8, 1, 2)
    assert all(0 <= s < 2**63 for s in seeds)


async def test_simulated_text_is_the_same_when_a_lane_is_dispatched_again() -> None:
    backend = SimulatedBackend(SimulatedConfig())
    params = SamplingParams(max_tokens=100)
    from lanefold.primitives import LaneRequest

    async def one(attempt: int) -> str:
        (out,) = await sample_all(
            backend, SampleRequest("q", params, (LaneRequest(4, lane_seed(3, 1, 4), 100, attempt),))
        )
        assert isinstance(out, Sample)
        return out.text

    assert await one(1) == await one(2)
    assert math.isfinite(len(await one(3)))


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 16),
    concurrency=st.integers(1, 8),
    per_request=st.sampled_from([None, 1, 2, 5]),
    failure=st.floats(0, 0.6),
    attempts=st.integers(1, 4),
    max_tokens=st.integers(30, 600),
    max_requests=st.integers(1, 30),
    max_cost=st.floats(1e-5, 1e-3),
    shared=st.booleans(),
    latency=st.integers(0, 3),
)
def test_spend_plus_reservations_never_exceed_any_limit(
    k: int,
    concurrency: int,
    per_request: int | None,
    failure: float,
    attempts: int,
    max_tokens: int,
    max_requests: int,
    max_cost: float,
    shared: bool,
    latency: int,
) -> None:
    """The hard guarantee, checked after every event under random concurrency, faults, retries."""
    limits = Limits(max_tokens=max_tokens, max_requests=max_requests, max_cost_usd=max_cost)
    backend = SimulatedBackend(
        SimulatedConfig(
            failure_rate=failure,
            lanes_per_request=per_request,
            shares_prefix=shared,
            prompt_tokens=12,
            output_tokens=9,
            latency_ms=(0, latency),
        )
    )
    d = make(backend, limits=limits, concurrency=concurrency, attempts=attempts)
    book = d.ledger

    def check(event: object) -> None:
        assert book.spent.tokens + book.reserved_tokens <= max_tokens
        assert book.spent.requests + book.reserved_requests <= max_requests
        assert book.spent.cost_usd + book.reserved_cost_usd <= max_cost * (1 + 1e-9)

    d.recorder._observer = check

    async def go() -> None:
        try:
            await d.run_wave(spec(k, quorum=1, max_tokens=10))
        except (BudgetExhaustedError, QuorumNotMetError):
            pass

    anyio.run(go)
    assert book.reserved_tokens == 0 or d.recorder.state.waves.get(1) is None
    check(None)
