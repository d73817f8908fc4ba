"""The recorder: the one way events enter a run's log.

It fills the envelope (sequence, id, source, time), folds the event into the live state with
the same `apply` that resume uses (an event that does not follow is refused unwritten), then
appends it. A line's time is the clock's, and never before the latest time in the log: a clock
that stepped back (or a resume on a machine whose clock is behind) stamps that time again, so
the log's times run forward as its readers require.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from lanefold.primitives._errors import LogWriteError
from lanefold.primitives._eventlog import EventLog
from lanefold.primitives._offload import offload
from lanefold.primitives._state import RunState, apply
from lanefold.primitives.events import AnyEvent, Event

__all__ = ("Recorder",)

E = TypeVar("E", bound=Event)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Recorder:
    """Appends events for one run and keeps its `RunState` current."""

    def __init__(
        self,
        log: EventLog,
        run_id: str,
        state: RunState,
        now: Callable[[], datetime] = _utc_now,
        observer: Callable[[AnyEvent], None] | None = None,
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.state = state
        path = getattr(log, "path", None)  # resolved once: each resolve walks the folders
        self._log_path = str(path.resolve()) if path is not None else None
        if self._log_path is not None and state.source == "<log>":
            state.source = self._log_path
        self._now = now
        self._observer = observer
        self._source = f"lanefold:run/{run_id}"
        self.broken = False  # an append failed: the log ends where it is
        self._publishing = False  # a first line is going down (`offload`)

    @property
    def log_path(self) -> str | None:
        """Where the log lives on disk, for logs that live on disk."""
        return self._log_path

    def emit(
        self,
        kind: type[E],
        data: Any,
        *,
        wave: int | None = None,
        lane: int | None = None,
        attempt: int | None = None,
        event_type: str | None = None,
    ) -> E:
        """Record one event of `kind` (`event_type` names a LoopEvent's `loop.<name>.<noun>`)."""
        event = self._next(kind, data, wave=wave, lane=lane, attempt=attempt, event_type=event_type)
        self._append(event)
        return self._observed(event)

    async def emit_first(self, kind: type[E], data: Any, *, wave: int | None = None) -> E:
        """Record an event that may put the run in the store (its `run.started`, or a held
        run's first funded `wave.started`): a log that forces that first write to disk before
        the run appears (`publishes`) does it off the event loop (`offload`: in a worker
        thread, so the loop serves other runs while the disk works); the caller awaits it,
        so nothing of this run is written or returned before it is down. Any other event is
        appended as `emit` does.

        Only while nothing else writes this run (its first line precedes every lane): an
        `emit` meanwhile would take a sequence the log has not counted yet, so it is refused.
        """
        event = self._next(kind, data, wave=wave)
        if not _publishes(self.log, event):
            self._append(event)
            return self._observed(event)
        self._publishing = True
        try:
            await offload(self._append, event)
        finally:
            self._publishing = False
        return self._observed(event)

    def _next(
        self,
        kind: type[E],
        data: Any,
        *,
        wave: int | None = None,
        lane: int | None = None,
        attempt: int | None = None,
        event_type: str | None = None,
    ) -> E:
        """The next event, enveloped and folded into the state (refused unwritten if it does
        not follow from it)."""
        if self._publishing:
            raise RuntimeError(f"run {self.run_id}: an event emitted while the log's first line goes down")
        sequence = self.log.last_sequence + 1
        now, latest = self._now(), self.state.latest_time
        extra: dict[str, Any] = {"type": event_type} if event_type is not None else {}
        # The payload is a validated model already and the envelope is ours: skip re-validation
        # on this hot path (every log is read back through full validation).
        event = cast(
            E,
            kind.model_construct(
                id=f"{self.run_id}:{sequence}",
                source=self._source,
                time=now if latest is None or now >= latest else latest,
                sequence=sequence,
                run_id=self.run_id,
                wave=wave,
                lane=lane,
                attempt=attempt,
                data=data,
                **extra,
            ),
        )
        if self.broken:
            raise LogWriteError(f"run {self.run_id}: the log failed earlier; nothing more is recorded")
        # Folded first: an event that does not follow from the state is refused unwritten.
        apply(self.state, event, envelope=False)  # type: ignore[arg-type]  # the envelope is ours
        return event

    def _append(self, event: Event) -> None:
        try:
            self.log.append(event)
        except BaseException:
            self.broken = True  # the state is ahead of the log now: write nothing more
            raise

    def _observed(self, event: E) -> E:
        if self._observer is not None:
            self._observer(event)  # type: ignore[arg-type]
        return event

    async def sync(self) -> None:
        """A durability point (a wave's barrier, the run's end): the log's `sync` (fsync under
        the `barrier` and `always` policies, the commit on PostgreSQL), awaited off the
        event loop (`offload`) so the loop serves other runs while the disk works. Appends
        may go on meanwhile; what was appended before the call is down when it returns."""
        await offload(self.log.sync)


def _publishes(log: EventLog, event: Event) -> bool:
    """Whether appending `event` is the write that forces a new log down before it appears
    (a log says so by a `publishes(event)` method; one without it never does)."""
    publishes: Callable[[Event], bool] | None = getattr(log, "publishes", None)
    return publishes is not None and publishes(event)
