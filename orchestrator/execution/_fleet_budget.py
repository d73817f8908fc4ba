"""The pools a run spends from: named budgets in the store (`[budget] shared`, a gateway key's
`key:<name>`), opened per run segment, recorded in `run.started` (`pools`) and rejoined by every
later segment (resume, an idempotent retry, a re-reduction), so a budget holds whoever
continues the run. A run spending from several at once reserves from all or none."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import anyio

from lanefold.config import LoopConfig
from lanefold.primitives import (
    BudgetExhaustedError,
    BudgetStore,
    ConfigError,
    Hold,
    Refusal,
    Room,
    RunState,
    SharedPool,
    check_budget_name,
)

__all__ = (
    "JointPool",
    "budget_store",
    "close_pools",
    "open_pools",
    "pool_parts",
    "recorded_pools",
    "refuse_if_spent",
    "run_pools",
)


def budget_store(store: Any, where: str = "budget.shared") -> BudgetStore:
    """`store` where it keeps named budgets (both built-in stores do)."""
    if not isinstance(store, BudgetStore):
        raise ConfigError(
            f"{where}: the store {getattr(store, 'describe', store)} keeps no named budgets "
            f"(the files and PostgreSQL stores do)"
        )
    return store


def run_pools(config: LoopConfig, given: Sequence[str] = ()) -> tuple[str, ...]:
    """The budgets a new run spends from: its config's `[budget] shared`, then `given` (a
    gateway key's), each once."""
    names = [config.budget.shared] if config.budget.shared is not None else []
    names += [check_budget_name(name, "pools") for name in given]
    return tuple(dict.fromkeys(names))


def recorded_pools(state: RunState, config: LoopConfig) -> tuple[str, ...]:
    """The budgets a run was started under, as its `run.started` names them; a log from before
    they were recorded spends from its config's `[budget] shared` alone."""
    started = state.started
    if started is not None and started.pools is not None:
        return tuple(started.pools)
    return run_pools(config)


async def open_pools(
    store: Any, names: Sequence[str], run_id: str, *, recorded: bool = False
) -> SharedPool | None:
    """The run segment's side of each budget in `names`, joined (None: none). An unknown
    budget is a ConfigError: one line naming `budget.shared`, or, for `recorded` names, the
    run that records it."""
    if not names:
        return None
    budgets = budget_store(store, "budget.shared" if not recorded else f"run {run_id}")
    opened: list[SharedPool] = []
    try:
        for name in names:
            try:
                opened.append(await budgets.open_shared_pool(name, run_id))
            except ConfigError:
                if not recorded:
                    raise
                raise ConfigError(
                    f"run {run_id}: its run.started names budget {name!r}, which "
                    f"{getattr(store, 'describe', store)} does not keep (create it with: "
                    f"orchestrator budget set {name} --max-tokens N)"
                ) from None
    except BaseException:
        await close_pools(opened[0] if len(opened) == 1 else JointPool(opened) if opened else None)
        raise
    return opened[0] if len(opened) == 1 else JointPool(opened)


def pool_parts(pool: SharedPool | None) -> tuple[SharedPool, ...]:
    if pool is None:
        return ()
    if isinstance(pool, JointPool):
        return pool.pools
    return (pool,)


def _spent(pool: SharedPool | None) -> tuple[str, str] | None:
    """The first budget whose spend had reached one of its limits as it opened, if any."""
    for part in pool_parts(pool):
        if part.exhausted is not None:
            return part.name, part.exhausted
    return None


async def refuse_if_spent(store: Any, pool: SharedPool | None, what: str) -> None:
    """Refuse (BudgetExhaustedError, exit 3) a segment one of whose budgets is spent, before it
    records anything, and count the refusal on that budget."""
    found = _spent(pool)
    if found is None:
        return
    name, limit = found
    await anyio.to_thread.run_sync(budget_store(store).note_refusal, name)
    raise BudgetExhaustedError(f"budget {name!r} is spent ({limit}): {what}")


async def close_pools(pool: SharedPool | None) -> None:
    """Close each pool of a segment: what is pending written, any hold left charged whole."""
    with anyio.CancelScope(shield=True):
        for part in pool_parts(pool):
            aclose = getattr(part, "aclose", None)
            if aclose is not None:
                await aclose()


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
        fields = dataclasses.fields(Room)
        return Room(*(_least_of([getattr(r, f.name) for r in rooms]) for f in fields))

    @room.setter
    def room(self, value: Room | None) -> None:
        """The room is each pool's to keep (a ledger never sets it)."""

    @property
    def exhausted(self) -> str | None:
        return next((p.exhausted for p in self.pools if p.exhausted is not None), None)

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        taken: list[SharedPool] = []
        try:
            for pool in self.pools:
                refusal = await pool.reserve(holds)
                if refusal is not None:
                    self._give_back(taken, holds)
                    return refusal if refusal.pool else dataclasses.replace(refusal, pool=pool.name)
                taken.append(pool)
        except BaseException:
            self._give_back(taken, holds)  # all or none, whatever stopped it
            raise
        return None

    @staticmethod
    def _give_back(taken: list[SharedPool], holds: Sequence[Hold]) -> None:
        for back in taken:
            for hold in holds:
                back.release(hold)

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


def _least_of(values: list[Any]) -> Any:
    out = None
    for value in values:
        out = _least(out, value)
    return out
