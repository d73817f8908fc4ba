"""A new run's log held back until the run is funded: a request no budget could fund is not a run.

A run spending from named budgets (`[budget] shared`, a gateway key's) is recorded from its
first funded wave on: until a `wave.started` is appended (its holds reserved from every pool),
its events wait here in memory, in order, and readers see no run. If it ends before then,
refused by a pool (`budget.exhausted` naming the pool, then `run.failed` with
`BudgetExhaustedError`), nothing reaches the store (no folder, no rows) and the refusal is counted
on that pool instead; any other end (an interrupt, another error) is written as it would have
been. The run's writer lock is taken as the log is created, as for every run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from lanefold.primitives import AnyEvent, Event, EventLog, LogWriteError
from lanefold.primitives.events import BudgetExhausted, RunFailed

__all__ = ("HeldLog",)


class HeldLog:
    """Wraps a new run's `EventLog`; appends wait until a `wave.started` comes (see above)."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        self.held: list[Event] | None = []  # None once funded: appends go straight through
        self.refused_by: str | None = None  # the pool that refused the run, once it is closed

    @property
    def funded(self) -> bool:
        return self.held is None

    @property
    def fsync(self) -> Any:
        return self.inner.fsync

    @fsync.setter
    def fsync(self, value: Any) -> None:
        self.inner.fsync = value

    @property
    def last_sequence(self) -> int:
        return self.inner.last_sequence + len(self.held or ())

    def append(self, event: Event) -> None:
        if self.held is None:
            self.inner.append(event)
            return
        self.held.append(event)
        if event.type == "wave.started":
            self._write()

    def publishes(self, event: Event) -> bool:
        """Whether appending `event` forces the store before the run appears: the `wave.started`
        that funds the run writes what was held, and the inner log may force its first line."""
        if self.held is not None and event.type != "wave.started":
            return False  # held in memory
        publishes = getattr(self.inner, "publishes", None)
        return publishes is not None and bool(publishes(event))

    def _write(self) -> None:
        held, self.held = self.held or [], None
        for event in held:
            self.inner.append(event)

    def sync(self) -> None:
        if self.held is None:
            self.inner.sync()

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        if self.held is None:
            return self.inner.read(from_sequence)
        return iter([e for e in self.held if e.sequence >= from_sequence])  # type: ignore[misc]

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        return self.inner.follow(from_sequence)

    def close(self) -> None:
        """End the log: a run refused before it was funded leaves nothing; any other is written."""
        try:
            if self.held is not None:
                self.refused_by = _refused_by(self.held)
                if self.refused_by is None:
                    try:
                        self._write()
                    except LogWriteError:
                        pass  # what reached the log stands; resume reads it
        finally:
            self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # path, location, torn_tail: the log's own


def _refused_by(events: list[Event]) -> str | None:
    """The pool that refused a run that never started a wave, if that is how it ended."""
    if not events or not isinstance(events[-1], RunFailed):
        return None
    if events[-1].data.error != "BudgetExhaustedError":
        return None
    exhausted = [e for e in events if isinstance(e, BudgetExhausted)]
    return exhausted[-1].data.shared if exhausted else None
