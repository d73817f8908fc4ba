"""The PostgreSQL database that holds the record: its URL and password kept apart, its two
tables (created on first use), and the one kept connection short reads share.

`lanefold_evals` and `lanefold_eval_results` hold evals' own records (`_evals`).
`lanefold_runs` has a row per run; `lanefold_events` a row per event, its body the event's JSON
exactly as the file log writes it, `PRIMARY KEY (run_id, sequence)` so the database itself
refuses a second event at a sequence. psycopg (the `scale` extra) is imported when first used.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lanefold.primitives import ConfigError, StoreError, redact_url

if TYPE_CHECKING:
    import psycopg

__all__ = ("CHANNEL", "PgDatabase", "psycopg_module", "reason", "redact_url")

CHANNEL = "lanefold_events"
_SCHEMA_LOCK = 0x6C616E65  # "lane": creators of the tables take turns
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lanefold_runs ("
    " run_id text PRIMARY KEY,"
    " created timestamptz NOT NULL DEFAULT now())",
    "CREATE INDEX IF NOT EXISTS lanefold_runs_created ON lanefold_runs (created DESC, run_id DESC)",
    "CREATE TABLE IF NOT EXISTS lanefold_events ("
    " run_id text NOT NULL REFERENCES lanefold_runs (run_id),"
    " sequence bigint NOT NULL CHECK (sequence > 0),"
    " type text NOT NULL,"
    " body text NOT NULL,"
    " PRIMARY KEY (run_id, sequence))",
    # An eval's record: its manifest and summary (JSON), and its questions' rows in order.
    "CREATE TABLE IF NOT EXISTS lanefold_evals ("
    " eval_id text PRIMARY KEY,"
    " manifest text NOT NULL,"
    " summary text,"
    " created timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS lanefold_eval_results ("
    " eval_id text NOT NULL REFERENCES lanefold_evals (eval_id),"
    " position bigint NOT NULL CHECK (position > 0),"
    " body text NOT NULL,"
    " PRIMARY KEY (eval_id, position))",
)
_INSERT = "INSERT INTO lanefold_events (run_id, sequence, type, body) VALUES (%s, %s, %s, %s)"


def psycopg_module() -> Any:
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "store.url: a postgresql:// store needs psycopg (pip install 'lanefold[scale]')"
        ) from None
    return psycopg


def reason(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(frozen=True)
class PgDatabase:
    """Where the record lives: a `postgresql://` URL and the password kept apart from it."""

    url: str
    password: str | None = field(default=None, repr=False)
    # One connection for short reads, kept (connecting costs a round trip and an auth); and
    # whether the tables are known to exist. Neither is compared, printed nor pickled.
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PgDatabase, (self.url, self.password))

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"store.url: {redact_url(self.url)!r} is not a postgresql:// URL")

    @property
    def shown(self) -> str:
        """The URL as it may be printed: no password."""
        return redact_url(self.url)

    def connect(self, *, name: str = "lanefold") -> psycopg.Connection[Any]:
        """A new autocommit connection; a server that cannot be reached is a ConfigError."""
        pg = psycopg_module()
        extra = {"password": self.password} if self.password is not None else {}
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self.url, autocommit=True, application_name=name, connect_timeout=10, **extra
            )
        except pg.Error as exc:
            raise StoreError(
                f"{self.shown}: cannot connect: {reason(exc)}".replace(self.password or "\0", "***")
            ) from None
        return conn

    def ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        if self._cache.get("schema"):
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in _SCHEMA:
                conn.execute(statement)
        self._cache["schema"] = True

    @contextlib.contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """The kept connection for a short read, one thread at a time; a broken one is
        dropped and the next read connects again."""
        lock = self._cache.setdefault("lock", threading.Lock())
        with lock:
            conn = self._cache.get("conn")
            if conn is None or conn.closed:
                conn = self._cache["conn"] = self.connect()
                weakref.finalize(self, conn.close)  # closed with this object, or at exit
                self.ensure_schema(conn)
            try:
                yield conn
            except psycopg_module().Error:
                conn.close()
                raise

    def exists(self, run_id: str) -> bool:
        """Whether a run has its first event in the database."""
        with self.reading() as conn:
            row = conn.execute("SELECT 1 FROM lanefold_runs WHERE run_id = %s", (run_id,)).fetchone()
        return row is not None

    def where(self, run_id: str) -> str:
        return f"{self.shown}#{run_id}"
