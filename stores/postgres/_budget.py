"""One budget for a fleet: a named budget in PostgreSQL that every run naming it spends from.

Two tables, beside the run store's in the same database: `lanefold_budgets` (a row per name: limits,
spent, how much of spent was charged for dead workers' holds, and the requests refused) and
`lanefold_budget_holds` (a row per run segment spending from a budget: its outstanding holds and
the PostgreSQL backend that owns them).

- reserve is one transaction: lock the budget's row (`SELECT ... FOR UPDATE`), charge the
  holds of dead owners, write this run's pending settlements, then add the asked holds to this
  run's row only if `spent + held + asked` stays within every limit.
- settle, release and charge_cut_off are noted at once (the dispatch path calls them from
  synchronous callbacks) and written at the next flush or reserve, in one transaction. Until
  then the store still counts the whole hold, so the fleet's spend is never understated.
- a dead owner is a hold row whose backend is gone from `pg_stat_activity`: its connection died
  with its process. Whoever next reserves (or `budget show`) charges its holds whole to spent,
  as the file ledger charges an attempt a crash cut off: never zero.

The connection is psycopg's synchronous one, driven off the event loop (`offload`: a worker
thread, unless the request is the only one its server serves) under a lock, so it works the
same under asyncio and trio and an event loop with other work never waits on the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import anyio

from lanefold.primitives import (
    BudgetView,
    ConfigError,
    Hold,
    Refusal,
    Room,
    RunError,
    check_budget_name,
    coalesced_flushes,
    coalesced_reservations,
    flush_pending,
    offload,
    reserve_in_turn,
)
from lanefold.stores.postgres._database import PgDatabase, psycopg_module

__all__ = (
    "PgSharedPool",
    "connect_budgets",
    "note_refusal",
    "read_budget",
    "set_budget",
    "start_budget",
)

T = TypeVar("T")
_SCHEMA_LOCK = 0x1A7EF01D  # serialises CREATE TABLE IF NOT EXISTS across processes
_SCHEMA = """
CREATE TABLE IF NOT EXISTS lanefold_budgets (
    name text PRIMARY KEY,
    max_tokens bigint, max_cost_usd double precision, max_requests bigint,
    spent_tokens bigint NOT NULL DEFAULT 0,
    spent_cost_usd double precision NOT NULL DEFAULT 0,
    spent_requests bigint NOT NULL DEFAULT 0,
    charged_tokens bigint NOT NULL DEFAULT 0,
    charged_cost_usd double precision NOT NULL DEFAULT 0,
    charged_requests bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lanefold_budget_holds (
    id bigserial PRIMARY KEY,
    name text NOT NULL REFERENCES lanefold_budgets (name) ON DELETE CASCADE,
    run_id text NOT NULL,
    pid integer NOT NULL,
    backend_start timestamptz,
    tokens bigint NOT NULL DEFAULT 0,
    cost_usd double precision NOT NULL DEFAULT 0,
    requests bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS budget_holds_name ON lanefold_budget_holds (name);
ALTER TABLE lanefold_budgets ADD COLUMN IF NOT EXISTS refusals bigint NOT NULL DEFAULT 0;
"""
# Whether the tables are there, as this version writes them (an older store lacks `refusals`).
_READY = """SELECT to_regclass('lanefold_budget_holds') IS NOT NULL AND EXISTS (SELECT 1 FROM
    information_schema.columns WHERE table_name = 'lanefold_budgets' AND column_name = 'refusals')"""
# Holds whose backend is gone (pid reuse is ruled out by the backend's start time, where the
# role may see it) are charged whole.
_SWEEP = """
WITH dead AS (
    DELETE FROM lanefold_budget_holds h WHERE h.name = %(name)s AND NOT EXISTS (
        SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.pid AND (
            a.backend_start IS NULL OR h.backend_start IS NULL
            OR a.backend_start = h.backend_start))
    RETURNING tokens, cost_usd, requests)
UPDATE lanefold_budgets SET
    spent_tokens = spent_tokens + d.t, spent_cost_usd = spent_cost_usd + d.c,
    spent_requests = spent_requests + d.r, charged_tokens = charged_tokens + d.t,
    charged_cost_usd = charged_cost_usd + d.c, charged_requests = charged_requests + d.r
FROM (SELECT coalesce(sum(tokens), 0)::bigint AS t, coalesce(sum(cost_usd), 0) AS c,
             coalesce(sum(requests), 0)::bigint AS r, count(*) AS n FROM dead) d
WHERE name = %(name)s AND d.n > 0
"""
_HELD = """SELECT coalesce(sum(tokens), 0)::bigint, coalesce(sum(cost_usd), 0),
    coalesce(sum(requests), 0)::bigint, count(*) FROM lanefold_budget_holds WHERE name = %s"""
_LOCK = """SELECT max_tokens, max_cost_usd, max_requests, spent_tokens, spent_cost_usd,
    spent_requests, charged_tokens, charged_cost_usd, charged_requests, refusals
    FROM lanefold_budgets WHERE name = %s FOR UPDATE"""


def connect_budgets(db: PgDatabase) -> Any:
    """A connection of the store's own (autocommit; transactions are explicit) with the budget
    tables in place.

    The server learns of a dead peer on another machine through TCP keepalives: ask for them
    often, so a dead worker's holds are charged within a minute, not hours.
    """
    conn = db.connect(name="lanefold-budget")
    try:
        with conn.transaction():
            conn.execute(
                "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3"
            )
            row = conn.execute(_READY).fetchone()
            if row is None or not row[0]:  # the first worker to come creates (or updates) the tables
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(_SCHEMA)
    except psycopg_module().Error as exc:
        conn.close()
        raise RunError(f"store {db.shown}: {_first_line(exc)}") from None
    return conn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _view(conn: Any, name: str) -> BudgetView | None:
    """The budget, after charging dead owners' holds (inside the caller's transaction)."""
    row = conn.execute(_LOCK, (name,)).fetchone()
    if row is None:
        return None
    conn.execute(_SWEEP, {"name": name})
    row = conn.execute(_LOCK, (name,)).fetchone()
    held = conn.execute(_HELD, (name,)).fetchone()
    return BudgetView(
        name,
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        held[0],
        held[1],
        held[2],
        row[6],
        row[7],
        row[8],
        held[3],
        row[9],
    )


def read_budget(conn: Any, name: str) -> BudgetView | None:
    """A budget as it stands (dead owners' holds charged first); None if there is none."""
    with conn.transaction():
        return _view(conn, name)


_KEEP: Any = object()


def set_budget(
    conn: Any,
    name: str,
    *,
    max_tokens: int | None = _KEEP,
    max_cost_usd: float | None = _KEEP,
    max_requests: int | None = _KEEP,
) -> BudgetView:
    """Create a budget or change its limits (a limit not given keeps its value; a new budget
    is unlimited where none is given). Spent is never reset here."""
    check_budget_name(name, "budget")
    given = {"max_tokens": max_tokens, "max_cost_usd": max_cost_usd, "max_requests": max_requests}
    with conn.transaction():
        conn.execute("INSERT INTO lanefold_budgets (name) VALUES (%s) ON CONFLICT DO NOTHING", (name,))
        for column, value in given.items():
            if value is not _KEEP:  # column names come from the dict above, never from input
                conn.execute(f"UPDATE lanefold_budgets SET {column} = %s WHERE name = %s", (value, name))
        view = _view(conn, name)
    assert view is not None
    return view


def start_budget(conn: Any, name: str, spent: tuple[int, float, int]) -> BudgetView:
    """The budget `name`, created unlimited with `spent` already charged where there is none;
    else as it stands (a concurrent creator's row wins: one transaction, ON CONFLICT)."""
    check_budget_name(name, "budget")
    with conn.transaction():
        conn.execute(
            "INSERT INTO lanefold_budgets (name, spent_tokens, spent_cost_usd, spent_requests) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (name, *spent),
        )
        view = _view(conn, name)
    assert view is not None
    return view


def note_refusal(conn: Any, name: str) -> None:
    """Count one request the budget refused (no row: nothing to count)."""
    with conn.transaction():
        conn.execute("UPDATE lanefold_budgets SET refusals = refusals + 1 WHERE name = %s", (name,))


class PgSharedPool:
    """A run segment's side of a shared budget: one row of holds, one connection.

    Open it with `await PgSharedPool.open(db, name, run_id)`; `aclose()` writes what is
    pending, charges any hold left (none, after a run that ended cleanly) and drops the row.
    """

    def __init__(self, conn: Any, name: str, row_id: int) -> None:
        self.name = name
        self._conn, self._row = conn, row_id
        self._lock = anyio.Lock()
        self._held = [0, 0.0, 0]  # pending change of this row's holds (tokens, cost, requests)
        self._spent = [0, 0.0, 0]  # pending spend to add to the budget
        self.room: Room | None = None  # left at the last reservation, plus what came back since
        self.exhausted: str | None = None  # the limit its spend had reached, as last read
        self._reserving = coalesced_reservations(self, self._take)
        self._flushing = coalesced_flushes(self._write_pending)

    @classmethod
    async def open(cls, db: PgDatabase, name: str, run_id: str) -> PgSharedPool:
        """Connect and take a row of holds; a budget that does not exist is a ConfigError
        naming `budget.shared`, raised before any dispatch."""
        check_budget_name(name)

        def opened() -> PgSharedPool:
            conn = connect_budgets(db)
            try:
                with conn.transaction():
                    view = _view(conn, name)
                    if view is None:
                        raise ConfigError(
                            f"budget.shared: no budget named {name!r} in {db.shown} (create "
                            f"it with: orchestrator budget set {name} --max-tokens N --store URL)"
                        )
                    row = conn.execute(
                        "INSERT INTO lanefold_budget_holds (name, run_id, pid, backend_start) "
                        "SELECT %s, %s, pg_backend_pid(), (SELECT backend_start FROM "
                        "pg_stat_activity WHERE pid = pg_backend_pid()) RETURNING id",
                        (name, run_id),
                    ).fetchone()
            except BaseException:
                conn.close()
                raise
            pool = cls(conn, name, int(row[0]))
            pool.exhausted = view.exhausted()
            return pool

        return await offload(opened)

    # -- noted now, written at the next flush or reserve -------------------------------------------

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None:
        self.release(hold)
        self._spent[0] += tokens
        self._spent[1] += cost_usd
        self._spent[2] += requests
        self._grow(-tokens, -cost_usd, -requests)

    def release(self, hold: Hold) -> None:
        self._held[0] -= hold.tokens
        self._held[1] -= hold.cost_usd
        self._held[2] -= hold.requests
        self._grow(hold.tokens, hold.cost_usd, hold.requests)

    def _grow(self, tokens: int, cost_usd: float, requests: int) -> None:
        room = self.room
        if room is not None:
            self.room = Room(
                None if room.tokens is None else room.tokens + tokens,
                None if room.cost_usd is None else room.cost_usd + cost_usd,
                None if room.requests is None else room.requests + requests,
            )

    def charge_cut_off(self, hold: Hold) -> None:
        self.settle(hold, hold.tokens, hold.cost_usd, hold.requests)

    # -- transactions ------------------------------------------------------------------------------

    async def _run(self, work: Callable[[Any, list[Any], list[Any]], T], *, pending_only: bool = False) -> T:
        """Run `work(conn, held, spent)` in one transaction off the event loop, with what is
        pending handed over; if the transaction fails, it stays pending. `pending_only` (a
        flush, whose `work` returns None): no transaction if nothing is pending once the
        segment's lock is taken (one made while waiting took it along)."""
        async with self._lock:
            if pending_only and not self._pending():
                return cast(T, None)
            held, spent = self._held, self._spent
            self._held, self._spent = [0, 0.0, 0], [0, 0.0, 0]
            psycopg = psycopg_module()

            def transaction() -> T:
                with self._conn.transaction():
                    return work(self._conn, held, spent)

            try:
                return await offload(transaction)
            except BaseException as exc:
                for pending, taken in ((self._held, held), (self._spent, spent)):
                    for i in range(3):
                        pending[i] += taken[i]
                if isinstance(exc, psycopg.Error):
                    raise RunError(f"shared budget {self.name!r}: {_first_line(exc)}") from None
                raise

    def _write(self, conn: Any, held: list[Any], spent: list[Any]) -> None:
        conn.execute(
            "UPDATE lanefold_budgets SET spent_tokens = spent_tokens + %s, spent_cost_usd = "
            "spent_cost_usd + %s, spent_requests = spent_requests + %s WHERE name = %s",
            (*spent, self.name),
        )
        row = conn.execute(
            "UPDATE lanefold_budget_holds SET tokens = tokens + %s, cost_usd = cost_usd + "
            "%s, requests = requests + %s WHERE id = %s RETURNING id",
            (*held, self._row),
        ).fetchone()
        if row is None:  # only a dead owner's row is taken away: the connection was lost
            raise RunError(
                f"shared budget {self.name!r}: this run's holds were charged as a "
                f"dead worker's (its connection to the store was lost)"
            )

    async def flush(self, *, wait: bool = True) -> None:
        """Write the settlements noted since the last write, with those of the segment's
        other runs that flush meanwhile (`coalesced_flushes`). `wait=False` (after each backend
        request) skips it while another write is under way: lanes landing together then share
        one round trip, and what is left goes with the next write (the wave's end waits). Else
        what was noted before the call is down when it returns (a write under way that took it
        along is waited for: `flush_pending`)."""
        await flush_pending(self._pending, self._lock, lambda: self._flushing(None), wait=wait)

    def _pending(self) -> bool:
        return self._held != [0, 0.0, 0] or self._spent != [0, 0.0, 0]

    async def _write_pending(self) -> None:
        def write(conn: Any, held: list[Any], spent: list[Any]) -> None:
            conn.execute(_LOCK, (self.name,))  # the budget row first, as reserve locks it
            self._write(conn, held, spent)

        await self._run(write, pending_only=True)

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        """Reserve all of `holds` or none, in one transaction: with the reservations of this
        segment's other runs asked for meanwhile, one after another (`Coalesced`)."""
        return await self._reserving(tuple(holds))

    async def _take(self, asks: Sequence[tuple[Hold, ...]]) -> list[tuple[Refusal | None, Room]]:
        def reserve(conn: Any, held: list[Any], spent: list[Any]) -> list[tuple[Refusal | None, Room]]:
            self._write(conn, held, spent)
            view = _view(conn, self.name)
            if view is None:
                raise RunError(f"shared budget {self.name!r}: deleted while in use")
            self.exhausted = view.exhausted()  # a standing segment's next run reads it
            done, taken = reserve_in_turn(view.room, asks, self.name)
            if taken != (0, 0.0, 0):
                conn.execute(
                    "UPDATE lanefold_budget_holds SET tokens = tokens + %s, cost_usd = cost_usd + %s,"
                    " requests = requests + %s WHERE id = %s",
                    (*taken, self._row),
                )
            return done

        return await self._run(reserve)

    async def aclose(self) -> None:
        """Write what is pending, charge any hold still outstanding whole, drop the row."""

        def close(conn: Any, held: list[Any], spent: list[Any]) -> None:
            conn.execute(_LOCK, (self.name,))
            self._write(conn, held, spent)
            left = conn.execute(
                "DELETE FROM lanefold_budget_holds WHERE id = %s RETURNING tokens, cost_usd, requests",
                (self._row,),
            ).fetchone()
            if left is not None and (left[0] > 0 or left[2] > 0 or left[1] > 1e-9):
                conn.execute(
                    "UPDATE lanefold_budgets SET spent_tokens = spent_tokens + %s, "
                    "spent_cost_usd = spent_cost_usd + %s, spent_requests = "
                    "spent_requests + %s WHERE name = %s",
                    (max(left[0], 0), max(left[1], 0.0), max(left[2], 0), self.name),
                )

        with anyio.CancelScope(shield=True):
            try:
                await self._run(close)
            finally:
                await anyio.to_thread.run_sync(self._conn.close)
