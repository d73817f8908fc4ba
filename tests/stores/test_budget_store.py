"""Named budgets, one contract on every store (issue 38): the files store keeps them beside the
runs under an OS lock, PostgreSQL in its tables, and both reserve all or nothing, mirror the
ledger, charge a dead segment's holds whole, seed a new budget, count refusals, and make every
later segment of a run (a resume, a re-reduction) spend from the budgets it was started under."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.primitives import (
    BudgetExhaustedError,
    BudgetStore,
    ConfigError,
    Event,
    Hold,
    Ledger,
    Limits,
    LogWriteError,
    Pricing,
    Store,
    Usage,
)

PRICING = Pricing(input_per_mtok=1.0, output_per_mtok=2.0)
ROOT = Path(__file__).resolve().parents[2]


def _hold(prompt: int, out: int, requests: int = 1) -> Hold:
    return Hold(Usage(prompt, 0, out), (prompt * 1.0 + out * 2.0) * 1e-6, requests, "sample")


def _budgets(store: Store) -> BudgetStore:
    assert isinstance(store, BudgetStore), store
    return store


def _name(store: Store, base: str) -> str:
    """One database serves every PostgreSQL test: a name of the test's own."""
    return f"{base}.{os.urandom(4).hex()}"


@pytest.mark.anyio
async def test_reserve_settle_release_mirror_the_ledger(store: Store) -> None:
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=1000, max_requests=10)
    pool = await budgets.open_shared_pool(name, "run-a")
    assert pool.room is None and pool.exhausted is None  # room: as of its first reservation
    ledger = Ledger(Limits(), PRICING, shared=pool)
    try:
        holds = [_hold(100, 200), _hold(0, 200, 0), _hold(0, 200, 0)]
        assert ledger.try_reserve(holds) is None
        assert await pool.reserve(holds) is None
        view = budgets.read_budget(name)
        assert view is not None
        assert (view.held_tokens, view.held_requests, view.spent_tokens, view.holders) == (700, 1, 0, 1)
        ledger.settle(holds[0], Usage(100, 0, 50))
        ledger.release(holds[1])
        ledger.charge_cut_off(holds[2])
        assert budgets.read_budget(name).held_tokens == 700  # type: ignore[union-attr]  # noted only
        await pool.flush()
        view = budgets.read_budget(name)
        assert view is not None
        assert (view.held_tokens, view.held_requests) == (0, 0)
        assert (view.spent_tokens, view.spent_requests) == (150 + 200, 1)
        assert view.spent_cost_usd == pytest.approx(ledger.spent.cost_usd)
    finally:
        await pool.aclose()  # type: ignore[attr-defined]
    assert budgets.read_budget(name).holders == 0  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_reservation_beyond_the_limit_is_refused_whole_naming_the_budget(store: Store) -> None:
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=500, max_cost_usd=1.0)
    pool = await budgets.open_shared_pool(name, "run-a")
    other = await budgets.open_shared_pool(name, "run-b")
    try:
        assert await pool.reserve([_hold(100, 200)]) is None
        refusal = await other.reserve([_hold(100, 200)])
        assert refusal is not None
        assert (refusal.limit, refusal.needed, refusal.available, refusal.pool) == (
            "max_tokens",
            300,
            200,
            name,
        )
        assert refusal.room.tokens == 200 and refusal.room.requests is None
        assert budgets.read_budget(name).held_tokens == 300  # type: ignore[union-attr]
    finally:
        await pool.aclose()  # type: ignore[attr-defined]
        await other.aclose()  # type: ignore[attr-defined]
    view = budgets.read_budget(name)
    assert view is not None and (view.spent_tokens, view.held_tokens) == (300, 0)  # closing charges it


