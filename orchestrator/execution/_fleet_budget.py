"""The pools a run spends from: named budgets in the store (`[budget] shared`, a gateway key's
`key:<name>`), opened per run segment, recorded in `run.started` (`pools`) and rejoined by every
later segment (resume, an idempotent retry, a re-reduction), so a budget holds whoever
continues the run. A run spending from several at once reserves from all or none.

A server keeps them open instead (`StandingPools`): one segment of each budget for the whole
process, opened at its first run and closed with the session, each run a `Share` of it that
counts its own holds. A run then costs the budget a reservation and a settlement, not also an
opening and a closing (each a change under the budget's lock, forced to disk on files), and
the budget lists one segment per process however many of its runs are in flight. A process
that dies leaves its segment's holds to be charged whole, as a dead run segment's are."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from lanefold.config import LoopConfig
from lanefold.primitives import (
    BudgetExhaustedError,
    BudgetStore,
    ConfigError,
    Hold,
    LanefoldError,
    Refusal,
    Room,
    RunError,
    RunState,
    SharedPool,
    check_budget_name,
)

__all__ = (
    "JointPool",
    "Share",
    "StandingPools",
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
    store: Any,
    names: Sequence[str],
    run_id: str,
    *,
    recorded: bool = False,
    standing: StandingPools | None = None,
) -> SharedPool | None:
    """The run segment's side of each budget in `names`, joined (None: none): its own segment,
    or with `standing`, a share of the process's. An unknown budget is a ConfigError: one line
    naming `budget.shared`, or, for `recorded` names, the run that records it."""
    if not names:
        return None
    budgets = budget_store(store, "budget.shared" if not recorded else f"run {run_id}")
    opened: list[SharedPool] = []
    try:
        for name in names:
            try:
                if standing is not None:
                    opened.append(await standing.share(budgets, name, run_id))
                else:
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


class StandingPools:
    """A process's segments of the budgets its runs spend from, each opened at its first run
    and kept until `aclose` (see the module's docstring). At most `keep` stand at once: past
    that, the least recently used with no run in flight is closed (a segment holds a file lock
    on files and a connection on PostgreSQL, so a server whose keys are many must not hold one
    for each). Not shared across event loops."""

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._open: dict[str, SharedPool] = {}  # least recently shared first
        self._using: Counter[str] = Counter()  # runs in flight on each segment
        self._retired: list[SharedPool] = []  # failed segments, closed with the rest
        self._lock = anyio.Lock()

    async def share(self, budgets: BudgetStore, name: str, run_id: str) -> Share:
        """A run's share of budget `name`, its segment opened here if it is not yet (a budget
        that does not exist is the ConfigError `open_shared_pool` raises)."""
        async with self._lock:
            pool = self._open.pop(name, None)
            if pool is None:
                pool = await budgets.open_shared_pool(name, f"{run_id} (standing)")
            self._open[name] = pool  # the most recently shared, last
            self._using[name] += 1
            idle = [n for n in self._open if not self._using[n]][: max(0, len(self._open) - self.keep)]
            for stale in idle:
                with contextlib.suppress(LanefoldError):  # its file or connection let go of anyway
                    await close_pools(self._open.pop(stale))
        return Share(pool, lambda: self._forget(name, pool), lambda: self._done(name))

    def _done(self, name: str) -> None:
        """A run's share of `name` has ended."""
        self._using[name] -= 1
        if self._using[name] <= 0:
            del self._using[name]

    def _forget(self, name: str, pool: SharedPool) -> None:
        """A segment that failed (its budget deleted, or its holds charged as a dead one's)
        is dropped: the next run opens a new one."""
        if self._open.get(name) is pool:
            del self._open[name]
            self._retired.append(pool)  # other runs may still hold shares of it

    async def aclose(self) -> None:
        """Close every segment: what is pending written, its entry taken away (a failed
        one's holder let go of, whatever its store says)."""
        pools, self._open = list(self._open.values()), {}
        retired, self._retired = self._retired, []
        for pool in pools:
            await close_pools(pool)
        for pool in retired:
            with contextlib.suppress(LanefoldError):
                await close_pools(pool)


class Share:
    """One run's part of a standing segment: reservations and settlements go to the segment;
    the holds this run reserved and has not settled are counted here, so that `aclose`
    charges them whole (none, after a run that ended cleanly) and writes what is pending. The
    segment's `exhausted` is as it last saw the budget: a spend reached since elsewhere refuses
    the run's first reservation instead.

    A flush waits for this run's own changes only: one with none noted since its last flush
    (a run's end, after the wave's end wrote its settlements) returns at once rather than
    waiting for the write of the other runs' settlements pending in the segment. Measured
    with 32 runs in flight on one segment (docs/gateway.md): a run's end waited 35 ms at p90
    and 79 ms at p99 for writes that were not its own."""

    def __init__(self, pool: SharedPool, forget: Callable[[], None], done: Callable[[], None]) -> None:
        self.pool, self.name, self._forget = pool, pool.name, forget
        self._ended: Callable[[], None] | None = done  # None once this run's share has ended
        self.exhausted = pool.exhausted
        self._reserved = False  # whether this run has reserved yet: its room is known from then
        self._holds: Counter[Hold] = Counter()  # the holds reserved, not yet settled or released
        self._noted = 0  # changes this run noted in the segment (settled, released, charged)
        self._flushed = 0  # of those, how many a flush of this run's has seen written

    @property
    def room(self) -> Room | None:
        """Unknown (None) until this run's first reservation, as a segment of its own would
        be; then the segment's, as of its last reservation (this run's or another's)."""
        return self.pool.room if self._reserved else None

    @room.setter
    def room(self, value: Room | None) -> None:
        """The room is the segment's to keep."""

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        try:
            refusal = await self.pool.reserve(holds)
        except BaseException as exc:
            self._noted += 1  # a reservation cut short may have been given back: flushed at the end
            if isinstance(exc, (ConfigError, RunError)):
                self._forget()
            raise
        self._reserved = True
        if refusal is None:
            self._holds.update(holds)
        return refusal

    def _done(self, hold: Hold) -> None:
        """`hold` (or one equal to it: equal holds are counted alike) is no longer outstanding."""
        self._noted += 1
        if self._holds[hold] > 1:
            self._holds[hold] -= 1
        else:
            self._holds.pop(hold, None)

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None:
        self._done(hold)
        self.pool.settle(hold, tokens, cost_usd, requests)

    def release(self, hold: Hold) -> None:
        self._done(hold)
        self.pool.release(hold)

    def charge_cut_off(self, hold: Hold) -> None:
        self._done(hold)
        self.pool.charge_cut_off(hold)

    async def flush(self, *, wait: bool = True) -> None:
        noted = self._noted
        if noted == self._flushed:
            return  # what this run noted is down; the others' pending changes are theirs to flush
        try:
            await self.pool.flush(wait=wait)
        except (ConfigError, RunError):
            self._forget()
            raise
        if wait:  # everything noted before the call is written: ours up to `noted`
            self._flushed = max(self._flushed, noted)

    async def aclose(self) -> None:
        """Charge whole the holds this run left outstanding, then write what is pending."""
        left, self._holds = list(self._holds.elements()), Counter()
        self._noted += len(left)
        for hold in left:
            self.pool.charge_cut_off(hold)
        try:
            await self.flush()
        finally:
            ended, self._ended = self._ended, None
            if ended is not None:  # once, however often it is closed
                ended()


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
