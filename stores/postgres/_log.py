"""The record in PostgreSQL: the event log of many machines, one writer per run.

Two tables, created on first use: `lanefold_runs` (one row per run) and `lanefold_events`
(one row per event, `PRIMARY KEY (run_id, sequence)`, so a second event at a sequence is
refused by the database, not by hope). The body is the event's JSON exactly as the file log
writes it. The writer holds a session-level advisory lock on the run, released by the server
when the writer's connection dies (a SIGKILL leaves no stale lock).

Appends are queued and a writer thread commits whatever is queued in one transaction (with a
NOTIFY that wakes every follower); `sync` waits until the queue is committed. psycopg's async
connection runs only on asyncio, and this library runs on trio too, so the sync driver is
used: from that thread for writes, and for `follow` through `anyio.wait_readable` on its socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from lanefold.primitives import (
    END_TYPES,
    ConfigError,
    FsyncPolicy,
    LogCorruptError,
    LogWriteError,
    RunInUseError,
    RunNotFoundError,
    check_next_sequence,
    read_event,
    validate_run_id,
)
from lanefold.primitives.events import AnyEvent, Event
from lanefold.stores.postgres._database import CHANNEL, PgDatabase, psycopg_module, reason

if TYPE_CHECKING:
    import psycopg

__all__ = ("PgEventLog", "lock_key")

_RECHECK_S = 1.0  # a follower's read after a quiet second, whatever the notices said

_INSERT = "INSERT INTO lanefold_events (run_id, sequence, type, body) VALUES (%s, %s, %s, %s)"
_WRITER = "lanefold writer pid="
_FOLLOWER = "lanefold follower"


def lock_key(run_id: str) -> int:
    """The run's advisory lock key: 64 bits of a hash, signed as PostgreSQL's bigint."""
    digest = hashlib.blake2b(f"lanefold.run:{run_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PgEventLog:
    """A run's event log in PostgreSQL, with the file log's contract.

    `create` starts a new run, `open_for_resume` continues one (both take the run's advisory
    lock first: RunInUseError when another writer holds it, anywhere); `PgEventLog(db, run_id)`
    only reads and follows, and takes no lock.
    """

    torn_tail = None  # a transaction commits whole: nothing is ever half-written

    def __init__(
        self,
        db: PgDatabase,
        run_id: str,
        *,
        fsync: FsyncPolicy = "barrier",
        _conn: psycopg.Connection[Any] | None = None,
        _last: int = 0,
        _new: bool = False,
    ) -> None:
        self.db = db
        self.run_id = validate_run_id(run_id)
        self.fsync = fsync
        self.location = db.where(run_id)
        self._conn = _conn
        self._last = _last
        self._new = _new  # the runs row goes in with the first event: a run appears whole
        self._queue: list[tuple[str, int, str, str]] = []
        self._committed = _last
        self._error: str | None = None
        self._closing = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if _conn is not None:
            if fsync == "never":  # the file log's `never`: the server flushes in its own time
                _conn.execute("SET synchronous_commit = off")
            self._thread = threading.Thread(
                target=self._write_loop, daemon=True, name=f"lanefold-pglog-{run_id}"
            )
            self._thread.start()

    @classmethod
    def _writer(cls, db: PgDatabase, run_id: str) -> psycopg.Connection[Any]:
        conn = db.connect(name=f"{_WRITER}{os.getpid()}")
        try:
            db.ensure_schema(conn)
            key = lock_key(run_id)
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if not (row and row[0]):
                raise RunInUseError(run_id, _holder(conn, key))
        except BaseException:
            conn.close()
            raise
        return conn

    @classmethod
    def create(cls, db: PgDatabase, run_id: str, *, fsync: FsyncPolicy = "barrier") -> PgEventLog:
        """Start a new run's log; refuses a run id already in the database."""
        validate_run_id(run_id)
        conn = cls._writer(db, run_id)
        if conn.execute("SELECT 1 FROM lanefold_runs WHERE run_id = %s", (run_id,)).fetchone():
            conn.close()
            raise ConfigError(f"{db.where(run_id)}: a run with this id already exists")
        return cls(db, run_id, fsync=fsync, _conn=conn, _new=True)

    @classmethod
    def open_for_resume(cls, db: PgDatabase, run_id: str, *, fsync: FsyncPolicy = "barrier") -> PgEventLog:
        """Continue a run: its lock first, then its last sequence."""
        validate_run_id(run_id)
        conn = cls._writer(db, run_id)
        row = conn.execute(
            "SELECT max(sequence) FROM lanefold_events WHERE run_id = %s", (run_id,)
        ).fetchone()
        if row is None or row[0] is None:
            conn.close()
            raise RunNotFoundError(f"{db.where(run_id)}: no run {run_id!r} in the store")
        return cls(db, run_id, fsync=fsync, _conn=conn, _last=int(row[0]))

    @property
    def last_sequence(self) -> int:
        return self._last

    def append(self, event: Event) -> None:
        """Queue one event for the writer thread; `always` waits for it to commit."""
        if self._thread is None or self._closing:
            raise RuntimeError(f"{self.location}: log is not open for writing")
        if self._error is not None:
            raise LogWriteError(self._error)
        check_next_sequence(self._last, event)
        body = event.model_dump_json(by_alias=True)
        with self._cond:
            self._queue.append((self.run_id, event.sequence, event.type, body))
            self._cond.notify()
        self._last = event.sequence
        if self.fsync == "always":
            self.sync()

    def sync(self) -> None:
        """Block until every appended event is committed; LogWriteError if the database failed."""
        if self._thread is None:
            return
        with self._cond:
            while self._committed < self._last and self._error is None:
                self._cond.wait()
        if self._error is not None:
            raise LogWriteError(self._error)

    def _write_loop(self) -> None:
        """Commit whatever is queued, one transaction per batch (group commit)."""
        conn = self._conn
        assert conn is not None
        psycopg = psycopg_module()
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            try:
                with conn.transaction():
                    if self._new:
                        conn.execute("INSERT INTO lanefold_runs (run_id) VALUES (%s)", (self.run_id,))
                    with conn.cursor() as cur:
                        cur.executemany(_INSERT, batch)
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.run_id))
            except psycopg.Error as exc:
                with self._cond:
                    self._error = f"{self.location}: cannot append to the run log: {reason(exc)}"
                    self._cond.notify_all()
                return
            with self._cond:
                self._new = False
                self._committed = batch[-1][1]
                self._cond.notify_all()

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        """Every committed event from `from_sequence` on, checked for order (no lock)."""
        if self._thread is not None:
            self.sync()  # a writer reads what it wrote
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT sequence, body FROM lanefold_events WHERE run_id = %s ORDER BY sequence",
                (self.run_id,),
            ).fetchall()
        if not rows:
            raise RunNotFoundError(f"{self.location}: no run {self.run_id!r} in the store")
        last = 0
        for sequence, body in rows:
            event = self._parse(sequence, body, last)
            last = event.sequence
            if event.sequence >= from_sequence:
                yield event

    def _parse(self, sequence: int, body: str, last: int) -> AnyEvent:
        event = read_event(body, self.location, sequence)
        if event.sequence != sequence or sequence != last + 1:
            raise LogCorruptError(self.location, sequence, f"sequence {event.sequence} after {last}")
        return event

    async def follow(self, from_sequence: int = 1) -> AsyncIterator[AnyEvent]:
        """Yield events as they commit, woken by NOTIFY (and a read after every quiet second,
        in case a notice went astray); waits for the run to appear; ends after the run's end
        (completed, failed or interrupted)."""
        conn = await anyio.to_thread.run_sync(lambda: self.db.connect(name=_FOLLOWER))
        try:
            await anyio.to_thread.run_sync(self.db.ensure_schema, conn)
            await anyio.to_thread.run_sync(conn.execute, f"LISTEN {CHANNEL}")
            last = 0
            while True:
                # Listening before reading: a commit after this read is notified below.
                rows = await anyio.to_thread.run_sync(self._rows_after, conn, last)
                for sequence, body in rows:
                    event = self._parse(sequence, body, last)
                    last = event.sequence
                    if event.sequence >= from_sequence:
                        yield event
                    if event.type in END_TYPES:
                        return
                # Until this run commits again: what arrived during the read (psycopg keeps
                # it), else whatever comes on the connection's socket; and, whatever the
                # notices say, a read again after a quiet second, so a notice that slipped
                # between the socket and psycopg's backlog costs a second, never the follow.
                while not any(
                    notice.payload == self.run_id
                    for notice in await anyio.to_thread.run_sync(self._arrived, conn)
                ):
                    with anyio.move_on_after(_RECHECK_S) as quiet:
                        await anyio.wait_readable(conn.fileno())
                    if quiet.cancelled_caught:
                        break
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(conn.close)

    @staticmethod
    def _arrived(conn: psycopg.Connection[Any]) -> list[psycopg.Notify]:
        return list(conn.notifies(timeout=0))

    def _rows_after(self, conn: psycopg.Connection[Any], last: int) -> list[tuple[int, str]]:
        rows: list[tuple[int, str]] = conn.execute(
            "SELECT sequence, body FROM lanefold_events WHERE run_id = %s AND sequence > %s"
            " ORDER BY sequence",
            (self.run_id, last),
        ).fetchall()
        return rows

    def close(self) -> None:
        """Commit what is queued, stop writing and release the run's lock."""
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._thread.join()
            self._thread = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                # Released before the connection closes: a closed session's locks go a moment
                # later, and a reader asking in that moment (`writing`, `list`) saw a writer.
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(self.run_id),))
            with contextlib.suppress(Exception):
                self._conn.close()  # and had the process died, the server drops the lock with it
            self._conn = None


def _holder(conn: psycopg.Connection[Any], key: int) -> int | None:
    """The pid of the process holding `key` (from its connection's application name)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    row = conn.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.classid::bigint = %s AND l.objid::bigint = %s",
        (unsigned >> 32, unsigned & 0xFFFFFFFF),
    ).fetchone()
    name = str(row[0]) if row else ""
    pid = name.removeprefix(_WRITER)
    return int(pid) if name.startswith(_WRITER) and pid.isdigit() else None