@pytest.mark.anyio
async def test_reservations_asked_for_together_are_taken_in_turn_as_one_at_a_time_would_be(
    store: Store,
) -> None:
    """A server's standing segment takes every run's reservation: those asked for while one is
    under way go in one change (`Coalesced`), each taken or refused in turn as if alone; one
    whose caller went away before it got it is given back."""
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=1000)
    pool = await budgets.open_shared_pool(name, "standing")
    refusals: list[Any] = []
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(lambda: _ask(pool, refusals))
        taken = [r for r in refusals if r is None]
        refused = [r for r in refusals if r is not None]
        assert (len(taken), len(refused)) == (5, 3)  # 5 x 200 fit in 1000, whatever the grouping
        assert all((r.limit, r.needed, r.available, r.pool) == ("max_tokens", 200, 0, name) for r in refused)
        view = budgets.read_budget(name)
        assert view is not None and (view.held_tokens, view.spent_tokens) == (1000, 0)
        assert pool.room is not None and pool.room.tokens == 0

        for _ in range(5):  # all given back
            pool.release(_hold(0, 200, 0))
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _ask(pool, got))  # under way while the next one is asked
            tg.start_soon(lambda: _gone(pool, got))
        await pool.flush()
        view = budgets.read_budget(name)
        # Held: what the callers got, however the two were ordered (the one that went away
        # got its reservation only where it ran the change itself, before it saw the cancel).
        assert view is not None and view.spent_tokens == 0
        assert view.held_tokens == 200 * got.count(None) and got.count(None) >= 1, (view, got)
    finally:
        await pool.aclose()  # type: ignore[attr-defined]


async def _ask(pool: Any, refusals: list[Any]) -> None:
    refusals.append(await pool.reserve([_hold(0, 200, 0)]))


async def _gone(pool: Any, got: list[Any]) -> None:
    """A reservation whose caller goes away at once: left out of its change, or given back
    after it, unless it made the change itself (then it gets it, as it returns)."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        got.append(await pool.reserve([_hold(0, 200, 0)]))


def test_set_start_and_refusals(store: Store) -> None:
    budgets, name = _budgets(store), _name(store, "key:alice")
    assert budgets.read_budget(name) is None
    budgets.note_refusal(name)  # no budget: nothing to count, nothing made
    assert budgets.read_budget(name) is None
    started = budgets.start_budget(name, (120, 0.25, 3))
    assert (started.spent_tokens, started.spent_requests, started.max_tokens) == (120, 3, None)
    assert budgets.start_budget(name, (999, 9.0, 9)).spent_tokens == 120  # made once
    view = budgets.set_budget(name, max_tokens=200)
    assert (view.max_tokens, view.max_cost_usd, view.spent_tokens) == (200, None, 120)
    budgets.note_refusal(name)
    budgets.note_refusal(name)
    assert budgets.set_budget(name, max_tokens=None).refusals == 2  # limits change, counts stay
    assert budgets.set_budget(name, max_requests=3).exhausted() == "max_requests"
    assert budgets.read_budget(name).to_json()["refusals"] == 2  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_an_unknown_budget_is_refused_naming_budget_shared(store: Store) -> None:
    with pytest.raises(ConfigError, match=r"^budget\.shared: no budget named 'nope"):
        await _budgets(store).open_shared_pool(_name(store, "nope"), "run-a")


KILLED = """
import os, signal, anyio
from lanefold.execution import open_store
from lanefold.primitives import Hold, Usage

async def main() -> None:
    store = open_store({url!r}, {runs!r})
    pool = await store.open_shared_pool({name!r}, "run-dead")
    hold = Hold(Usage(100, 0, 300), 0.0007, 1, "sample")
    assert await pool.reserve([hold]) is None
    pool.settle(hold, 120, 0.0, 1)  # noted only: the process dies before it is written
    os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main)
