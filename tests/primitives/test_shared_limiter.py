"""One CapacityLimiter shared by runs: every run finishes, and lanes in flight never exceed it.

A request of n lanes takes n tokens at once. Two runs each holding part of what both need
would wait for ever, so takers queue on one lock per limiter (LaneSlots). A deadlock fails
here through `fail_after` instead of hanging; a spy backend checks, on every request, that
the lanes in flight across all runs fit in the limiter and that the limiter counts them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneOutcome, SampleRequest

pytestmark = pytest.mark.anyio

QUESTION = "What is 17 * 23?"
DEADLOCK = 60  # seconds: the runs take milliseconds; only a deadlock reaches this


def config(k: int, *, max_concurrency: int = 16, seed: int = 0) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {"loop": {"k": k, "seed": seed, "max_concurrency": max_concurrency}, "backend": {"kind": "simulated"}}
    )


class Spy(SimulatedBackend):
    """The simulated backend (lanes landing after 1-5 ms, so runs overlap), checking the
    limiter on every request: lanes in flight across all runs never exceed its tokens."""

    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        super().__init__(SimulatedConfig(latency_ms=(1.0, 5.0)))
        self.limiter = limiter
        self.in_flight = self.peak = self.largest = 0
        self.breaches: list[str] = []

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        n = len(request.lanes)
        self.in_flight += n
        self.peak = max(self.peak, self.in_flight)
        self.largest = max(self.largest, n)
        total, borrowed = self.limiter.total_tokens, self.limiter.borrowed_tokens
        if self.in_flight > total:
            self.breaches.append(f"{self.in_flight} lanes in flight, {total} tokens")
        if borrowed < self.in_flight:
            self.breaches.append(f"{self.in_flight} lanes in flight, {borrowed} borrowed")
        try:
            async for outcome in super().sample(request):
                yield outcome
        finally:
            self.in_flight -= n


async def run_all(
    runs: Path, limiter: anyio.CapacityLimiter, backend: Spy, configs: list[lanefold.LoopConfig]
) -> list[lanefold.RunResult]:
    results: list[lanefold.RunResult | None] = [None] * len(configs)

    async def one(i: int) -> None:
        results[i] = await lanefold.run(
            configs[i], QUESTION, runs_dir=runs, run_id=f"r{i}", backend=backend, limiter=limiter
        )

    with anyio.fail_after(DEADLOCK):
        async with anyio.create_task_group() as tg:
            for i in range(len(configs)):
                tg.start_soon(one, i)
    assert all(result is not None for result in results)
    return [result for result in results if result is not None]


def assert_within(limiter: anyio.CapacityLimiter, backend: Spy) -> None:
    assert backend.breaches == []
    assert backend.peak <= limiter.total_tokens
    assert backend.largest <= limiter.total_tokens
    assert limiter.borrowed_tokens == 0, "every token given back"


async def test_two_runs_of_three_lanes_share_a_limiter_of_four(tmp_path: Path) -> None:
    # Each request wants 3 of the 4 tokens: two runs taking them one by one would hold 2 + 2.
    limiter = anyio.CapacityLimiter(4)
    backend = Spy(limiter)
    results = await run_all(tmp_path, limiter, backend, [config(3, seed=1), config(3, seed=2)])
    assert [r.lanes_completed for r in results] == [3, 3]
    assert_within(limiter, backend)
    assert backend.largest == 3, "each run's wave went as one request of 3 lanes"


async def test_a_session_shares_its_limiter_between_concurrent_runs(tmp_path: Path) -> None:
    limiter = anyio.CapacityLimiter(4)
    backend = Spy(limiter)
    with anyio.fail_after(DEADLOCK):
        async with lanefold.Session(
            config(3), backend=backend, limiter=limiter, runs_dir=tmp_path
        ) as session:
            results = [r async for r in session.run_many([QUESTION] * 4, concurrency=4)]
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    assert all(r.lanes_completed == 3 for r in results)
    assert_within(limiter, backend)


async def test_one_run_of_eight_lanes_under_a_limiter_of_two(tmp_path: Path) -> None:
    limiter = anyio.CapacityLimiter(2)
    backend = Spy(limiter)
    [result] = await run_all(tmp_path, limiter, backend, [config(8)])
    assert result.lanes_completed == 8
    assert_within(limiter, backend)
    assert backend.requests == 4, "8 lanes split into requests of 2, the limiter's size"


@pytest.mark.parametrize("limit", [1, 3])
async def test_several_runs_with_different_max_concurrency_share_a_small_limiter(
    tmp_path: Path, limit: int
) -> None:
    limiter = anyio.CapacityLimiter(limit)
    backend = Spy(limiter)
    configs = [config(5, max_concurrency=c, seed=c) for c in (1, 2, 3, 4, 8)]
    results = await run_all(tmp_path, limiter, backend, configs)
    assert [r.lanes_completed for r in results] == [5] * 5
    assert_within(limiter, backend)
    assert backend.peak >= 1
