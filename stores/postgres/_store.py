"""The run store in PostgreSQL: every machine's runs in one database (`[store] url`).

The password never travels in what is recorded: it comes from the environment variable
`[store] password_env` names (or libpq's own `PGPASSWORD` / `~/.pgpass`), and every place a
URL is printed shows it with its password as `***`.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from lanefold._config import LoopConfig
from lanefold._store import fold_readable, new_run_id
from lanefold.primitives import (
    AnyEvent,
    ConfigError,
    FsyncPolicy,
    PgDatabase,
    PgEventLog,
    RunState,
    validate_run_id,
)

__all__ = ("PgStore",)


class PgStore:
    """Runs in a PostgreSQL database: `lanefold_runs` and `lanefold_events`, one writer per
    run by an advisory lock, `follow` woken by LISTEN/NOTIFY."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    @classmethod
    def from_url(cls, url: str, *, password_env: str | None = None) -> PgStore:
        """A store at `url`; `password_env` names the environment variable with its password
        (needed unless the URL carries one, as a `--store` URL may)."""
        password = None
        if password_env is not None:
            password = os.environ.get(password_env)
            if password is None and urlsplit(url).password is None:
                raise ConfigError(f"store.password_env: the environment variable {password_env} "
                                  f"is not set")
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

    @property
    def describe(self) -> str:
        return self.db.shown

    def read(self, run_id: str) -> tuple[list[AnyEvent], RunState, LoopConfig | None]:
        """A run's events, its state and the config it recorded (`fold_readable`); no lock."""
        events = list(self.reader(run_id).read())
        return (events, *fold_readable(events, self.location(run_id), run_id))

    def read_state(self, run_id: str) -> RunState:
        return self.read(run_id)[1]
