"""A wave's end with a shared pool: the settlements of its last lanes are written beside the
barrier's forced write, not before it; lanes landing while others are out still flush as they
land; a pool that fails there is the run's error, a quorum not met is the quorum's, each as
itself (never a group of errors)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import anyio
import pytest
from test_dispatch import ScriptedBackend, make, spec
from test_holds_given_back import Pool, _charged

from lanefold.primitives import BackendError, QuorumNotMetError, RunError, ServerError
from lanefold.primitives.internal import Dispatcher

pytestmark = pytest.mark.anyio


class SyncSpy:
    """The run's log, noting when a forced write (`sync`) begins, from the worker thread."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.syncing = threading.Event()

    def sync(self) -> None:
        self.syncing.set()
        getattr(self.inner, "sync", lambda: None)()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@dataclass
class WaitingPool(Pool):
    """A pool whose wave-end flush (`wait=True`) waits for the log's barrier write to begin:
    if the flush came first, the barrier would never begin and the flush would time out."""

    spy: SyncSpy | None = None
    flushes: int = 0
    early: int = 0  # flushes made as lanes land (wait=False)
    fail_at_end: bool = False
    saw_barrier_begin: bool | None = None

    async def flush(self, *, wait: bool = True) -> None:
        self.flushes += 1
        if not wait:
            self.early += 1
            return
        assert self.spy is not None
        self.saw_barrier_begin = await anyio.to_thread.run_sync(self.spy.syncing.wait, 5.0)
        if self.fail_at_end:
            raise RunError("the budget went away")


def _pooled(backend: ScriptedBackend, pool: WaitingPool, **kwargs: object) -> Dispatcher:
    d = make(backend, **kwargs)  # type: ignore[arg-type]
    d.ledger.shared = pool  # type: ignore[assignment]
    pool.spy = SyncSpy(d.recorder.log)
    d.recorder.log = pool.spy  # type: ignore[assignment]
    return d


async def test_a_waves_last_settlements_go_down_beside_its_barrier() -> None:
    pool = WaitingPool()
    d = _pooled(ScriptedBackend(), pool)  # one request carries the wave's 4 lanes
    wave = await d.run_wave(spec(4))
    assert len(wave.completed()) == 4 and wave.barrier
    assert pool.saw_barrier_begin is True  # the flush was under way while the barrier went down
    assert (pool.flushes, pool.early) == (1, 0)  # the last group left its settlement to the end
    assert pool.held == 0 and pool.spent == _charged(d) > 0  # what the run's log folds to


async def test_lanes_landing_while_others_are_out_flush_as_they_land() -> None:
    pool = WaitingPool()
    d = _pooled(ScriptedBackend(lanes_per_request=1), pool, concurrency=1)  # 4 groups in turn
    await d.run_wave(spec(4))
    assert pool.early == 3  # each group but the last, as it landed
    assert pool.flushes == 4 and pool.saw_barrier_begin is True


async def test_a_group_retrying_flushes_before_its_backoff() -> None:
    tried: set[int] = set()

    def decide(lane: int, attempt: int) -> BackendError | None:
        first = lane not in tried
        tried.add(lane)
        return ServerError("busy") if first else None

    pool = WaitingPool()
    d = _pooled(ScriptedBackend(decide=decide), pool)
    wave = await d.run_wave(spec(2))
    assert len(wave.completed()) == 2
    assert pool.early == 1  # the failed first attempt's, before the retry


async def test_a_pool_failing_at_the_waves_end_is_the_runs_error_as_itself() -> None:
    pool = WaitingPool(fail_at_end=True)
    d = _pooled(ScriptedBackend(), pool)
    with pytest.raises(RunError, match="went away"):
        await d.run_wave(spec(2))
    assert "wave.barrier" in [e.type for e in d.recorder.log.read()]


async def test_a_quorum_not_met_is_raised_as_itself_once_the_flush_is_done() -> None:
    pool = WaitingPool()
    d = _pooled(ScriptedBackend(decide=lambda lane, attempt: ServerError("down")), pool, attempts=1)
    with pytest.raises(QuorumNotMetError):
        await d.run_wave(spec(2, quorum=2))
    assert pool.saw_barrier_begin is True
