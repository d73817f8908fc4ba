"""Gateway keys in PostgreSQL (`KeyStore`): `lanefold_keys`, a row per key with its record and
its counters as JSON (never the key: its SHA-256, unique). A bucket is changed in one
transaction holding the key's row (`SELECT ... FOR UPDATE`), so every worker and replica
sharing a key takes from one bucket; the rule itself is `take_rate`/`give_rate`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from lanefold.primitives import (
    ConfigError,
    KeyRate,
    KeyRecord,
    RateVerdict,
    StoredKey,
    StoreError,
    UsesInFlight,
    give_rate,
    take_rate,
)
from lanefold.stores.postgres._database import PgDatabase, psycopg_module, reason

__all__ = ("PgKeys",)

T = TypeVar("T")
_SCHEMA_LOCK = 0x6B657973  # "keys": creators of the table take turns
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lanefold_keys ("
    " name text PRIMARY KEY,"
    " sha256 text NOT NULL UNIQUE,"
    " record text NOT NULL,"
    " rate text NOT NULL)"
)


class PgKeys:
    """The keys of one database, over its kept connection (one thread at a time)."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._uses = UsesInFlight()

    def _run(self, work: Callable[[Any], T]) -> T:
        """`work(conn)` in one transaction, the table made first where it is not known to be."""
        psycopg = psycopg_module()
        try:
            with self.db.reading() as conn:
                if not self.db._cache.get("keys"):
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                        conn.execute(_SCHEMA)
                    self.db._cache["keys"] = True
                with conn.transaction():
                    return work(conn)
        except psycopg.Error as exc:
            raise StoreError(f"{self.db.shown}: keys: {reason(exc)}") from None

    def _parse(self, record: str, rate: str) -> StoredKey:
        try:
            return StoredKey(
                record=KeyRecord.model_validate_json(record), rate=KeyRate.model_validate_json(rate)
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "(the document)"
            raise ConfigError(f"{self.db.shown}: lanefold_keys: {where}: {error['msg']}") from None

    def create_key(self, record: KeyRecord) -> StoredKey:
        key = StoredKey(record=record)

        def create(conn: Any) -> StoredKey:
            taken = conn.execute(
                "SELECT name FROM lanefold_keys WHERE name = %s OR sha256 = %s", (record.name, record.sha256)
            ).fetchone()
            if taken is not None:
                if taken[0] == record.name:
                    raise ConfigError(f"key {record.name!r}: already in {self.db.shown}")
                raise ConfigError(f"key {record.name!r}: key {taken[0]!r} has the same sha256")
            conn.execute(
                "INSERT INTO lanefold_keys (name, sha256, record, rate) VALUES (%s, %s, %s, %s)",
                (record.name, record.sha256, record.model_dump_json(), key.rate.model_dump_json()),
            )
            return key

        return self._run(create)

    def replace_key(self, record: KeyRecord) -> StoredKey:
        def replace(key: StoredKey, conn: Any) -> StoredKey:
            other = conn.execute(
                "SELECT name FROM lanefold_keys WHERE sha256 = %s AND name <> %s",
                (record.sha256, record.name),
            ).fetchone()
            if other is not None:
                raise ConfigError(f"key {record.name!r}: key {other[0]!r} has the same sha256")
            key.record = record
            return key

        try:
            return self._change(record.name, replace)
        except KeyError:
            raise ConfigError(f"key {record.name!r}: no such key in {self.db.shown}") from None

    def read_key(self, name: str) -> StoredKey | None:
        row = self._run(
            lambda conn: conn.execute(
                "SELECT record, rate FROM lanefold_keys WHERE name = %s", (name,)
            ).fetchone()
        )
        return None if row is None else self._parse(row[0], row[1])

    def list_keys(self) -> list[StoredKey]:
        rows = self._run(
            lambda conn: conn.execute("SELECT record, rate FROM lanefold_keys ORDER BY name").fetchall()
        )
        return [self._parse(record, rate) for record, rate in rows]

    def take_key_rate(self, name: str, tokens: int, requests: int, now: float) -> RateVerdict | None:
        def locked() -> RateVerdict | None:
            try:
                return self._change(name, lambda key, conn: take_rate(key, tokens, requests, now))
            except KeyError:
                return None

        return self._uses.take(self.read_key(name), now, locked)  # a read: no row lock, no commit

    def give_key_rate(self, name: str, tokens: int, now: float) -> None:
        try:
            self._change(name, lambda key, conn: give_rate(key, tokens, now))
        except KeyError:
            return

    def _change(self, name: str, work: Callable[[StoredKey, Any], T]) -> T:
        """`work` on the key's row, held FOR UPDATE, written back in the same transaction
        where it changed it; KeyError where there is no such key."""

        def change(conn: Any) -> T:
            row = conn.execute(
                "SELECT record, rate FROM lanefold_keys WHERE name = %s FOR UPDATE", (name,)
            ).fetchone()
            if row is None:
                raise KeyError(name)
            key = self._parse(row[0], row[1])
            before = key.model_copy(deep=True)
            done = work(key, conn)
            if key == before:
                return done  # nothing to write (the row lock ends with the transaction)
            conn.execute(
                "UPDATE lanefold_keys SET sha256 = %s, record = %s, rate = %s WHERE name = %s",
                (key.record.sha256, key.record.model_dump_json(), key.rate.model_dump_json(), name),
            )
            return done

        return self._run(change)
