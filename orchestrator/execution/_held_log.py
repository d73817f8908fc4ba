"""A new run's log held back until the run is funded: a request no budget could fund is not a run.

A run spending from named budgets (`[budget] shared`, a gateway key's) is recorded from its
first funded wave on: until a `wave.started` is appended (its holds reserved from every pool),
its events wait here in memory, in order, and readers see no run. If it ends before then,
refused by a pool (`budget.exhausted` naming the pool, then `run.failed` with
`BudgetExhaustedError`), nothing reaches the store (no folder, no rows) and the refusal is counted
on that pool instead; any other end (an interrupt, another error) is written as it would have
been.

The log itself is made only then (`make`: the store's `create_log`, its folder, lock and draft
on files), in the same worker-thread trip that writes the held lines and forces the first one
down: one trip to a thread for a run's appearance instead of two, and nothing made for a
refusal. The run's writer lock is therefore taken once its first wave is reserved: a run another
process writes meanwhile (a racing retry of the same `Idempotency-Key`) is refused there
(RunInUseError), after the holds were taken, and the dispatch path gives them back, unspent, as
for any wave whose start could not be recorded.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from lanefold.primitives import AnyEvent, Event, EventLog, LanefoldError, LogWriteError
from lanefold.primitives.events import BudgetExhausted, RunFailed

__all__ = ("HeldLog",)

_log = logging.getLogger("lanefold.run")


class HeldLog:
    """A new run's `EventLog`, made by `make()` when a `wave.started` comes, or `over` a log
    given already made; appends wait until then (see above). `location` is where the log
    will be (the store's `location` of the run)."""

    def __init__(self, make: Callable[[], EventLog], *, location: str, fsync: Any) -> None:
        self._make: Callable[[], EventLog] | None = make
        self.inner: EventLog | None = None
        self.location = location
        self._fsync = fsync
        self.held: list[Event] | None = []  # None once funded: appends go straight through
        self.refused_by: str | None = None  # the pool that refused the run, once it has ended

    @classmethod
    def over(cls, inner: EventLog) -> HeldLog:
        """Hold back the appends to a log already made (a caller's own)."""
        held = cls(lambda: inner, location=inner.location, fsync=inner.fsync)
        held.inner = inner
        return held

    @property
    def funded(self) -> bool:
        return self.held is None

    @property
    def fsync(self) -> Any:
        return self.inner.fsync if self.inner is not None else self._fsync

    @fsync.setter
    def fsync(self, value: Any) -> None:
        self._fsync = value
        if self.inner is not None:
            self.inner.fsync = value

    @property
    def last_sequence(self) -> int:
        return (self.inner.last_sequence if self.inner is not None else 0) + len(self.held or ())

    def append(self, event: Event) -> None:
        if self.held is None:
            assert self.inner is not None
            self.inner.append(event)
            return
        self.held.append(event)
        if event.type == "wave.started":
            self._write()

    def publishes(self, event: Event) -> bool:
        """Whether appending `event` does I/O the event loop must not wait on: the `wave.started`
        that funds the run makes the log (a log not made yet: always) and writes what was held,
        and the log may force its first line."""
        if self.held is not None and event.type != "wave.started":
            return False  # held in memory
        if self.inner is None:
            return True
        publishes = getattr(self.inner, "publishes", None)
        return publishes is not None and bool(publishes(event))

    def _write(self) -> None:
        if self.inner is None:
            make, self._make = self._make, None  # made once: a log that failed is not tried again
            if make is None:
                raise LogWriteError(f"{self.location}: the run's log could not be made")
            self.inner = make()
            if self.inner.fsync != self._fsync:
                self.inner.fsync = self._fsync
        held, self.held = self.held or [], None
        for event in held:
            self.inner.append(event)

    def _release(self) -> None:
        """A run that ended before it was funded: nothing written if a pool refused it, else
        what was held (its log made now)."""
        if self.held is None or (self.inner is None and self._make is None):
            return  # written already, or its log could not be made (that error is the run's)
        self.refused_by = _refused_by(self.held)
        if self.refused_by is not None:
            return
        try:
            self._write()
        except LogWriteError:
            pass  # what reached the log stands; resume reads it
        except LanefoldError as exc:  # another process writes this run id: its record stands
            _log.warning("%s: a run that ended before it was funded is not recorded: %s", self.location, exc)

    def sync(self) -> None:
        """A durability point; a run's end before it was funded writes it here (in the worker
        thread its recorder syncs in), unless a pool refused it."""
        if self.held is not None:
            self._release()
        if self.held is None and self.inner is not None:
            self.inner.sync()

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        if self.held is None and self.inner is not None:
            return self.inner.read(from_sequence)
        return iter([e for e in self.held or () if e.sequence >= from_sequence])  # type: ignore[misc]

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        if self.inner is None:
            raise RuntimeError(f"{self.location}: the run is not in the store until it is funded")
        return self.inner.follow(from_sequence)

    def close(self) -> None:
        """End the log: a run refused before it was funded leaves nothing; any other is written."""
        try:
            self._release()
        finally:
            if self.inner is not None:
                self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner" or self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)  # path, torn_tail: the log's own


def _refused_by(events: list[Event]) -> str | None:
    """The pool that refused a run that never started a wave, if that is how it ended."""
    if not events or not isinstance(events[-1], RunFailed):
        return None
    if events[-1].data.error != "BudgetExhaustedError":
        return None
    exhausted = [e for e in events if isinstance(e, BudgetExhausted)]
    return exhausted[-1].data.shared if exhausted else None
