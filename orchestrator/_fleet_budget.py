"""The Session's side of `[budget] shared`: a pool per run segment, in the store's database."""

from __future__ import annotations

from typing import Any

from lanefold._config import LoopConfig
from lanefold._pgstore import PgStore
from lanefold.primitives import ConfigError, PgSharedPool

__all__ = ("close_shared_budget", "database_of", "open_shared_budget")


def database_of(store: Any, where: str = "budget.shared") -> Any:
    """The PostgreSQL database of a store (its `url` and `password`); a shared budget lives
    nowhere else."""
    if not isinstance(store, PgStore):
        raise ConfigError(f"{where}: a shared budget lives in a PostgreSQL store: set "
                          f"[store] url in the config or pass --store postgresql://...")
    return store.db


async def open_shared_budget(config: LoopConfig, store: Any, run_id: str) -> PgSharedPool | None:
    """The run's pool in `[budget] shared`, or None when the config names none. An unknown
    budget, or no PostgreSQL store, is a ConfigError naming `budget.shared`."""
    name = config.budget.shared
    if name is None:
        return None
    db = database_of(store)
    return await PgSharedPool.open(db.url, name, run_id, password=db.password)


async def close_shared_budget(pool: PgSharedPool | None) -> None:
    if pool is not None:
        await pool.aclose()
