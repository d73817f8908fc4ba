"""The run store in PostgreSQL: every machine's runs in one database (`[store] url`).

The password never travels in what is recorded: it comes from the environment variable
`[store] password_env` names (or libpq's own `PGPASSWORD` / `~/.pgpass`), and every place a
URL is printed shows it with its password as `***`.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from lanefold.primitives import (
    BudgetView,
    ConfigError,
    FsyncPolicy,
    KeyRecord,
    RateVerdict,
    RunSummary,
    StoredKey,
    new_run_id,
    parse_event,
    register_store,
    select_runs,
    summarize_run,
    validate_run_id,
)
from lanefold.stores.postgres._budget import (
    _KEEP,
    PgSharedPool,
    connect_budgets,
    note_refusal,
    read_budget,
    set_budget,
    start_budget,
)
from lanefold.stores.postgres._database import PgDatabase
from lanefold.stores.postgres._evals import PgEvalRecord
from lanefold.stores.postgres._keys import PgKeys
from lanefold.stores.postgres._log import PgEventLog, lock_key

__all__ = ("PgStore",)

# A page of runs, newest first, with each one's first and last event: the LIMIT applies before
# the join, so a page reads its own runs' rows and never the whole table's. `{where}` is the
# filters asked for (`_WHERE`'s fixed clauses, values bound as parameters; none: the plain page
# it always was): what a run's first event says (question, loop, model, caller, its start) and
# its last (answer) are matched here, by the database, through each run's own rows (the events'
# primary key); its status (a writer's lock) after, by `select_runs`, which checks the rest
# again on the summaries.
_HEADS_AND_TAILS = (
    "SELECT r.run_id, f.body, t.body FROM ("
    "   SELECT run_id, created FROM lanefold_runs n"
    "   WHERE true{where}"
    "   ORDER BY created DESC, run_id DESC LIMIT %(limit)s OFFSET %(offset)s) r"
    " JOIN lanefold_events f ON f.run_id = r.run_id AND f.sequence = 1"
    " JOIN LATERAL (SELECT body FROM lanefold_events e WHERE e.run_id = r.run_id"
    "               ORDER BY e.sequence DESC LIMIT 1) t ON true"
    " ORDER BY r.created DESC, r.run_id DESC"
)
_FIRST = "(SELECT body::jsonb FROM lanefold_events f WHERE f.run_id = n.run_id AND f.sequence = 1)"
_LAST = (
    "(SELECT body::jsonb FROM lanefold_events l WHERE l.run_id = n.run_id ORDER BY l.sequence DESC LIMIT 1)"
)
_WHERE = {
    "prefix": " AND starts_with(n.run_id, %(prefix)s::text)",
    "since": " AND n.created >= %(since)s::timestamptz",
    # `created` trails a run's start: the bound is on the start its first event records
    "until": f" AND ({_FIRST} ->> 'time')::timestamptz <= %(until)s::timestamptz",
    "loop": f" AND {_FIRST} #>> '{{data,coordinator}}' = %(loop)s::text",
    # a loop's name also matches its `LOOP/MODEL` runs (as `select_runs` says)
    "model": (
        f" AND ({_FIRST} #>> '{{data,model}}' = %(model)s::text"
        f" OR starts_with({_FIRST} #>> '{{data,model}}', %(model)s::text || '/'))"
    ),
    "caller": f" AND {_FIRST} #>> '{{data,caller}}' = %(caller)s::text",
    "question": f" AND {_FIRST} #>> '{{data,question}}' ILIKE %(question)s::text ESCAPE '\\'",
    "answer": f" AND {_LAST} #>> '{{data,result,answer}}' ILIKE %(answer)s::text ESCAPE '\\'",
}


def contains(text: str) -> str:
    """An ILIKE pattern matching any text that holds `text`: its `%`, `_` and `\\` escaped (so
    a search for `50%` finds `50%`, not every text with `50` in it)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# Runs are created when their first event is written: `created` trails `started` (the writer's
# clock) by the round trip, or by clock skew between machines. A `since` filter reads this
# much earlier in `created`, and `select_runs` then filters on `started` itself.
_SKEW = timedelta(minutes=10)
_BATCH = 200
_WRITERS = (
    "SELECT l.classid::bigint, l.objid::bigint FROM pg_locks l"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
)