"""


def test_a_dead_segments_holds_are_charged_whole(store: Store, opened: tuple[Store, list[str]]) -> None:
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=1000)
    flags = opened[1]
    url = flags[1] if flags[0] == "--store" else None
    runs = flags[1] if flags[0] == "--runs-dir" else "runs"
    code = textwrap.dedent(KILLED.format(url=url, runs=runs, name=name))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    for _ in range(200):  # PostgreSQL notices a dead client's socket within moments, not at once
        view = budgets.read_budget(name)
        assert view is not None
        if view.holders == 0:
            break
        anyio.run(anyio.sleep, 0.1)
    assert (view.spent_tokens, view.charged_tokens, view.held_tokens, view.holders) == (400, 400, 0, 0)


class CutLog:
    """A run's log that takes `left` more appends, then none (a process killed there)."""

    def __init__(self, inner: Any, left: int) -> None:
        self.inner, self.left = inner, left

    def append(self, event: Event) -> None:
        if self.left <= 0:
            raise LogWriteError("killed")
        self.left -= 1
        self.inner.append(event)

    def read(self, from_sequence: int = 1) -> Any:
        return self.inner.read(from_sequence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _spent(store: Store, run_id: str) -> int:
    """What the run's log says it spent, a crash's lanes in flight whole."""
    state = lanefold.read_state(store, run_id)
    flying = sum(lane.hold.tokens for _, lane in state.in_flight() if lane.hold is not None)
    return state.spend.tokens + (flying if state.result is None and state.failure is None else 0)


def test_every_segment_of_a_run_spends_from_the_budget_it_was_started_under(store: Store) -> None:
    """A run of `[budget] shared` cut off mid-wave, resumed, then reduced again by a judge:
    the budget is charged exactly what the run's log says, segment after segment, and a spent
    budget refuses the next segment before anything is recorded."""
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=2000)
    config = lanefold.parse_config(
        {
            "loop": {"k": 6, "seed": 3, "min_quorum": 2, "reducer": "judge_argmax"},
            "sampling": {"max_tokens": 50},
            "backend": {"kind": "simulated", "prompt_tokens": 64, "output_tokens": 48},
            "judge": {"template": "Q: {question}\nCandidate: {candidate}\nScore it.", "max_tokens": 32},
            "budget": {"shared": name},
        }
    )
    run_id = f"r{os.urandom(4).hex()}"

    async def cut() -> None:
        log = CutLog(store.create_log(run_id), 10)  # run.started, wave.started, 6 dispatched, 2 landed
        async with lanefold.Session(config, store=store) as session:
            with pytest.raises(LogWriteError):
                await session.run("What is 17 * 23?", run_id=run_id, log=log)

    anyio.run(cut)
    first = lanefold.read_state(store, run_id).started
    assert first is not None and first.pools == [name]
    assert budgets.read_budget(name).spent_tokens == _spent(store, run_id) > 0  # type: ignore[union-attr]

    lanefold.resume_sync(run_id, store=store)
    assert budgets.read_budget(name).spent_tokens == _spent(store, run_id)  # type: ignore[union-attr]

    async def judged() -> Any:
        async with lanefold.Session(store=store) as session:
            return await session.reduce(run_id, reducer="judge_argmax")

    anyio.run(judged)
    view = budgets.read_budget(name)
    assert view is not None and view.spent_tokens == _spent(store, run_id) and view.holders == 0

    budgets.set_budget(name, max_tokens=view.spent_tokens)  # spent now: the next segment is refused
    before = list(store.reader(run_id).read())
    with pytest.raises(BudgetExhaustedError, match=rf"budget '{name}' is spent \(max_tokens\)"):
        anyio.run(judged)
    assert list(store.reader(run_id).read()) == before
    assert budgets.read_budget(name).refusals == 1  # type: ignore[union-attr]


def test_a_run_whose_second_budget_is_unknown_takes_nothing_from_the_first(store: Store) -> None:
    """Opening a run's budgets is all or none too: the first one opened is closed again (no
    segment left holding it) when the next is refused, and nothing is recorded."""
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=1000)
    config = lanefold.parse_config({"loop": {"k": 2}, "budget": {"shared": name}})
    missing = _name(store, "missing")

    async def go() -> None:
        async with lanefold.Session(config, store=store) as session:
            await session.run("What is 17 * 23?", run_id=f"r{os.urandom(4).hex()}", pools=[missing])

    with pytest.raises(ConfigError, match=rf"budget\.shared: no budget named '{missing}'"):
        anyio.run(go)
    view = budgets.read_budget(name)
    assert view is not None and (view.holders, view.spent_tokens, view.held_tokens) == (0, 0, 0)
    assert store.list_runs() == []


@pytest.mark.anyio
async def test_a_files_sweep_tries_no_holder_file_of_its_own_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment this process opened holds its file's flock until it closes, so it is alive:
    a budget's sweep (at every change) tries only other processes' files. With a gateway
    worker's runs in flight it otherwise opened and tried each of them at every change."""
    budgets = _budgets(lanefold.open_store(None, tmp_path / "runs"))
    budgets.set_budget("fleet", max_tokens=1000)
    pools = [await budgets.open_shared_pool("fleet", f"run-{i}") for i in range(3)]
    tried: list[str] = []
    real = os.open

    def counted(path: Any, *args: Any, **kwargs: Any) -> int:
        if "holders" in str(path):
            tried.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    try:
        await pools[0].reserve([_hold(100, 200)])
        view = budgets.read_budget("fleet")
        assert view is not None and (view.holders, view.held_tokens) == (3, 300)
        assert tried == []
    finally:
        monkeypatch.undo()
        for pool in pools:
            await pool.aclose()  # type: ignore[attr-defined]
    view = budgets.read_budget("fleet")
    assert view is not None and (view.holders, view.spent_tokens) == (0, 300)


