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

A run segment's side of a budget is `FileSharedPool` (`_budget_pool`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from lanefold.primitives import BudgetView, ConfigError, check_budget_name
from lanefold.stores.files._documents import locked_folder, read_document, write_document

__all__ = ("BudgetRecord", "FileBudgets", "HeldRecord")

T = TypeVar("T")
_FOLDER = ".budgets"
_KEEP: Any = object()
# The holder files this process holds the flock of (held id -> the pid that took it; a forked
# child is not its parent): alive by construction, so a sweep need not open and try each one.
# With many runs in flight in one gateway worker, a sweep otherwise tries every run's file at
# every change of the budget.
_HELD_HERE: dict[str, int] = {}


class HeldRecord(BaseModel):
    """One live segment's outstanding holds."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0


class BudgetRecord(BaseModel):
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
    holds: dict[str, HeldRecord] = {}

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

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The budgets' exclusive lock for the block (waits for another holder to finish)."""
        return locked_folder(self.folder, self.folder / "holders", "budgets")

    def path(self, name: str) -> Path:
        return self.folder / f"{check_budget_name(name, 'budget')}.json"

    def read(self, name: str) -> BudgetRecord | None:
        """The budget's file as it stands (hold the lock to change it); None if there is none."""
        return read_document(self.path(name), BudgetRecord, "budget")

    def write(self, budget: BudgetRecord) -> None:
        """Replace the budget's file whole: written beside it, forced to disk, renamed over it."""
        write_document(self.path(budget.name), budget, "budget")

    def sweep(self, budget: BudgetRecord) -> None:
        """Charge whole the holds of segments whose process is gone (their file unlocked)."""
        here = os.getpid()
        for held_id, held in list(budget.holds.items()):
            if _HELD_HERE.get(held_id) == here or self._alive(held_id):  # ours: alive (`holding`)
                continue
            budget.spend(held.tokens, held.cost_usd, held.requests)
            budget.charged_tokens += held.tokens
            budget.charged_cost_usd += held.cost_usd
            budget.charged_requests += held.requests
            del budget.holds[held_id]
            with contextlib.suppress(OSError):
                os.unlink(self.folder / "holders" / held_id)

    @staticmethod
    def holding(held_id: str) -> None:
        """Note that this process holds `held_id`'s flock (call it once taken)."""
        _HELD_HERE[held_id] = os.getpid()

    @staticmethod
    def letting_go(held_id: str) -> None:
        """Note that this process is about to drop `held_id`'s flock (call it before)."""
        _HELD_HERE.pop(held_id, None)

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

    def change(self, name: str, work: Callable[[BudgetRecord], T]) -> T:
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
        """The budget as it stands (dead segments' holds charged first); None if there is none.

        Read without the lock where every segment it lists is alive (a file is replaced whole,
        so a read sees one version): the lock is taken only to charge a dead one's holds. A
        gateway reads its key's budget at every request, and the lock is held by every
        reservation and settlement of every worker."""
        here = os.getpid()
        seen = self.read(name)  # one read, no stat before it
        if seen is None:
            return None
        if all(_HELD_HERE.get(h) == here or self._alive(h) for h in seen.holds):
            return seen.view()
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
            budget = self.read(name) or BudgetRecord(name=check_budget_name(name, "budget"))
            self.sweep(budget)
            for field, value in given.items():
                if value is not _KEEP:
                    setattr(budget, field, value)
            self.write(BudgetRecord.model_validate(budget.model_dump()))  # limits checked as read back
            return budget.view()

    def start_budget(self, name: str, spent: tuple[int, float, int]) -> BudgetView:
        """The budget, created unlimited with `spent` already charged where there is none."""
        with self.locked():
            budget = self.read(name)
            if budget is None:
                budget = BudgetRecord(name=check_budget_name(name, "budget"))
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
