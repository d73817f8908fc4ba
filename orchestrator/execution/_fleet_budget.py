"""The Session's side of `[budget] shared`: a pool per run segment, kept by the store; and a
run spending from two pools at once (its config's and a gateway key's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lanefold.config import LoopConfig
from lanefold.primitives import BudgetStore, ConfigError, Hold, Refusal, Room, SharedPool

__all__ = ("JointPool", "budget_store", "close_shared_budget", "joint_pool", "open_shared_budget")


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


async def close_shared_budget(pool: Any, *, keep: Any = None) -> None:
    """Close `pool`, a pool the run opened (or a JointPool of one it opened and `keep`, which
    its caller owns: flushed, never closed)."""
    if isinstance(pool, JointPool):
        for part in pool.pools:
            if part is keep:
                await part.flush()
            else:
                await close_shared_budget(part)
    elif pool is keep and pool is not None:
        await pool.flush()
    elif pool is not None:
        await pool.aclose()


def joint_pool(own: SharedPool | None, given: SharedPool | None) -> SharedPool | None:
    """One pool for a run spending from both (either may be None)."""
    if own is None or given is None:
        return own or given
    return JointPool((own, given))


def _least(a: int | float | None, b: int | float | None) -> Any:
    return b if a is None else a if b is None else min(a, b)


class JointPool:
    """Pools a run spends from at once: a reservation is taken from every one or none; the
    room is the least of theirs."""

    def __init__(self, pools: Sequence[SharedPool]) -> None:
        self.pools = tuple(pools)
        self.name = "+".join(p.name for p in self.pools)

    @property
    def room(self) -> Room | None:
        rooms = [p.room for p in self.pools if p.room is not None]
        if not rooms:
            return None
        return Room(*(_least_of([getattr(r, f.name) for r in rooms]) for f in dataclasses.fields(Room)))

    @room.setter
    def room(self, value: Room | None) -> None:
        """The room is each pool's to keep (a ledger never sets it)."""

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        taken: list[SharedPool] = []
        for pool in self.pools:
            refusal = await pool.reserve(holds)
            if refusal is not None:
                for back in taken:  # all or none
                    for hold in holds:
                        back.release(hold)
                return refusal
            taken.append(pool)
        return None

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None:
        for pool in self.pools:
            pool.settle(hold, tokens, cost_usd, requests)

    def release(self, hold: Hold) -> None:
        for pool in self.pools:
            pool.release(hold)

    def charge_cut_off(self, hold: Hold) -> None:
        for pool in self.pools:
            pool.charge_cut_off(hold)

    async def flush(self, *, wait: bool = True) -> None:
        for pool in self.pools:
            await pool.flush(wait=wait)

    async def aclose(self) -> None:
        for pool in self.pools:
            aclose = getattr(pool, "aclose", None)
            if aclose is not None:
                await aclose()


def _least_of(values: list[Any]) -> Any:
    out = None
    for value in values:
        out = _least(out, value)
    return out
