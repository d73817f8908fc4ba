"""A run segment's side of a named budget on files (`FileBudgets`): its holder file, locked while
the segment lives, and its entry in the budget's holds.

settle, release and charge_cut_off are noted at once (the dispatch path calls them from
synchronous callbacks) and written at the segment's next flush or reserve, in one change under
the budgets' lock; until then the budget counts the whole hold, so its spend is never
understated.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import anyio

from lanefold.primitives import (
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
    os_failure,
    reserve_in_turn,
)
from lanefold.stores.files._budget import BudgetRecord, FileBudgets, HeldRecord

__all__ = ("FileSharedPool",)

T = TypeVar("T")


class FileSharedPool:
    """A run segment's side of a budget on files: its own holder file (locked while it lives)
    and its entry in the budget's `holds`.

    Open it with `await FileSharedPool.open(budgets, name, run_id)`; `aclose()` writes what is
    pending, charges any hold left whole (none, after a run that ended cleanly) and takes the
    entry away.
    """

    def __init__(self, budgets: FileBudgets, name: str, held_id: str, fd: int) -> None:
        self.name = name
        self._budgets, self._id, self._fd = budgets, held_id, fd
        self._lock = anyio.Lock()
        self._held: list[Any] = [0, 0.0, 0]  # pending change of this segment's holds
        self._spent: list[Any] = [0, 0.0, 0]  # pending spend to add to the budget
        self.room: Room | None = None  # left at the last reservation, plus what came back since
        self.exhausted: str | None = None  # the limit its spend had reached, as last read
        self._reserving = coalesced_reservations(self, self._take)
        self._flushing = coalesced_flushes(lambda: self._run(lambda budget, mine: None, pending_only=True))

    @classmethod
    async def open(cls, budgets: FileBudgets, name: str, run_id: str) -> FileSharedPool:
        """Take a holder file and an entry in the budget's holds; a budget that does not exist
        is a ConfigError naming `budget.shared`, raised before any dispatch."""
        check_budget_name(name)
        if not budgets.exists(name):  # before anything is made: no folder for an unknown name
            raise ConfigError(budgets.unknown(name))

        def opened() -> FileSharedPool:
            held_id = secrets.token_hex(8)
            with budgets.locked():
                path = budgets.folder / "holders" / held_id
                try:
                    try:
                        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    except FileNotFoundError:  # a folder from before holders had their own
                        path.parent.mkdir(exist_ok=True)
                        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    raise os_failure(f"{path}: cannot hold part of budget {name!r}", exc) from None
                budgets.holding(held_id)
                try:
                    budget = budgets.read(name)
                    if budget is None:
                        raise ConfigError(budgets.unknown(name))
                    budgets.sweep(budget)
                    budget.holds[held_id] = HeldRecord(run_id=run_id)
                    budgets.write(budget)
                except BaseException:
                    budgets.letting_go(held_id)
                    os.close(fd)
                    os.unlink(path)
                    raise
            pool = cls(budgets, name, held_id, fd)
            pool.exhausted = budget.view().exhausted()
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

    def charge_cut_off(self, hold: Hold) -> None:
        self.settle(hold, hold.tokens, hold.cost_usd, hold.requests)

    def _grow(self, tokens: int, cost_usd: float, requests: int) -> None:
        room = self.room
        if room is not None:
            self.room = Room(
                None if room.tokens is None else room.tokens + tokens,
                None if room.cost_usd is None else room.cost_usd + cost_usd,
                None if room.requests is None else room.requests + requests,
            )

    # -- changes -------------------------------------------------------------------------------------

    async def _run(self, work: Callable[[BudgetRecord, HeldRecord], T], *, pending_only: bool = False) -> T:
        """`work(budget, this segment's holds)` in one change under the budgets' lock, off the
        event loop (`offload`), with what is pending written first; if the change fails, it stays
        pending. `pending_only` (a flush, whose `work` returns None): no change if nothing is
        pending once the segment's lock is taken (a change made while waiting took it along)."""
        async with self._lock:
            if pending_only and not self._pending():
                return cast(T, None)
            held, spent = self._held, self._spent
            self._held, self._spent = [0, 0.0, 0], [0, 0.0, 0]

            def change(budget: BudgetRecord) -> T:
                mine = budget.holds.get(self._id)
                if mine is None:  # only a dead segment's entry is taken away
                    raise RunError(
                        f"budget {self.name!r}: this run's holds were charged as a dead "
                        f"segment's (its holder file in {self._budgets.folder} was unlocked)"
                    )
                budget.spend(*spent)
                mine.tokens += held[0]
                mine.cost_usd += held[1]
                mine.requests += held[2]
                done = work(budget, mine)
                self.exhausted = budget.view().exhausted()  # a standing segment's next run reads it
                return done

            try:
                return await offload(self._budgets.change, self.name, change)
            except BaseException:
                for pending, taken in ((self._held, held), (self._spent, spent)):
                    for i in range(3):
                        pending[i] += taken[i]
                raise

    async def flush(self, *, wait: bool = True) -> None:
        """Write the settlements noted since the last write, with those of the segment's
        other runs that flush meanwhile (`coalesced_flushes`); `wait=False` skips it while
        another change of this segment's is under way (the next one takes them along). Else
        what was noted before the call is down when it returns (a change under way that took
        it along is waited for: `flush_pending`)."""
        await flush_pending(self._pending, self._lock, lambda: self._flushing(None), wait=wait)

    def _pending(self) -> bool:
        return self._held != [0, 0.0, 0] or self._spent != [0, 0.0, 0]

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        """Reserve all of `holds` or none, in one change under the lock: with the reservations
        of this segment's other runs asked for meanwhile, one after another (`Coalesced`)."""
        return await self._reserving(tuple(holds))

    async def _take(self, asks: Sequence[tuple[Hold, ...]]) -> list[tuple[Refusal | None, Room]]:
        def reserve(budget: BudgetRecord, mine: HeldRecord) -> list[tuple[Refusal | None, Room]]:
            done, taken = reserve_in_turn(budget.view().room, asks, self.name)
            mine.tokens += taken[0]
            mine.cost_usd += taken[1]
            mine.requests += taken[2]
            return done

        return await self._run(reserve)

    async def aclose(self) -> None:
        """Write what is pending, charge any hold still outstanding whole, take the entry away."""

        def close(budget: BudgetRecord, mine: HeldRecord) -> None:
            del budget.holds[self._id]
            budget.spend(max(mine.tokens, 0), max(mine.cost_usd, 0.0), max(mine.requests, 0))

        with anyio.CancelScope(shield=True):
            try:
                await self._run(close)
            finally:
                self._budgets.letting_go(self._id)
                os.close(self._fd)
                with contextlib.suppress(OSError):
                    os.unlink(self._budgets.folder / "holders" / self._id)
