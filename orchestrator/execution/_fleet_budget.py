"""The Session's side of `[budget] shared`: a pool per run segment, kept by the store."""

from __future__ import annotations

from typing import Any

from lanefold.config import LoopConfig
from lanefold.primitives import BudgetStore, ConfigError, SharedPool

__all__ = ("budget_store", "close_shared_budget", "open_shared_budget")


def budget_store(store: Any, where: str = "budget.shared") -> BudgetStore:
    """`store` where it keeps shared budgets (PostgreSQL's does); a shared budget lives nowhere
    else."""
    if not isinstance(store, BudgetStore):
        raise ConfigError(
            f"{where}: a shared budget lives in a PostgreSQL store: set "
            f"[store] url in the config or pass --store postgresql://..."
        )
    return store


async def open_shared_budget(config: LoopConfig, store: Any, run_id: str) -> SharedPool | None:
    """The run's pool in `[budget] shared`, or None when the config names none. An unknown
    budget, or a store that keeps none, is a ConfigError naming `budget.shared`."""
    name = config.budget.shared
    if name is None:
        return None
    pool: SharedPool = await budget_store(store).open_shared_pool(name, run_id)
    return pool


async def close_shared_budget(pool: Any) -> None:
    if pool is not None:
        await pool.aclose()
