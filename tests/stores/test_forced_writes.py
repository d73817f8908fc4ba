"""A run's forced log writes (its first line, each wave's barrier, its end) are awaited in a
worker thread: the event loop serves other work while the disk (or the database) works.

The run's log is wrapped so that each forced write first shuts a `threading.Event` and waits
for a coroutine on the run's own event loop to open it. Were a forced write done on the loop,
that coroutine could not run and the gate would stay shut: the write gives up after `GATE_S`
(a deadlock breaker, never a measure of speed) and the test fails instead of hanging.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.primitives import AnyEvent, BudgetStore, Event, EventLog, Store
from lanefold.stores.files import JsonlEventLog

GATE_S = 20.0


class GatedLog:
    """A store's log whose forced writes wait until the event loop opens `gate`."""

    def __init__(self, inner: EventLog, gate: threading.Event) -> None:
        self.inner, self.gate = inner, gate
        self.forced: list[tuple[str, bool]] = []  # (which write, whether the loop opened the gate)

    def _wait(self, what: str) -> None:
        self.gate.clear()  # only the loop running while this write waits opens it
        opened = self.gate.wait(GATE_S)
        self.forced.append((what, opened))

    @property
    def last_sequence(self) -> int:
        return self.inner.last_sequence

    def publishes(self, event: Event) -> bool:
        publishes = getattr(self.inner, "publishes", None)
        return publishes is not None and bool(publishes(event))

    def append(self, event: Event) -> None:
        if self.publishes(event):
            self._wait(event.type)
        self.inner.append(event)

    def sync(self) -> None:
        self._wait("sync")
        self.inner.sync()

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        return self.inner.read(from_sequence)

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        return self.inner.follow(from_sequence)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # fsync, location, torn_tail, path: the log's own


@pytest.mark.anyio
@pytest.mark.parametrize("pooled", [False, True], ids=["own-budget", "shared-budget"])
async def test_forced_writes_leave_the_event_loop_free(store: Store, pooled: bool) -> None:
    """The first line (a held run's at its funded `wave.started`), the barrier and the end of
    a two-wave run each wait for a coroutine on the same loop: all of them see it run."""
    section: dict[str, Any] = {}
    if pooled:  # the gateway's case: a run recorded from its first funded wave on
        name = f"team.{os.urandom(4).hex()}"
        assert isinstance(store, BudgetStore)
        store.set_budget(name, max_tokens=100_000)
        section = {"budget": {"shared": name}}
    config = lanefold.parse_config(
        {
            "loop": {"coordinator": "sequential_refine", "steps": 2, "seed": 5},
            "backend": {"kind": "simulated", "accuracy": 0.6},
            "retry": {"max_attempts": 1},
            **section,
        }
    )
    run_id = f"r{os.urandom(4).hex()}"
    gate = threading.Event()
    log = GatedLog(store.create_log(run_id, config.log.fsync), gate)

    async def open_the_gate() -> None:
        while True:
            gate.set()
            await anyio.sleep(0.001)

    async with lanefold.Session(config, store=store) as session, anyio.create_task_group() as tg:
        tg.start_soon(open_the_gate)
        result = await session.run("What is 7 + 8?", run_id=run_id, log=log)
        tg.cancel_scope.cancel()

    assert result.status == "answered"
    # A files log forces its first line (`run.started`: a held run writes it at its funded
    # `wave.started`) before the run appears; PostgreSQL commits it unasked.
    first = ["run.started"] if isinstance(log.inner, JsonlEventLog) else []
    assert log.forced == [(what, True) for what in [*first, "sync", "sync", "sync"]]
    types = [event.type for event in store.reader(run_id).read()]
    assert types[0] == "run.started" and types[-1] == "run.completed"
