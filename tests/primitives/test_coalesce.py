"""`Coalesced`: calls that arrive while one is under way run together in the next batch, in
arrival order; a failure reaches every caller of its batch; a caller cancelled before its batch
began is left out, and one cancelled after is undone."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.abc
import pytest

from lanefold.primitives import Coalesced, coalesced_flushes

pytestmark = pytest.mark.anyio


class _Recorded:
    """A batch runner whose i-th batch waits on `gates[i]` (`started[i]` set as it begins),
    recording every batch and every undo."""

    def __init__(self, batches: int = 3) -> None:
        self.batches: list[list[str]] = []
        self.undone: list[tuple[str, str]] = []
        self.gates = [anyio.Event() for _ in range(batches)]
        self.started = [anyio.Event() for _ in range(batches)]
        self.fail: Exception | None = None

    async def run(self, items: Sequence[str]) -> list[str]:
        i = len(self.batches)
        self.batches.append(list(items))
        self.started[i].set()
        await self.gates[i].wait()
        if self.fail is not None:
            raise self.fail
        return [item.upper() for item in items]

    def undo(self, item: str, result: str) -> None:
        self.undone.append((item, result))


async def _first_then(
    tg: anyio.abc.TaskGroup, call: Callable[[str], Awaitable[None]], runner: _Recorded, later: str
) -> None:
    """`call("a")`, and once its batch is under way, `call` for each of `later`, in this order
    (10 ms apart: each asks while the first batch runs)."""
    tg.start_soon(call, "a")
    await runner.started[0].wait()
    for item in later:
        tg.start_soon(call, item)
        await anyio.sleep(0.01)


async def test_calls_made_while_a_batch_runs_go_together_in_the_next_in_order() -> None:
    runner = _Recorded()
    coalesced = Coalesced(runner.run, runner.undo)
    got: dict[str, str] = {}

    async def call(item: str) -> None:
        got[item] = await coalesced(item)

    async with anyio.create_task_group() as tg:
        await _first_then(tg, call, runner, "bcd")
        runner.gates[0].set()
        runner.gates[1].set()
    assert runner.batches == [["a"], ["b", "c", "d"]]
    assert got == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert runner.undone == []


async def test_a_failed_batch_raises_to_each_of_its_callers_and_the_next_batch_runs() -> None:
    runner = _Recorded()
    coalesced = Coalesced(runner.run, runner.undo)
    runner.fail = ValueError("the store is gone")
    errors: list[str] = []

    async def call(item: str) -> None:
        try:
            await coalesced(item)
        except ValueError as exc:
            errors.append(f"{item}: {exc}")

    async with anyio.create_task_group() as tg:
        await _first_then(tg, call, runner, "bc")
        runner.gates[0].set()
        runner.gates[1].set()
    assert runner.batches == [["a"], ["b", "c"]]
    assert sorted(errors) == ["a: the store is gone", "b: the store is gone", "c: the store is gone"]
    runner.fail = None
    runner.gates[2].set()
    assert await coalesced("d") == "D"  # the next call runs a batch of its own


async def test_a_caller_cancelled_before_its_batch_began_is_left_out_of_it() -> None:
    runner = _Recorded()
    coalesced = Coalesced(runner.run, runner.undo)
    async with anyio.create_task_group() as tg:
        tg.start_soon(coalesced, "a")
        await runner.started[0].wait()
        with anyio.move_on_after(0.01) as waited:  # waits behind "a", then gives up
            await coalesced("b")
        assert waited.cancelled_caught
        tg.start_soon(coalesced, "c")
        await anyio.sleep(0.01)
        runner.gates[0].set()
        runner.gates[1].set()
    assert runner.batches == [["a"], ["c"]]
    assert runner.undone == []


async def test_a_caller_cancelled_while_its_batch_runs_gets_its_result_undone() -> None:
    """The batch is shielded (a change asked for is made); what it took for a caller that went
    away is handed to `undo` (a reservation given back), and the others get theirs."""
    runner = _Recorded()
    coalesced = Coalesced(runner.run, runner.undo)
    got: dict[str, str] = {}
    scopes: dict[str, anyio.CancelScope] = {}

    async def call(item: str) -> None:
        with anyio.CancelScope() as scopes[item]:
            got[item] = await coalesced(item)

    async with anyio.create_task_group() as tg:
        await _first_then(tg, call, runner, "bcd")
        runner.gates[0].set()
        await runner.started[1].wait()  # "b", "c" and "d" under way together
        # Two callers go away while the batch runs. One of the three runs it (which one is
        # the event loop's choice: trio shuffles); a runner cancelled then still completes it
        # and may take its result as it returns. Every other caller that went away is undone.
        scopes["b"].cancel()
        scopes["d"].cancel()
        await anyio.sleep(0.01)
        runner.gates[1].set()
    assert runner.batches == [["a"], ["b", "c", "d"]]
    assert got["a"] == "A" and got["c"] == "C"
    for item in "bd":  # taken or given back, never both, never neither
        assert (item in got) != ((item, item.upper()) in runner.undone), (got, runner.undone)
    assert runner.undone, "at most one of the two ran the batch: the other was undone"


async def test_flushes_asked_for_during_a_write_make_one_write_after_it() -> None:
    """`coalesced_flushes`: 8 runs flush while a write is under way; one write after it takes
    all of their settlements (noted before they asked), and each returns only after it."""
    pending: list[int] = []
    written: list[list[int]] = []
    gate, begun = anyio.Event(), anyio.Event()

    async def write() -> None:
        taken = pending[:]
        pending.clear()
        if not written:  # the first write holds until the others have asked
            begun.set()
            await gate.wait()
        written.append(taken)

    flush = coalesced_flushes(write)
    returned: list[tuple[int, int]] = []  # (run, writes made when it returned)

    async def run_ends(run: int) -> None:
        pending.append(run)  # its settlement, noted
        await flush(None)
        returned.append((run, len(written)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_ends, 0)
        await begun.wait()
        for run in range(1, 9):
            tg.start_soon(run_ends, run)
            await anyio.sleep(0.005)
        gate.set()
    assert written == [[0], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert sorted(returned) == [(0, 1)] + [(run, 2) for run in range(1, 9)]
