"""Named budgets on files: `[budget] shared`, a gateway key's budget and `budget set/show` on the
embedded store, under PostgreSQL's contract (`lanefold.stores.postgres`), across processes.

They live beside the runs, in `<runs>/.budgets/` (no run id starts with a dot):

- `<name>.json`, a budget each: its limits, spent, the part of spent charged for dead segments'
  holds, the requests it refused, and `holds`: each live run segment's outstanding holds.
- `lock`: every change to any budget is made under an exclusive `flock` on it, so a
  reservation is all or nothing across processes; a budget's file is replaced whole (written
  beside it, forced to disk, renamed over it), never left half-written.
- `holders/<id>`: a run segment holds an `flock` on its own file while it lives. The OS drops
  it when the process dies (as it drops a run's writer lock), so whoever next takes the lock
  and finds a segment's file unlocked charges that segment's holds whole, never zero.

A segment's settle, release and charge_cut_off are noted at once (the dispatch path calls them
from synchronous callbacks) and written at its next flush or reserve, in one change; until then
the budget counts the whole hold, so its spend is never understated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lanefold.primitives import (
    BudgetView,
    ConfigError,
    Hold,
    Refusal,
    Room,
    RunError,
    check_budget_name,
    os_failure,
    short_of_room,
)

__all__ = ("FileBudgets", "FileSharedPool")

T = TypeVar("T")
_FOLDER = ".budgets"
_KEEP: Any = object()


class _Held(BaseModel):
    """One live segment's outstanding holds."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0


class _Budget(BaseModel):
    """A budget's file."""

    model_config = ConfigDict(extra="forbid")

    name: str
    max_tokens: int | None = Field(None, ge=0)
    max_cost_usd: float | None = Field(None, ge=0)
    max_requests: int | None = Field(None, ge=0)
    spent_tokens: int = 0
    spent_cost_usd: float = 0.0
    spent_requests: int = 0
    charged_tokens: int = 0
    charged_cost_usd: float = 0.0
    charged_requests: int = 0
    refusals: int = 0
    holds: dict[str, _Held] = {}

    def spend(self, tokens: int, cost_usd: float, requests: int) -> None:
        self.spent_tokens += tokens
        self.spent_cost_usd += cost_usd
        self.spent_requests += requests

    def view(self) -> BudgetView:
        held = self.holds.values()
        return BudgetView(
            self.name,
            self.max_tokens,
            self.max_cost_usd,
            self.max_requests,
            self.spent_tokens,
            self.spent_cost_usd,
            self.spent_requests,
            sum(h.tokens for h in held),
            sum(h.cost_usd for h in held),
            sum(h.requests for h in held),
            self.charged_tokens,
            self.charged_cost_usd,
            self.charged_requests,
            len(self.holds),
            self.refusals,
        )