@register_store("postgres")
class PgStore:
    """Runs in a PostgreSQL database: `lanefold_runs` and `lanefold_events`, one writer per
    run by an advisory lock, `follow` woken by LISTEN/NOTIFY; shared budgets beside them."""

    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._keys: PgKeys | None = None  # made at first use, not pickled (`__getstate__`)

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process starts from: the database, not this process's keys'
        uses in flight (a lock)."""
        return {**self.__dict__, "_keys": None}

    @classmethod
    def from_url(
        cls, url: str | None, *, runs_dir: str | Path | None = None, password_env: str | None = None
    ) -> PgStore:
        """A store at `url`; `password_env` names the environment variable with its password
        (needed unless the URL carries one, as a `--store` URL may). `runs_dir` is not used."""
        if url is None:
            raise ConfigError("store.url: a postgres store needs a postgresql:// URL")
        password = None
        if password_env is not None:
            password = os.environ.get(password_env)
            if password is None and urlsplit(url).password is None:
                raise ConfigError(f"store.password_env: the environment variable {password_env} is not set")
        return cls(PgDatabase(url, password))

    def new_id(self) -> str:
        return new_run_id()

    def check_id(self, run_id: str) -> str:
        return validate_run_id(run_id)

    def create_log(self, run_id: str, fsync: FsyncPolicy = "barrier") -> PgEventLog:
        return PgEventLog.create(self.db, run_id, fsync=fsync)

    def open_for_resume(self, run_id: str) -> PgEventLog:
        return PgEventLog.open_for_resume(self.db, run_id, fsync="barrier")

    def reader(self, run_id: str) -> PgEventLog:
        return PgEventLog(self.db, run_id)

    def exists(self, run_id: str) -> bool:
        return self.db.exists(validate_run_id(run_id))

    def location(self, run_id: str) -> str:
        return self.db.where(run_id)

    def writing(self, run_id: str) -> bool:
        key = lock_key(validate_run_id(run_id)) & 0xFFFFFFFFFFFFFFFF
        with self.db.reading() as conn:
            locks = {(int(a), int(b)) for a, b in conn.execute(_WRITERS).fetchall()}
        return (key >> 32, key & 0xFFFFFFFF) in locks

    @property
    def describe(self) -> str:
        return self.db.shown

    def eval_record(self, eval_id: str) -> PgEvalRecord:
        return PgEvalRecord(self.db, eval_id)

    def list_evals(self) -> list[str]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT eval_id FROM lanefold_evals ORDER BY created DESC, eval_id DESC"
            ).fetchall()
        return [str(row[0]) for row in rows]

    def portable(self) -> PgStore:
        """The same store for a worker on any machine (it travels with its password)."""
        return self

    def missing(self) -> list[str]:
        if importlib.util.find_spec("psycopg") is None:
            return ["store.url: a postgresql:// store needs psycopg (pip install 'lanefold[scale]')"]
        return []

    def list_runs(
        self,
        *,
        status: str | None = None,
        loop: str | None = None,
        eval_id: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        model: str | None = None,
        caller: str | None = None,
        question: str | None = None,
        answer: str | None = None,
        until: datetime | None = None,
    ) -> list[RunSummary]:
        found: list[RunSummary] = []
        asked = {
            "prefix": None if eval_id is None else eval_id + ".",
            "since": None if since is None else since - _SKEW,
            "until": until,
            "loop": loop,
            "model": model,
            "caller": caller,
            "question": None if question is None else contains(question),
            "answer": None if answer is None else contains(answer),
        }
        given = {k: v for k, v in asked.items() if v is not None}
        query = _HEADS_AND_TAILS.format(where="".join(_WHERE[k] for k in given))

        def pick(limit: int | None) -> list[RunSummary]:
            return select_runs(
                found,
                status=status,
                loop=loop,
                eval_id=eval_id,
                since=since,
                until=until,
                limit=limit,
                model=model,
                caller=caller,
                question=question,
                answer=answer,
            )

        # Pages of runs newest first until `limit` pass the filters (all of them without one).
        batch = _BATCH if limit is None else max(limit + limit // 2, 50)
        offset = 0
        while True:
            with self.db.reading() as conn:
                rows = conn.execute(query, {**given, "limit": batch, "offset": offset}).fetchall()
                locks = {(int(a), int(b)) for a, b in conn.execute(_WRITERS).fetchall()}
            for run_id, head, tail in rows:
                key = lock_key(run_id) & 0xFFFFFFFFFFFFFFFF
                try:
                    summary = summarize_run(
                        parse_event(head), parse_event(tail), writing=(key >> 32, key & 0xFFFFFFFF) in locks
                    )
                except ValueError:  # a row that is not a run's event: `show` names it
                    continue
                if summary is not None:
                    found.append(summary)
            offset += batch
            if len(rows) < batch or (limit is not None and len(pick(None)) >= limit):
                break
            batch *= 2  # the filters keep few of these runs: read further in larger steps
        return pick(limit)

    # -- shared budgets (BudgetStore) ------------------------------------------------------------

    async def open_shared_pool(self, name: str, run_id: str) -> PgSharedPool:
        return await PgSharedPool.open(self.db, name, run_id)

    def read_budget(self, name: str) -> BudgetView | None:
        conn = connect_budgets(self.db)
        try:
            return read_budget(conn, name)
        finally:
            conn.close()

    def set_budget(
        self,
        name: str,
        *,
        max_tokens: int | None = _KEEP,
        max_cost_usd: float | None = _KEEP,
        max_requests: int | None = _KEEP,
    ) -> BudgetView:
        """Create the budget or change its limits (a limit not given keeps its value)."""
        conn = connect_budgets(self.db)
        try:
            return set_budget(
                conn, name, max_tokens=max_tokens, max_cost_usd=max_cost_usd, max_requests=max_requests
            )
        finally:
            conn.close()

    def start_budget(self, name: str, spent: tuple[int, float, int]) -> BudgetView:
        conn = connect_budgets(self.db)
        try:
            return start_budget(conn, name, spent)
        finally:
            conn.close()

    def note_refusal(self, name: str) -> None:
        conn = connect_budgets(self.db)
        try:
            note_refusal(conn, name)
        finally:
            conn.close()

    # -- gateway keys (KeyStore) -----------------------------------------------------------------

    @property
    def keys(self) -> PgKeys:
        """The database's keys: one object for the store's life, so that a key's use being
        recorded is seen by this process's other admissions (`UsesInFlight`)."""
        if self._keys is None:
            self._keys = PgKeys(self.db)
        return self._keys

    def create_key(self, record: KeyRecord) -> StoredKey:
        return self.keys.create_key(record)

    def replace_key(self, record: KeyRecord) -> StoredKey:
        return self.keys.replace_key(record)

    def read_key(self, name: str) -> StoredKey | None:
        return self.keys.read_key(name)

    def list_keys(self) -> list[StoredKey]:
        return self.keys.list_keys()

    def take_key_rate(self, name: str, tokens: int, requests: int, now: float) -> RateVerdict | None:
        return self.keys.take_key_rate(name, tokens, requests, now)

    def give_key_rate(self, name: str, tokens: int, now: float) -> None:
        self.keys.give_key_rate(name, tokens, now)
