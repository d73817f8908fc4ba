"""Calls that arrive while one is under way run together in the next: a group commit.

A server's standing budget segment takes the reservations of every run in flight; one at a
time, each is a change under the budget's lock with a trip to a worker thread, and 32 runs in
flight wait in line for 32 changes. `Coalesced` runs the first call alone and every call that
arrives meanwhile in one batch after it, each batch's items in arrival order, as if one after
another under the lock (the same outcome, one change).

A batch is run shielded from cancellation (a change once asked for is made; the lock it waits
for is held only by the pool's own changes). A caller cancelled while it waits is taken out of
the batch not yet begun; one whose item was in a batch under way or done gets `undo(item,
result)` called for it (a reservation given back), since nobody will use what was taken.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio

__all__ = ("Coalesced",)

A = TypeVar("A")
R = TypeVar("R")


class _Entry(Generic[A, R]):
    __slots__ = ("abandoned", "done", "error", "item", "result")

    def __init__(self, item: A) -> None:
        self.item = item
        self.done = False
        self.abandoned = False
        self.result: R | None = None
        self.error: BaseException | None = None


class Coalesced(Generic[A, R]):
    """`await coalesced(item)`: `run(items)` (one result per item, in order) for `item` and every
    item asked for while a batch was under way. An exception from `run` is raised to every
    caller of that batch. `undo(item, result)`: a result nobody will take (see the module)."""

    def __init__(
        self, run: Callable[[Sequence[A]], Awaitable[Sequence[R]]], undo: Callable[[A, R], None]
    ) -> None:
        self._run, self._undo = run, undo
        self._waiting: list[_Entry[A, R]] = []
        self._running: anyio.Event | None = None  # set when the batch under way ends

    async def __call__(self, item: A) -> R:
        entry: _Entry[A, R] = _Entry(item)
        self._waiting.append(entry)
        try:
            while not entry.done:
                if self._running is None:
                    await self._batch()
                else:
                    await self._running.wait()
        except BaseException:
            if entry in self._waiting:  # not begun: taken out
                self._waiting.remove(entry)
            elif entry.done:
                if entry.error is None:
                    self._undo(entry.item, entry.result)  # type: ignore[arg-type]
            else:
                entry.abandoned = True  # its batch is under way: undone as it ends
            raise
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]

    async def _batch(self) -> None:
        batch, self._waiting = self._waiting, []
        self._running = running = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                try:
                    results = list(await self._run([entry.item for entry in batch]))
                except BaseException as exc:  # each caller of the batch raises it
                    for entry in batch:
                        entry.error, entry.done = exc, True
                    return
            for entry, result in zip(batch, results, strict=True):
                entry.result, entry.done = result, True
                if entry.abandoned:
                    self._undo(entry.item, result)
        finally:
            self._running = None
            running.set()
