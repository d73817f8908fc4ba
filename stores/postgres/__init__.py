"""Runs in PostgreSQL (`[store] url`, `--store postgresql://...`): the event log, the run store
and shared budgets over one connection layer (`PgDatabase`). psycopg (the `scale` extra) is
imported when first used."""

from lanefold.stores.postgres._budget import (
    PgSharedPool,
    connect_budgets,
    note_refusal,
    read_budget,
    set_budget,
    start_budget,
)
from lanefold.stores.postgres._database import PgDatabase, redact_url
from lanefold.stores.postgres._evals import PgEvalRecord
from lanefold.stores.postgres._keys import PgKeys
from lanefold.stores.postgres._log import PgEventLog
from lanefold.stores.postgres._store import PgStore

__all__ = (
    "PgDatabase",
    "PgEvalRecord",
    "PgEventLog",
    "PgKeys",
    "PgSharedPool",
    "PgStore",
    "connect_budgets",
    "note_refusal",
    "read_budget",
    "redact_url",
    "set_budget",
    "start_budget",
)