@pytest.mark.anyio
async def test_a_session_with_standing_pools_spends_as_run_segments_do(store: Store) -> None:
    """A server's session keeps one segment of each budget open across its runs
    (`standing_pools=True`): the budget lists one holder however many runs went through it,
    charges each run what its log says (an interrupted run's in-flight holds whole), refuses
    the run the budget cannot fund before anything is recorded, and lists no holder once the
    session closes."""
    budgets, name = _budgets(store), _name(store, "fleet")
    budgets.set_budget(name, max_tokens=400)  # a run holds 64 + 2 x 50 and spends 64 + 2 x 48
    config = lanefold.parse_config(
        {
            "loop": {"k": 2, "seed": 3},
            "sampling": {"max_tokens": 50},
            "backend": {
                "kind": "simulated",
                "prompt_tokens": 64,
                "output_tokens": 48,
                "latency_ms": [20.0, 20.0],
            },
            "budget": {"shared": name},
        }
    )
    ran = [f"r{os.urandom(4).hex()}" for _ in range(3)]
    async with lanefold.Session(config, store=store, standing_pools=True) as session:
        await session.run("What is 17 * 23?", run_id=ran[0])
        with anyio.CancelScope() as scope:  # interrupted with its wave in flight
            await session.run(
                "What is 17 * 23?",
                run_id=ran[1],
                observer=lambda event: scope.cancel() if event.type == "lane.dispatched" else None,
            )
        view = budgets.read_budget(name)
        assert view is not None and (view.holders, view.held_tokens) == (1, 0)
        assert view.spent_tokens == 160 + 164 == sum(_spent(store, r) for r in ran[:2])
        with pytest.raises(BudgetExhaustedError, match=rf"shared budget '{name}' max_tokens"):
            await session.run("What is 17 * 23?", run_id=ran[2])  # 76 left: not one lane's 64 + 50
        assert store.list_runs().count(ran[2]) == 0  # refused, not a run
        budgets.set_budget(name, max_tokens=2000)  # raised while the segment stands: seen at once
        await session.run("What is 17 * 23?", run_id=ran[2])
        view = budgets.read_budget(name)
        assert view is not None and (view.holders, view.refusals) == (1, 1)
        assert view.spent_tokens == sum(_spent(store, r) for r in ran)
    view = budgets.read_budget(name)
    assert view is not None and (view.holders, view.held_tokens) == (0, 0)
    assert view.spent_tokens == 160 + 164 + 160


