"""An eval's record in PostgreSQL, beside its questions' runs: `lanefold_evals` (a row per
eval: its manifest and, once it has ended, its summary) and `lanefold_eval_results` (a row per
question's result, in the order they landed). One writer per eval by an advisory lock, as
per run; the tables are created on first use with the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from lanefold.primitives import ConfigError, LogWriteError, RunInUseError, validate_run_id
from lanefold.stores.postgres._database import PgDatabase, psycopg_module, reason
from lanefold.stores.postgres._log import _WRITER, _holder

__all__ = ("PgEvalRecord", "eval_lock_key")

R = TypeVar("R")

_HELD = (
    "SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
    " AND l.objsubid = 1 AND l.classid::bigint = %s AND l.objid::bigint = %s"
)


def eval_lock_key(eval_id: str) -> int:
    """The eval's advisory lock key (apart from every run's: another prefix is hashed)."""
    digest = hashlib.blake2b(f"lanefold.eval:{eval_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PgEvalRecord:
    """One eval's rows in the database."""

    def __init__(self, db: PgDatabase, eval_id: str) -> None:
        self.db = db
        self.eval_id = validate_run_id(eval_id)

    @property
    def location(self) -> str:
        return self.db.where(self.eval_id)

    @property
    def manifest_location(self) -> str:
        return f"{self.location}/eval.json"

    @property
    def results_location(self) -> str:
        return f"{self.location}/results"

    def _one(self, query: str) -> Any:
        with self.db.reading() as conn:
            row = conn.execute(query, (self.eval_id,)).fetchone()
        return None if row is None else row[0]

    def exists(self) -> bool:
        return self._one("SELECT 1 FROM lanefold_evals WHERE eval_id = %s") is not None

    def is_run(self) -> bool:
        return self.db.exists(self.eval_id)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        conn = self.db.connect(name=f"{_WRITER}{os.getpid()}")
        try:
            self.db.ensure_schema(conn)
            key = eval_lock_key(self.eval_id)
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if not (row and row[0]):
                raise RunInUseError(self.eval_id, _holder(conn, key))
            try:
                yield
            finally:
                # Released before the connection closes: the server drops a closed session's
                # locks a moment later, and `running()` read in that moment said still held.
                with contextlib.suppress(Exception):
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            with contextlib.suppress(Exception):
                conn.close()  # and had the process died, the server drops the lock with it

    def running(self) -> bool:
        unsigned = eval_lock_key(self.eval_id) & 0xFFFFFFFFFFFFFFFF
        with self.db.reading() as conn:
            row = conn.execute(_HELD, (unsigned >> 32, unsigned & 0xFFFFFFFF)).fetchone()
        return row is not None

    def read_manifest(self) -> bytes | None:
        found = self._one("SELECT manifest FROM lanefold_evals WHERE eval_id = %s")
        return None if found is None else str(found).encode()

    def write_manifest(self, body: bytes) -> None:
        self._write(
            "INSERT INTO lanefold_evals (eval_id, manifest) VALUES (%s, %s)"
            " ON CONFLICT (eval_id) DO UPDATE SET manifest = excluded.manifest",
            (self.eval_id, body.decode()),
            "write the manifest",
        )

    def read_summary(self) -> bytes | None:
        found = self._one("SELECT summary FROM lanefold_evals WHERE eval_id = %s")
        return None if found is None else str(found).encode()

    def write_summary(self, body: bytes, *, table: str) -> None:
        # The CSV is the rows again, flat: derived, so the database keeps the rows alone.
        self._write(
            "UPDATE lanefold_evals SET summary = %s WHERE eval_id = %s",
            (body.decode(), self.eval_id),
            "write the summary",
        )

    def read_rows(self, parse: Callable[[bytes], R], *, repair: bool = False) -> list[R]:
        with self.db.reading() as conn:
            found = conn.execute(
                "SELECT position, body FROM lanefold_eval_results WHERE eval_id = %s ORDER BY position",
                (self.eval_id,),
            ).fetchall()
        rows = []
        for position, body in found:  # a row is inserted whole: none is ever torn
            try:
                rows.append(parse(str(body).encode()))
            except ValueError as exc:
                raise ConfigError(f"{self.results_location}:{position}: not a result row: {exc}") from None
        return rows

    def append_row(self, body: bytes) -> None:
        self._write(
            "INSERT INTO lanefold_eval_results (eval_id, position, body)"
            " SELECT %s, coalesce(max(position), 0) + 1, %s FROM lanefold_eval_results"
            " WHERE eval_id = %s",
            (self.eval_id, body.decode(), self.eval_id),
            "append a result",
        )

    def _write(self, statement: str, params: tuple[Any, ...], what: str) -> None:
        """A write the database refuses is the machine's failure (LogWriteError), one line."""
        pg = psycopg_module()
        try:
            with self.db.reading() as conn:
                conn.execute(statement, params)
        except pg.Error as exc:
            raise LogWriteError(f"{self.location}: cannot {what}: {reason(exc)}") from None
