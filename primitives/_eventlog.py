"""Event logs: the record of a run. Append-only, one JSON event per line.

`JsonlEventLog` is the embedded default (`runs/<run_id>/events.jsonl`); `MemoryEventLog`
serves tests. Appends write a whole line in one `write`; the fsync policy decides when the
line is forced to disk: every append (`always`), at barriers and run end (`barrier`), or never.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import anyio
from pydantic import ValidationError

from primitives._errors import ConfigError, LogCorruptError, RunNotFoundError
from primitives._events import AnyEvent, Event, parse_event

__all__ = (
    "EventLog",
    "FsyncPolicy",
    "JsonlEventLog",
    "MemoryEventLog",
    "TornTail",
    "validate_run_id",
)

FsyncPolicy = Literal["always", "barrier", "never"]
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TERMINAL = frozenset({"run.completed", "run.failed"})


def validate_run_id(run_id: str) -> str:
    """Accept only plain names: letters, digits, `.`, `_`, `-`; no `/`, no `..`."""
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise ConfigError(f"run id {run_id!r} is not a plain name (letters, digits, . _ -)")
    return run_id


class EventLog(Protocol):
    """Where a run's events go. Append is synchronous and ordered; `sync` is a durability point."""

    @property
    def last_sequence(self) -> int: ...

    def append(self, event: Event) -> None: ...

    def sync(self) -> None: ...

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]: ...

    def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]: ...

    def close(self) -> None: ...


def _check_order(last: int, event: Event) -> None:
    if event.sequence != last + 1:
        raise ValueError(f"event sequence {event.sequence} does not follow {last}")


class MemoryEventLog:
    """An in-memory log for tests and for embedding without a disk."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self._changed = anyio.Event()

    @property
    def last_sequence(self) -> int:
        return self.events[-1].sequence if self.events else 0

    def append(self, event: Event) -> None:
        _check_order(self.last_sequence, event)
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
                if event.type in _TERMINAL:
                    return
            await self._changed.wait()

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class TornTail:
    """A half-written last line found, and cut off, when a log was opened for resume."""

    line: int
    bytes: int


class JsonlEventLog:
    """The embedded default: an append-only JSON Lines file per run.

    Use `create` for a new run and `open_for_resume` to continue one (which repairs a torn
    tail and refuses a log corrupt anywhere else); `read`/`follow` only read.
    """

    def __init__(self, path: str | Path, *, fsync: FsyncPolicy = "barrier", _fd: int | None = None,
                 _last: int = 0, torn_tail: TornTail | None = None) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd = _fd
        self._last = _last
        self.torn_tail = torn_tail

    @classmethod
    def create(cls, path: Path, *, fsync: FsyncPolicy = "barrier") -> JsonlEventLog:
        """Start a new log; refuses to overwrite an existing one."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise ConfigError(f"{path}: a run with this id already exists") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot create the run log: {exc.strerror}") from None
        return cls(path, fsync=fsync, _fd=fd)

    @classmethod
    def open_for_resume(cls, path: Path, *, fsync: FsyncPolicy = "barrier") -> JsonlEventLog:
        """Open an existing log to append to it; a torn last line is cut off and reported."""
        if not path.is_file():
            raise RunNotFoundError(f"{path}: no event log for this run id")
        data = path.read_bytes()
        last, good_end, torn = _scan(path, data)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if good_end != len(data):
            os.ftruncate(fd, good_end)
            os.fsync(fd)
        return cls(path, fsync=fsync, _fd=fd, _last=last, torn_tail=torn)

    @property
    def last_sequence(self) -> int:
        return self._last

    def append(self, event: Event) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: log is not open for writing")
        _check_order(self._last, event)
        line = event.model_dump_json(by_alias=True).encode() + b"\n"
        os.write(self._fd, line)  # O_APPEND and one write: a reader never sees half of two lines
        self._last = event.sequence
        if self.fsync == "always":
            os.fsync(self._fd)

    def sync(self) -> None:
        """A durability point (barrier, run end): fsync unless the policy is `never`."""
        if self._fd is not None and self.fsync != "never":
            os.fsync(self._fd)

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        """Every complete event from `from_sequence` on; a partial last line is not yet an event."""
        if not self.path.is_file():
            raise RunNotFoundError(f"{self.path}: no event log for this run id")
        data = self.path.read_bytes()
        for _, event in _lines(self.path, data, tolerate_partial_tail=True):
            if event.sequence >= from_sequence:
                yield event

    async def follow(self, from_sequence: int = 1, *, poll_s: float = 0.05) -> AsyncIterator[AnyEvent]:
        """Yield events as they land; waits for the file to appear; ends after the run's end."""
        # Another process creates the file: there is no in-process event to wait on.
        while not self.path.exists():  # noqa: ASYNC110
            await anyio.sleep(poll_s)
        offset, pending, lineno, last = 0, b"", 0, 0
        while True:
            with self.path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                lineno += 1
                event = _parse(self.path, lineno, raw)
                if event.sequence <= last:
                    raise LogCorruptError(str(self.path), lineno, "sequence does not increase")
                last = event.sequence
                if event.sequence >= from_sequence:
                    yield event
                if event.type in _TERMINAL:
                    return
            await anyio.sleep(poll_s)

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None


def _parse(path: Path, lineno: int, raw: bytes) -> AnyEvent:
    try:
        return parse_event(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        reason = f"{first['msg']}" + (f" at {where}" if where else "")
        raise LogCorruptError(str(path), lineno, reason) from None


def _lines(path: Path, data: bytes, *, tolerate_partial_tail: bool) -> Iterator[tuple[int, AnyEvent]]:
    """(end offset, event) per complete line, checking sequence order."""
    start, lineno, last = 0, 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end == -1:
            if tolerate_partial_tail:
                return
            end = len(data)
        lineno += 1
        event = _parse(path, lineno, data[start:end])
        if event.sequence != last + 1:
            raise LogCorruptError(str(path), lineno, f"sequence {event.sequence} after {last}")
        last = event.sequence
        start = end + 1
        yield start, event


def _scan(path: Path, data: bytes) -> tuple[int, int, TornTail | None]:
    """Validate a whole log; return (last sequence, end of the good part, torn tail if any)."""
    torn: TornTail | None = None
    body = data
    if data and not data.endswith(b"\n"):
        # A last line without its newline is a write cut short: the crash we must survive.
        tail_start = data.rfind(b"\n") + 1
        body = data[:tail_start]
        torn = TornTail(line=body.count(b"\n") + 1, bytes=len(data) - tail_start)
    last = 0
    for _, event in _lines(path, body, tolerate_partial_tail=False):
        last = event.sequence
    return last, len(body), torn
