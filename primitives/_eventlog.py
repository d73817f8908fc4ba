"""Event logs: the record of a run. Append-only, one JSON event per line.

The `EventLog` protocol every store's log keeps, and `MemoryEventLog` (tests, and embedding
without a disk). The stores' logs live in `lanefold.stores` (`files`: JSON Lines on disk, the
embedded default; `postgres`). The fsync policy decides when an append is forced to durable
storage: every append (`always`), at barriers and run end (`barrier`), or never.
"""

from __future__ import annotations

import errno
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
from pydantic import ValidationError

from lanefold.primitives._errors import (
    ConfigError,
    LanefoldError,
    LogCorruptError,
    LogTooNewError,
    LogWriteError,
    StoreError,
)
from lanefold.primitives.events import SCHEMA_VERSION, AnyEvent, Event, newer_schema, parse_event

__all__ = (
    "END_TYPES",
    "EventLog",
    "FsyncPolicy",
    "MemoryEventLog",
    "TornTail",
    "check_next_sequence",
    "os_failure",
    "read_event",
    "validate_run_id",
)

FsyncPolicy = Literal["always", "barrier", "never"]
"""When a log's appends are forced to the disk (`[log] fsync`): after each event, at barriers,
reductions and the run's end, or never (the OS decides)."""
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
END_TYPES = frozenset({"run.completed", "run.failed", "run.interrupted"})
"""The event types a follower stops at: the run ended, or its writer stopped (resume starts a
new writer)."""


def validate_run_id(run_id: str) -> str:
    """Accept only plain names: letters, digits, `.`, `_`, `-`; no `/`, no `..`."""
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise ConfigError(f"run id {run_id!r} is not a plain name (letters, digits, . _ -)")
    return run_id


class EventLog(Protocol):
    """Where a run's events go. Append is synchronous and ordered; `sync` is a durability point.

    A log also says where it is (`location`, for messages: never a password), what a resume
    found half-written at its end and cut off (`torn_tail`), and when an append is forced to
    durable storage (`fsync`, settable: a resumed run applies its config's policy).
    """

    fsync: FsyncPolicy

    @property
    def location(self) -> str: ...

    @property
    def torn_tail(self) -> TornTail | None: ...

    @property
    def last_sequence(self) -> int: ...

    def append(self, event: Event) -> None: ...

    def sync(self) -> None: ...

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]: ...

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]: ...

    def close(self) -> None: ...


def check_next_sequence(last: int, event: Event) -> None:
    """Refuse an append that does not follow the log's last sequence by one."""
    if event.sequence != last + 1:
        raise ValueError(f"event sequence {event.sequence} does not follow {last}")


def read_event(raw: str | bytes, location: str, line: int) -> AnyEvent:
    """One stored line of a log as its event, or one error naming `location:line`: the first
    thing wrong with it (LogCorruptError), or that a newer lanefold wrote it (LogTooNewError)."""
    try:
        return parse_event(raw)
    except ValidationError as exc:
        schema = newer_schema(raw)
        if schema is not None:
            raise LogTooNewError(location, line, schema, SCHEMA_VERSION) from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LogCorruptError(location, line, first["msg"] + (f" at {where}" if where else "")) from None


class MemoryEventLog:
    """An in-memory log for tests and for embedding without a disk."""

    location = "<memory>"
    torn_tail: TornTail | None = None

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self.fsync: FsyncPolicy = "never"  # nothing to force: memory is gone with the process
        self._changed = anyio.Event()

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0

    def append(self, event: Event) -> None:
        check_next_sequence(self.last_sequence, event)
        self.events.append(event)  # type: ignore[arg-type]  # every Event subclass is in AnyEvent
        self._changed.set()
        self._changed = anyio.Event()

    def sync(self) -> None:
        pass

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        return iter(self.events[max(from_sequence, 1) - 1 :])

    async def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        index = max(from_sequence, 1) - 1
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                yield event
                if event.type in END_TYPES:
                    return
            await self._changed.wait()

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class TornTail:
    """A half-written last line found, and cut off, when a log was opened for resume."""

    line: int
    bytes: int


# What a full or failing disk says: the machine's failure (LogWriteError, exit 1, the run left
# resumable), not the user's. Any other refusal (permissions, a name taken) is misuse.
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def os_failure(what: str, exc: OSError) -> LanefoldError:
    """`exc` as one line: LogWriteError where the disk failed, else StoreError (a folder the
    store cannot use: not one, not writable, read-only)."""
    message = f"{what}: {exc.strerror or exc}"
    return LogWriteError(message) if exc.errno in _MACHINE_ERRNOS else StoreError(message)
