"""Every refusal and error gives back what it took (issue 38): a hold reserved in the ledger and
in every pool a run spends from is settled, charged or released on each path out of a wave, so a
pool is charged exactly what the run's log says (the holds of lanes it saw sent and never land
charged whole, nothing for lanes that never went out)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio
import pytest
from test_dispatch import ScriptedBackend, make, spec

from lanefold.execution._fleet_budget import JointPool
from lanefold.primitives import (
    BudgetExhaustedError,
    Event,
    Hold,
    LaneOutcome,
    Limits,
    LogWriteError,
    Refusal,
    Room,
    RunError,
    SampleRequest,
    fold,
    short_of_room,
)
from lanefold.primitives.internal import Dispatcher

pytestmark = pytest.mark.anyio


@dataclass
class Pool:
    """An in-memory SharedPool: what it holds and what was spent, all or nothing per reserve."""

    name: str = "fleet"
    limit: int | None = None
    fail: bool = False  # reserve raises, as a store gone away would
    held: int = 0
    spent: int = 0
    room: Room | None = None
    asked: list[int] = field(default_factory=list)

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        await anyio.lowlevel.checkpoint()
        if self.fail:
            raise RunError("the store went away")
        asked = sum(h.tokens for h in holds)
        self.asked.append(asked)
        left = Room(None if self.limit is None else self.limit - self.spent - self.held)
        short = short_of_room(left, asked, 0.0, 0)
        if short is not None:
            return Refusal(*short, left, self.name)
        self.held += asked
        return None

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None:
        self.held -= hold.tokens
        self.spent += tokens

    def release(self, hold: Hold) -> None:
        self.held -= hold.tokens

    def charge_cut_off(self, hold: Hold) -> None:
        self.settle(hold, hold.tokens, 0.0, 0)

    async def flush(self, *, wait: bool = True) -> None:
        return None


def _pooled(backend: object, pool: object, **kwargs: object) -> Dispatcher:
    d = make(backend, **kwargs)  # type: ignore[arg-type]
    d.ledger.shared = pool  # type: ignore[assignment]
    return d


def _charged(d: Dispatcher) -> int:
    """The run's spend as its log folds it, lanes in flight charged their whole hold."""
    state = fold(list(d.recorder.log.read()), d.ledger.pricing)
    return state.spend.tokens + sum(lane.hold.tokens for _, lane in state.in_flight() if lane.hold)


class RefusingLog:
    """A log that stops taking appends at the first event of `kind` (a disk gone full there)."""

    def __init__(self, inner: object, kind: str) -> None:
        self.inner, self.kind = inner, kind

    def append(self, event: Event) -> None:
        if event.type == self.kind:
            raise LogWriteError(f"no room for {event.type}")
        self.inner.append(event)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_a_wave_start_the_log_cannot_take_gives_every_hold_back() -> None:
    pool = Pool()
    d = _pooled(ScriptedBackend(), pool)
    d.recorder.log = RefusingLog(d.recorder.log, "wave.started")  # type: ignore[assignment]
    with pytest.raises(LogWriteError):
        await d.run_wave(spec(4))
    assert pool.asked == [10 + 4 * 5] and pool.held == 0 and pool.spent == 0
    assert d.ledger.reserved_tokens == 0


async def test_a_store_that_fails_a_reservation_leaves_nothing_reserved() -> None:
    pool = Pool(fail=True)
    d = _pooled(ScriptedBackend(), pool)
    with pytest.raises(RunError, match="went away"):
        await d.run_wave(spec(4))
    assert d.ledger.reserved_tokens == 0 and pool.held == 0


async def test_a_wave_cancelled_with_lanes_still_waiting_gives_their_holds_back() -> None:
    """Max concurrency 1, a request a lane: while the first lane runs, three wait for a slot
    with their holds reserved. An interrupt gives those back; the one sent stays held (the
    run's end charges it whole, as its log's fold does)."""
    started = anyio.Event()

    class Stuck(ScriptedBackend):
        async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
            started.set()
            await anyio.sleep_forever()
            yield  # type: ignore[misc]  # (a generator that never yields)

    pool = Pool()
    d = _pooled(Stuck(lanes_per_request=1), pool, concurrency=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.run_wave, spec(4))
        await started.wait()
        assert pool.held == 4 * (10 + 5)
        tg.cancel_scope.cancel()
    sent = 10 + 5
    assert pool.held == sent and d.ledger.reserved_tokens == sent
    state = fold(list(d.recorder.log.read()), d.ledger.pricing)
    (flying,) = state.in_flight()
    assert flying[1].hold is not None and flying[1].hold.tokens == sent


async def test_a_retry_the_pool_refuses_is_given_back_in_the_ledger() -> None:
    from lanefold.primitives import BackendTimeoutError

    def once(lane: int, attempt: int) -> BackendTimeoutError | None:
        return BackendTimeoutError("slow") if attempt == 1 else None

    pool = Pool(limit=10 + 4 * 5)  # the first attempt fits (cut off: charged whole), not a second
    d = _pooled(ScriptedBackend(decide=once), pool, attempts=3, sleeps=[])
    with pytest.raises(BudgetExhaustedError, match="completed 0 lanes"):
        await d.run_wave(spec(4))
    wave = d.recorder.state.waves[1]
    refused = "'fleet' max_tokens: cannot fund another"
    assert all(refused in (lane.error or "") for lane in wave.lanes.values())
    assert d.ledger.reserved_tokens == 0 and pool.held == 0
    assert pool.spent == _charged(d) == 10 + 4 * 5


async def test_a_joint_reservation_is_all_or_none() -> None:
    key, fleet = Pool("key:alice", limit=1000), Pool("fleet", limit=20)
    joint = JointPool([key, fleet])
    d = _pooled(ScriptedBackend(), joint)
    with pytest.raises(BudgetExhaustedError, match="shared budget 'fleet' max_tokens"):
        await d.run_wave(spec(4, quorum=4))
    assert (key.held, fleet.held, d.ledger.reserved_tokens) == (0, 0, 0)
    assert key.asked and fleet.asked  # the key reserved, then gave it back
    fleet.fail = True
    d = _pooled(ScriptedBackend(), joint)
    with pytest.raises(RunError, match="went away"):
        await d.run_wave(spec(4, quorum=1))
    assert (key.held, fleet.held, d.ledger.reserved_tokens) == (0, 0, 0)


async def test_a_wave_within_the_pool_charges_it_what_the_log_folds() -> None:
    pool = Pool(limit=1000)
    d = _pooled(ScriptedBackend(), pool, limits=Limits(max_tokens=1000))
    await d.run_wave(spec(8))
    assert pool.held == 0 and pool.spent == _charged(d) == d.ledger.spent.tokens