@pytest.mark.anyio
async def test_a_files_budget_is_read_without_its_lock_while_every_segment_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read_budget` (a gateway's at every request) takes the budgets' lock only to charge a
    dead segment's holds: with every segment alive it reads the file as it stands."""
    from lanefold.stores.files._budget import FileBudgets

    budgets = _budgets(lanefold.open_store(None, tmp_path / "runs"))
    budgets.set_budget("fleet", max_tokens=1000)
    pool = await budgets.open_shared_pool("fleet", "run-a")
    try:
        await pool.reserve([_hold(100, 200)])

        def refused(self: Any) -> Any:
            raise AssertionError("locked to read a budget whose segments all live")

        with monkeypatch.context() as patched:
            patched.setattr(FileBudgets, "locked", refused)
            view = budgets.read_budget("fleet")
        assert view is not None and (view.holders, view.held_tokens) == (1, 300)
    finally:
        await pool.aclose()  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_standing_segment_whose_budget_went_away_is_replaced_at_the_next_run(tmp_path: Path) -> None:
    """A budget's file removed by hand under a serving session: the run that finds it gone
    fails naming it, the segment is dropped, and once the budget is set again the next run
    opens a new segment; closing the session lets go of both."""
    store = lanefold.open_store(None, tmp_path / "runs")
    budgets = _budgets(store)
    budgets.set_budget("fleet", max_tokens=10_000)
    config = lanefold.parse_config({"loop": {"k": 2}, "budget": {"shared": "fleet"}})
    async with lanefold.Session(config, store=store, standing_pools=True) as session:
        await session.run("What is 17 * 23?")
        (tmp_path / "runs" / ".budgets" / "fleet.json").unlink()
        with pytest.raises(ConfigError, match=r"no budget named 'fleet'"):
            await session.run("What is 17 * 23?")
        budgets.set_budget("fleet", max_tokens=10_000)
        await session.run("What is 17 * 23?")
        view = budgets.read_budget("fleet")
        assert view is not None and view.holders == 1 and view.spent_tokens > 0
    view = budgets.read_budget("fleet")
    assert view is not None and (view.holders, view.held_tokens) == (0, 0)
    assert list((tmp_path / "runs" / ".budgets" / "holders").iterdir()) == []


@pytest.mark.anyio
async def test_standing_segments_past_the_ones_kept_close_the_least_recently_used_idle_one(
    store: Store,
) -> None:
    """A server with many keys does not hold a segment (a file lock, a PostgreSQL connection)
    for each: past `keep`, the least recently used segment with no run in flight is closed, and
    opened again when a run needs it."""
    from lanefold.execution._fleet_budget import StandingPools, close_pools, open_pools

    budgets = _budgets(store)
    names = [_name(store, base) for base in ("a", "b", "c")]
    for name in names:
        budgets.set_budget(name, max_tokens=1000)
    standing = StandingPools(keep=2)

    async def holders() -> list[int]:
        return [budgets.read_budget(name).holders for name in names]  # type: ignore[union-attr]

    try:
        for name in names:
            await close_pools(await open_pools(store, [name], "r", standing=standing))
        assert await holders() == [0, 1, 1]  # a, the least recently used, closed
        busy = await open_pools(store, [names[1]], "r", standing=standing)  # b in flight
        await close_pools(await open_pools(store, [names[0]], "r", standing=standing))
        assert await holders() == [1, 1, 0]  # c closed, not b: b has a run in flight
        await close_pools(busy)
    finally:
        await standing.aclose()
    assert await holders() == [0, 0, 0]


@pytest.mark.anyio
async def test_a_runs_end_waits_for_its_own_settlements_not_the_other_runs(store: Store) -> None:
    """Runs sharing a standing segment: one whose settlements are down ends without writing
    (or waiting for) the settlements other runs noted since; each run's own are down when its
    share closes."""
    from lanefold.execution._fleet_budget import StandingPools, close_pools, open_pools

    budgets, name = _budgets(store), _name(store, "standing")
    budgets.set_budget(name, max_tokens=10_000)
    standing = StandingPools()

    def spent() -> int:
        return budgets.read_budget(name).spent_tokens  # type: ignore[union-attr]

    try:
        first = await open_pools(store, [name], "a", standing=standing)
        second = await open_pools(store, [name], "b", standing=standing)
        assert first is not None and second is not None
        hold = _hold(100, 200)
        assert await first.reserve([hold]) is None and await second.reserve([hold]) is None
        first.settle(hold, 150, 0.0, 1)
        await first.flush()  # the first run's wave end: its settlement down
        second.settle(hold, 250, 0.0, 1)  # the second's, noted
        await close_pools(first)  # the first run's end: nothing of its own left to write
        assert spent() == 150  # the second's settlement is the second's to write
        await close_pools(second)
        assert spent() == 400
    finally:
        await standing.aclose()


@pytest.mark.anyio
async def test_a_flush_waits_for_the_change_under_way_that_took_its_settlements(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation writes what was noted before it (another run's settlement) along with
    its own change; a flush asked while that change is still under way has nothing pending
    left, and returns only once the change is down, not at once."""
    budgets, name = _budgets(store), _name(store, "under-way")
    budgets.set_budget(name, max_tokens=10_000)
    pool = await budgets.open_shared_pool(name, "run")
    hold = _hold(100, 200)
    held, release = anyio.Event(), anyio.Event()
    arm: list[bool] = []
    run_sync = anyio.to_thread.run_sync

    async def slow(func: Any, *args: Any, **kwargs: Any) -> Any:
        if arm:  # the armed change waits in its worker thread's stead until let go
            arm.clear()
            held.set()
            await release.wait()
        return await run_sync(func, *args, **kwargs)

    try:
        assert await pool.reserve([hold]) is None
        pool.settle(hold, 150, 0.0, 1)  # noted
        monkeypatch.setattr(anyio.to_thread, "run_sync", slow)
        arm.append(True)
        flushed: list[bool] = []

        async def flush() -> None:
            await pool.flush()
            flushed.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.reserve, [hold])  # takes the settlement along, held in flight
            await held.wait()
            tg.start_soon(flush)
            await anyio.wait_all_tasks_blocked()
            early = list(flushed)
            release.set()
        assert early == []  # the settlement was not down yet: the flush waited for it
        assert flushed == [True]
        assert budgets.read_budget(name).spent_tokens == 150  # type: ignore[union-attr]
    finally:
        monkeypatch.undo()
        await pool.aclose()