class FileBudgets:
    """The budgets of one runs folder; every method takes the budgets' lock for its change."""

    def __init__(self, root: str | Path) -> None:
        self.folder = Path(root) / _FOLDER

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The budgets' exclusive lock for the block (waits for another holder to finish)."""
        try:
            (self.folder / "holders").mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise os_failure(f"{self.folder}: cannot open the budgets", exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the flock

    def path(self, name: str) -> Path:
        return self.folder / f"{check_budget_name(name, 'budget')}.json"

    def read(self, name: str) -> _Budget | None:
        """The budget's file as it stands (hold the lock to change it); None if there is none."""
        path = self.path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_failure(f"{path}: cannot read the budget", exc) from None
        try:
            return _Budget.model_validate_json(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "(the document)"
            raise ConfigError(f"{path}: {where}: {error['msg']}") from None

    def write(self, budget: _Budget) -> None:
        """Replace the budget's file whole: written beside it, forced to disk, renamed over it."""
        path = self.path(budget.name)
        draft = path.with_name(f".{path.name}.{os.getpid()}.new")
        try:
            with open(draft, "wb") as f:
                f.write(budget.model_dump_json().encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(draft, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(draft)
            raise os_failure(f"{path}: cannot write the budget", exc) from None

    def sweep(self, budget: _Budget) -> None:
        """Charge whole the holds of segments whose process is gone (their file unlocked)."""
        for held_id, held in list(budget.holds.items()):
            if self._alive(held_id):
                continue
            budget.spend(held.tokens, held.cost_usd, held.requests)
            budget.charged_tokens += held.tokens
            budget.charged_cost_usd += held.cost_usd
            budget.charged_requests += held.requests
            del budget.holds[held_id]
            with contextlib.suppress(OSError):
                os.unlink(self.folder / "holders" / held_id)

    def _alive(self, held_id: str) -> bool:
        try:
            fd = os.open(self.folder / "holders" / held_id, os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # its segment holds it: alive
        finally:
            os.close(fd)
        return False

    def change(self, name: str, work: Callable[[_Budget], T]) -> T:
        """`work` on the budget `name` (dead segments' holds charged first), written back, all
        under the lock; an unknown budget is a ConfigError."""
        with self.locked():
            budget = self.read(name)
            if budget is None:
                raise ConfigError(self.unknown(name))
            self.sweep(budget)
            done = work(budget)
            self.write(budget)
            return done

    def unknown(self, name: str) -> str:
        return (
            f"budget.shared: no budget named {name!r} in {self.folder.parent} (create it with: "
            f"orchestrator budget set {name} --max-tokens N --runs-dir {self.folder.parent})"
        )

    # -- the BudgetStore verbs ---------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """Whether there is a budget `name` (asked before anything is created: an unknown name
        leaves no folder behind)."""
        return self.path(name).is_file()

    def read_budget(self, name: str) -> BudgetView | None:
        """The budget as it stands (dead segments' holds charged first); None if there is none."""
        if not self.exists(name):
            return None
        with self.locked():
            budget = self.read(name)
            if budget is None:
                return None
            if budget.holds:
                before = len(budget.holds)
                self.sweep(budget)
                if len(budget.holds) != before:
                    self.write(budget)
            return budget.view()

    def set_budget(
        self,
        name: str,
        *,
        max_tokens: int | None = _KEEP,
        max_cost_usd: float | None = _KEEP,
        max_requests: int | None = _KEEP,
    ) -> BudgetView:
        """Create a budget or change its limits (a limit not given keeps its value); spent is
        never reset here."""
        given = {"max_tokens": max_tokens, "max_cost_usd": max_cost_usd, "max_requests": max_requests}
        with self.locked():
            budget = self.read(name) or _Budget(name=check_budget_name(name, "budget"))
            self.sweep(budget)
            for field, value in given.items():
                if value is not _KEEP:
                    setattr(budget, field, value)
            self.write(_Budget.model_validate(budget.model_dump()))  # limits checked as read back
            return budget.view()

    def start_budget(self, name: str, spent: tuple[int, float, int]) -> BudgetView:
        """The budget, created unlimited with `spent` already charged where there is none."""
        with self.locked():
            budget = self.read(name)
            if budget is None:
                budget = _Budget(name=check_budget_name(name, "budget"))
                budget.spend(*spent)
                self.write(budget)
            return budget.view()

    def note_refusal(self, name: str) -> None:
        if not self.exists(name):
            return
        with self.locked():
            budget = self.read(name)
            if budget is not None:
                budget.refusals += 1
                self.write(budget)


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
        self.exhausted: str | None = None  # the limit its spend had reached as it opened

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
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    raise os_failure(f"{path}: cannot hold part of budget {name!r}", exc) from None
                try:
                    budget = budgets.read(name)
                    if budget is None:
                        raise ConfigError(budgets.unknown(name))
                    budgets.sweep(budget)
                    budget.holds[held_id] = _Held(run_id=run_id)
                    budgets.write(budget)
                except BaseException:
                    os.close(fd)
                    os.unlink(path)
                    raise
            pool = cls(budgets, name, held_id, fd)
            pool.exhausted = budget.view().exhausted()
            return pool

        return await anyio.to_thread.run_sync(opened)

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

    async def _run(self, work: Callable[[_Budget, _Held], T]) -> T:
        """`work(budget, this segment's holds)` in one change under the budgets' lock, in a
        worker thread, with what is pending written first; if the change fails, it stays
        pending."""
        async with self._lock:
            held, spent = self._held, self._spent
            self._held, self._spent = [0, 0.0, 0], [0, 0.0, 0]

            def change(budget: _Budget) -> T:
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
                return work(budget, mine)

            try:
                return await anyio.to_thread.run_sync(self._budgets.change, self.name, change)
            except BaseException:
                for pending, taken in ((self._held, held), (self._spent, spent)):
                    for i in range(3):
                        pending[i] += taken[i]
                raise

    async def flush(self, *, wait: bool = True) -> None:
        """Write the settlements noted since the last write; `wait=False` skips it while
        another change of this segment's is under way (the next one takes them along)."""
        if self._held == [0, 0.0, 0] and self._spent == [0, 0.0, 0]:
            return
        if not wait and self._lock.locked():
            return
        await self._run(lambda budget, mine: None)

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        """Reserve all of `holds` or none, in one change under the lock."""
        asked = (sum(h.tokens for h in holds), sum(h.cost_usd for h in holds), sum(h.requests for h in holds))

        def reserve(budget: _Budget, mine: _Held) -> tuple[Refusal | None, Room]:
            room = budget.view().room
            short = short_of_room(room, *asked)
            if short is not None:
                return Refusal(*short, room, self.name), room
            mine.tokens += asked[0]
            mine.cost_usd += asked[1]
            mine.requests += asked[2]
            left = (
                None if r is None else r - a for r, a in zip(dataclasses.astuple(room), asked, strict=True)
            )
            return None, Room(*left)

        refusal, self.room = await self._run(reserve)
        return refusal

    async def aclose(self) -> None:
        """Write what is pending, charge any hold still outstanding whole, take the entry away."""

        def close(budget: _Budget, mine: _Held) -> None:
            del budget.holds[self._id]
            budget.spend(max(mine.tokens, 0), max(mine.cost_usd, 0.0), max(mine.requests, 0))

        with anyio.CancelScope(shield=True):
            try:
                await self._run(close)
            finally:
                os.close(self._fd)
                with contextlib.suppress(OSError):
                    os.unlink(self._budgets.folder / "holders" / self._id)
