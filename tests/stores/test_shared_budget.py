"""One budget for a fleet: `[budget] shared` against a real PostgreSQL server.

The pool's own verbs (reserve, settle, release, cut-off charges, a dead owner's holds charged
whole), runs that stop at the shared limit, two runs sharing one budget, `budget set/show` and
bad input on the command line, and the property: processes running many runs at once, with
faults and SIGKILLs, never together spend more than the budget.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import anyio
import psycopg
import pytest

from lanefold import read_run, read_state
from lanefold.primitives import Hold, Ledger, Limits, Pricing, Usage
from lanefold.stores.postgres import PgDatabase, PgSharedPool, connect_budgets, read_budget, set_budget

pytestmark = pytest.mark.anyio

PRICING = Pricing(input_per_mtok=1.0, output_per_mtok=2.0)


def _hold(prompt: int, out: int, requests: int = 1) -> Hold:
    usage = Usage(prompt, 0, out)
    return Hold(usage, (prompt * 1.0 + out * 2.0) * 1e-6, requests, "sample")


def _budget(url: str, name: str = "fleet", **limits: Any) -> Any:
    conn = connect_budgets(PgDatabase(url))
    try:
        return set_budget(conn, name, **limits)
    finally:
        conn.close()


def _show(url: str, name: str = "fleet") -> Any:
    conn = connect_budgets(PgDatabase(url))
    try:
        return read_budget(conn, name)
    finally:
        conn.close()


def _settled_show(url: str, name: str = "fleet", timeout: float = 20.0) -> Any:
    """The budget once no dead owner's holds are left (the server notices a dead client's
    socket within moments, not at once)."""
    deadline = time.monotonic() + timeout
    while True:
        view = _show(url, name)
        if view.holders == 0 or time.monotonic() > deadline:
            return view
        time.sleep(0.1)


async def test_reserve_settle_release_mirror_the_ledger(pg_url: str) -> None:
    _budget(pg_url, max_tokens=1000, max_requests=10)
    pool = await PgSharedPool.open(PgDatabase(pg_url), "fleet", "run-a")
    ledger = Ledger(Limits(), PRICING, shared=pool)
    try:
        holds = [_hold(100, 200), _hold(0, 200, 0), _hold(0, 200, 0)]
        assert ledger.try_reserve(holds) is None
        assert await pool.reserve(holds) is None
        view = _show(pg_url)
        assert (view.held_tokens, view.held_requests, view.spent_tokens) == (700, 1, 0)
        ledger.settle(holds[0], Usage(100, 0, 50))
        ledger.release(holds[1])
        ledger.charge_cut_off(holds[2])
        assert _show(pg_url).held_tokens == 700  # noted, not yet written: the whole hold stands
        await pool.flush()
        view = _show(pg_url)
        assert (view.held_tokens, view.held_requests) == (0, 0)
        assert (view.spent_tokens, view.spent_requests) == (150 + 200, 1)
        assert view.spent_cost_usd == pytest.approx(ledger.spent.cost_usd)
        assert view.charged_tokens == 0
    finally:
        await pool.aclose()
    assert _show(pg_url).holders == 0


async def test_a_reservation_beyond_the_limit_is_refused_whole(pg_url: str) -> None:
    _budget(pg_url, max_tokens=500, max_cost_usd=1.0)
    pool = await PgSharedPool.open(PgDatabase(pg_url), "fleet", "run-a")
    try:
        assert await pool.reserve([_hold(100, 200)]) is None
        refusal = await pool.reserve([_hold(100, 200)])
        assert refusal is not None
        assert (refusal.limit, refusal.needed, refusal.available) == ("max_tokens", 300.0, 200.0)
        assert refusal.room.tokens == 200 and refusal.room.requests is None
        assert _show(pg_url).held_tokens == 300  # nothing of the refused ask was taken
    finally:
        await pool.aclose()


async def test_two_pools_share_one_limit(pg_url: str) -> None:
    _budget(pg_url, max_requests=3)
    a = await PgSharedPool.open(PgDatabase(pg_url), "fleet", "run-a")
    b = await PgSharedPool.open(PgDatabase(pg_url), "fleet", "run-b")
    try:
        assert await a.reserve([_hold(1, 1), _hold(1, 1)]) is None
        refusal = await b.reserve([_hold(1, 1), _hold(1, 1)])
        assert refusal is not None and refusal.limit == "max_requests"
        assert await b.reserve([_hold(1, 1)]) is None
        assert _show(pg_url).holders == 2
    finally:
        await a.aclose()
        await b.aclose()
    view = _show(pg_url)
    # Closing charges what is still held: nothing settled these holds.
    assert (view.spent_requests, view.held_requests, view.charged_requests) == (3, 0, 0)


async def test_a_dead_owners_holds_are_charged_whole(pg_url: str) -> None:
    _budget(pg_url, max_tokens=1000)
    pool = await PgSharedPool.open(PgDatabase(pg_url), "fleet", "run-dead")
    assert await pool.reserve([_hold(100, 300)]) is None
    pool.settle(_hold(100, 300), 120, 0.0, 1)  # noted only: the owner dies before writing it
    pool._conn.close()  # the process's connection dies with it
    view = _settled_show(pg_url)
    assert (view.spent_tokens, view.charged_tokens, view.held_tokens) == (400, 400, 0)
    assert view.spent_cost_usd == pytest.approx(_hold(100, 300).cost_usd)


async def test_an_unknown_budget_is_refused_naming_budget_shared(pg_url: str) -> None:
    from lanefold.primitives import ConfigError

    with pytest.raises(ConfigError, match=r"^budget\.shared: no budget named 'nope'"):
        await PgSharedPool.open(PgDatabase(pg_url), "nope", "run-a")


def test_the_tables_take_concurrent_creators(pg_url: str) -> None:
    import concurrent.futures

    # Many workers starting at once each create the tables if they are missing.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for conn in pool.map(lambda _: connect_budgets(PgDatabase(pg_url)), range(4)):
            conn.close()
    with psycopg.connect(pg_url) as conn:
        names = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"lanefold_budgets", "lanefold_budget_holds"} <= names


# -- runs spending from a shared budget ------------------------------------------------------------


def _config(
    *,
    shared: str | None = "fleet",
    k: int = 4,
    min_quorum: int = 2,
    coordinator: str = "parallel_sample",
    **backend: Any,
) -> Any:
    from lanefold import parse_config

    loop: dict[str, Any] = {"coordinator": coordinator, "seed": 3}
    if coordinator == "parallel_sample":
        loop.update(k=k, min_quorum=min_quorum)
    budget = {"shared": shared} if shared is not None else {}
    return parse_config(
        {
            "loop": loop,
            "sampling": {"max_tokens": 50},
            "backend": {"kind": "simulated", "prompt_tokens": 64, "output_tokens": 48, **backend},
            "budget": budget,
            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        }
    )


async def test_a_run_stops_at_the_shared_limit(pg_url: str, tmp_path: Any) -> None:
    import lanefold
    from lanefold.primitives import BudgetExhaustedError

    # A wave of 4 holds 64 + 4 * 50 = 264 tokens and spends 64 + 4 * 48 = 256: one run fits
    # in 400, the second can fund 1 lane (114 of the 144 left), below its quorum of 2.
    _budget(pg_url, max_tokens=400)
    async with lanefold.Session(_config(), store=pg_url, runs_dir=tmp_path) as session:
        first = await session.run("What is 17 * 23?", run_id="first")
        assert first.usage.prefill_tokens + first.usage.decode_tokens == 256
        events: list[Any] = []
        with pytest.raises(BudgetExhaustedError, match=r"shared budget 'fleet' max_tokens"):
            await session.run("What is 17 * 23?", run_id="second", observer=events.append)
    exhausted = [e for e in events if e.type == "budget.exhausted"]
    assert len(exhausted) == 1 and exhausted[0].data.shared == "fleet"
    assert (exhausted[0].data.k_fit, exhausted[0].data.available) == (1, 144.0)
    view = _show(pg_url)
    assert (view.spent_tokens, view.held_tokens, view.holders) == (256, 0, 0)
    assert view.spent_cost_usd == pytest.approx(first.cost.total)


async def test_a_wave_shrinks_to_the_shared_room(pg_url: str, tmp_path: Any) -> None:
    import lanefold

    _budget(pg_url, max_tokens=64 + 50 * 2)  # room for 2 lanes of 4
    events: list[Any] = []
    async with lanefold.Session(_config(min_quorum=1), store=pg_url, runs_dir=tmp_path) as session:
        result = await session.run("What is 17 * 23?", observer=events.append)
    shrunk = [e for e in events if e.type == "budget.wave_shrunk"]
    assert len(shrunk) == 1 and (shrunk[0].data.k, shrunk[0].data.shared) == (2, "fleet")
    assert result.lanes_completed == 2
    assert _show(pg_url).spent_tokens == 64 + 2 * 48


async def test_a_loop_stops_in_time_at_the_shared_limit(pg_url: str, tmp_path: Any) -> None:
    """A loop that asks whether it can afford another wave sees the shared budget's room (as
    of its last reservation, plus what its own lanes gave back) and stops there, as at its own
    limit, instead of starting a wave the budget then shrinks to nothing."""
    import lanefold
    from lanefold import parse_config

    # Two waves of 4 (264 held, 256 spent each) leave 108: not one more lane (64 + 50).
    _budget(pg_url, max_tokens=620)
    config = parse_config(
        {
            "loop": {
                "coordinator": "adaptive_sample",
                "window": 4,
                "max_lanes": 40,
                "threshold": 0.99,
                "seed": 3,
            },
            "sampling": {"max_tokens": 50},
            "backend": {"kind": "simulated", "prompt_tokens": 64, "output_tokens": 48, "accuracy": 0.5},
            "budget": {"shared": "fleet"},
        }
    )
    events: list[Any] = []
    async with lanefold.Session(config, store=pg_url, runs_dir=tmp_path) as session:
        result = await session.run("What is 17 * 23?", observer=events.append)
    assert result.answer is not None and result.lanes_completed == 8
    # It saw the room was short before asking: no third wave, not even an empty one.
    assert [e.type for e in events].count("wave.started") == 2
    assert result.outcome is not None and result.outcome["stopped_by"] == "budget"
    view = _show(pg_url)
    assert (view.spent_tokens, view.holders) == (512, 0)


async def test_two_runs_at_once_share_one_budget(pg_url: str, tmp_path: Any) -> None:
    import lanefold

    _budget(pg_url, max_tokens=100_000, max_requests=5)
    results: list[Any] = []
    config = _config(coordinator="adaptive_sample", failure_rate=0.2, latency_ms=[1.0, 5.0])

    async def one(run_id: str) -> None:
        async with lanefold.Session(config, store=pg_url, runs_dir=tmp_path) as session:
            with contextlib.suppress(BudgetExhaustedError):
                results.append(await session.run("What is 17 * 23?", run_id=run_id))

    from lanefold.primitives import BudgetExhaustedError

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        tg.start_soon(one, "b")
    view = _show(pg_url)
    assert view.spent_requests <= 5 and view.holders == 0
    store = lanefold.open_store(pg_url, tmp_path)
    spent = [read_state(store, run_id).spend for run_id in ("a", "b")]
    assert view.spent_tokens == sum(s.tokens for s in spent)
    assert view.spent_requests == sum(s.requests for s in spent)
    assert view.spent_cost_usd == pytest.approx(sum(s.cost_usd for s in spent))


async def test_an_interrupt_charges_in_flight_holds_and_resume_spends_again(
    pg_url: str, tmp_path: Any
) -> None:
    import lanefold

    _budget(pg_url, max_tokens=100_000)
    config = _config(latency_ms=[50.0, 50.0])
    async with lanefold.Session(config, store=pg_url, runs_dir=tmp_path) as session:
        with anyio.CancelScope() as scope:  # interrupted once its lanes are dispatched
            await session.run(
                "What is 17 * 23?",
                run_id="cut",
                observer=lambda event: scope.cancel() if event.type == "lane.dispatched" else None,
            )
        view = _show(pg_url)
        # Interrupted with its wave in flight: the whole hold (64 + 4 x 50) is charged, as the
        # run's own log charges it, and nothing is left held.
        state = read_state(session.store, "cut")
        assert (view.spent_tokens, view.held_tokens, view.holders, state.spend.tokens) == (264, 0, 0, 264), [
            e.type for e in read_run(session.store, "cut")[0]
        ]
        result = await session.resume("cut")
    assert result.lanes_completed == 4
    assert _show(pg_url).spent_tokens == 264 + 64 + 4 * 48


async def test_a_judge_reduction_spends_from_the_shared_budget(pg_url: str, tmp_path: Any) -> None:
    import lanefold
    from lanefold import parse_config

    _budget(pg_url, max_tokens=100_000)
    config = parse_config(
        {
            "loop": {"k": 4, "seed": 3, "reducer": "judge_argmax"},
            "sampling": {"max_tokens": 50},
            "backend": {"kind": "simulated", "prompt_tokens": 64, "output_tokens": 48},
            "judge": {"template": "Q: {question}\nCandidate: {candidate}\nScore it.", "max_tokens": 32},
            "budget": {"shared": "fleet"},
        }
    )
    async with lanefold.Session(config, store=pg_url, runs_dir=tmp_path) as session:
        await session.run("What is 17 * 23?", run_id="r")
        before = _show(pg_url).spent_tokens
        await session.reduce("r", reducer="judge_argmax")
        spend = read_state(session.store, "r").spend
    view = _show(pg_url)
    assert before > 64 + 4 * 48 and view.spent_tokens > before  # the run's judge, then ours
    assert view.spent_tokens == spend.tokens and view.holders == 0


# -- the command line ------------------------------------------------------------------------------

CONFIG_TOML = """
[loop]
coordinator = "parallel_sample"
k = 4
min_quorum = 2

[sampling]
max_tokens = 50

[backend]
kind = "simulated"
prompt_tokens = 64
output_tokens = 48

[budget]
shared = "fleet"
"""


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from lanefold.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_budget_set_and_show(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(
        capsys, "budget", "set", "fleet", "--max-tokens", "1000", "--max-cost-usd", "0.5", "--store", pg_url
    )
    assert code == 0
    assert out.splitlines()[1:] == [
        "              limit      spent       held       left",
        "tokens         1000          0          0       1000",
        "cost      $0.500000  $0.000000  $0.000000  $0.500000",
        "requests  unlimited          0          0  unlimited",
    ]
    code, out, _ = _cli(
        capsys,
        "budget",
        "set",
        "fleet",
        "--max-tokens",
        "none",
        "--max-requests",
        "7",
        "--store",
        pg_url,
        "--json",
    )
    assert code == 0
    shown = json.loads(out)
    assert (shown["max_tokens"], shown["max_cost_usd"], shown["max_requests"]) == (None, 0.5, 7)
    code, out, _ = _cli(capsys, "budget", "show", "fleet", "--store", pg_url, "--json")
    assert code == 0 and json.loads(out) == shown
    password = pg_url.split(":")[2].split("@")[0]
    code, _, err = _cli(capsys, "budget", "show", "other", "--store", pg_url)
    assert code == 2 and password not in err
    assert err.startswith("orchestrator budget: budget 'other': no such budget in ")


def test_a_run_spends_from_the_budget_show_prints(
    pg_url: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(CONFIG_TOML)
    assert _cli(capsys, "budget", "set", "fleet", "--max-tokens", "400", "--store", pg_url)[0] == 0
    code, _, err = _cli(
        capsys,
        "run",
        str(config),
        "--question",
        "What is 17 * 23?",
        "--store",
        pg_url,
        "--runs-dir",
        str(tmp_path),
    )
    assert code == 0, err
    code, _, err = _cli(
        capsys,
        "run",
        str(config),
        "--question",
        "What is 17 * 23?",
        "--store",
        pg_url,
        "--runs-dir",
        str(tmp_path),
    )
    assert code == 3 and "shared budget 'fleet' max_tokens" in err
    code, out, _ = _cli(capsys, "budget", "show", "fleet", "--store", pg_url)
    assert code == 0
    assert out.splitlines()[2].split() == ["tokens", "400", "256", "0", "144"]


def test_bad_input_is_refused_before_any_run(
    pg_url: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(CONFIG_TOML)
    code, _, err = _cli(
        capsys, "run", str(config), "--question", "q?", "--store", pg_url, "--runs-dir", str(tmp_path)
    )
    assert code == 2 and err.startswith("orchestrator run: budget.shared: no budget named 'fleet'")
    code, _, err = _cli(capsys, "run", str(config), "--question", "q?", "--runs-dir", str(tmp_path))
    assert code == 2 and err.startswith("orchestrator run: budget.shared: no budget named 'fleet'")
    assert not list(tmp_path.glob("*/events.jsonl"))  # neither left a run behind
    config.write_text(CONFIG_TOML.replace('"fleet"', '"no spaces allowed"'))
    code, _, err = _cli(capsys, "run", str(config), "--question", "q?", "--runs-dir", str(tmp_path))
    assert code == 2 and "budget.shared" in err
    with pytest.raises(SystemExit) as exit_:  # argparse's own usage error
        _cli(capsys, "budget", "set", "fleet", "--max-tokens", "-1", "--store", pg_url)
    assert exit_.value.code == 2 and "--max-tokens: '-1': must be" in capsys.readouterr().err


# -- the property: a fleet of processes never overspends -------------------------------------------

FLEET_TOML = """
[loop]
coordinator = "adaptive_sample"
window = 4
max_lanes = 12
threshold = 0.99
seed = {seed}

[sampling]
max_tokens = 64

[backend]
kind = "simulated"
prompt_tokens = 64
output_tokens = 48
latency_ms = {latency}
accuracy = 0.5
failure_rate = 0.2
seed = {seed}

[retry]
max_attempts = 3
initial_backoff_s = 0.01
max_backoff_s = 0.05

[budget]
shared = "fleet"

[pricing]
input_per_mtok = 1.0
output_per_mtok = 2.0

[log]
fsync = "always"
"""

WORKER = """
import sys
import anyio
import lanefold
from lanefold.primitives import LanefoldError

url, config, worker, runs, concurrency, runs_dir = sys.argv[1:]

async def main():
    async with lanefold.Session(config, store=url, runs_dir=runs_dir) as session:
        limiter = anyio.CapacityLimiter(int(concurrency))

        async def one(i):
            async with limiter:
                try:
                    await session.run(f"Q{i} of {worker}: what is 17 * 23?",
                                      run_id=f"w{worker}-r{i}")
                except LanefoldError as exc:
                    print("failed", i, type(exc).__name__, flush=True)

        async with anyio.create_task_group() as tg:
            for i in range(int(runs)):
                tg.start_soon(one, i)

anyio.run(main)
"""

LIMITS = {"max_tokens": 6000, "max_cost_usd": 0.012, "max_requests": 150}


def _until_holding(url: str, prefix: str, proc: Any, timeout: float = 60.0) -> bool:
    """Wait until runs `prefix*` hold part of the budget; False if `proc` ended first."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline and proc.poll() is None:
            row = conn.execute(
                "SELECT count(*) FROM lanefold_budget_holds WHERE run_id LIKE %s AND tokens > 0",
                (prefix + "%",),
            ).fetchone()
            if row is not None and row[0]:
                return True
            time.sleep(0.01)
    return False


@pytest.mark.parametrize("seed", [1])
def test_a_fleet_with_faults_and_kills_never_overspends(pg_url: str, tmp_path: Any, seed: int) -> None:
    """4 processes running 3 runs at once each (16 runs in all, wanting about twice the
    budget), faults on a fifth of the lanes, 2 processes SIGKILLed at seeded moments while
    holding part of it: spent stays within every limit, and equals what the logs say was
    spent plus, at most, the holds charged for the killed processes."""
    import os
    import random
    import signal
    import subprocess
    import sys

    import lanefold

    rng = random.Random(seed)
    _budget(pg_url, **LIMITS)
    doomed = rng.sample(range(4), 2)
    # The doomed are slower (a wave takes 0.3 s at least), so they are still at it when killed.
    slow, fast = tmp_path / "slow.toml", tmp_path / "fast.toml"
    slow.write_text(FLEET_TOML.format(seed=seed, latency=[300.0, 600.0]))
    fast.write_text(FLEET_TOML.format(seed=seed, latency=[50.0, 200.0]))

    runs = {w: 3 if w in doomed else 5 for w in range(4)}

    def start(w: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                pg_url,
                str(slow if w in doomed else fast),
                str(w),
                str(runs[w]),
                "3",
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )

    # The doomed (3 runs each: too few to exhaust the budget alone) are killed while their
    # runs hold part of it, one before and one after the others start.
    workers = {w: start(w) for w in doomed}
    errs: dict[int, str] = {}
    try:
        for w in doomed:
            assert _until_holding(pg_url, f"w{w}-", workers[w]), workers[w].communicate()
        for n, w in enumerate(doomed):
            if n == 1:
                workers.update({w: start(w) for w in range(4) if w not in doomed})
            time.sleep(rng.uniform(0.0, 0.2))
            _until_holding(pg_url, f"w{w}-", workers[w])
            workers[w].send_signal(signal.SIGKILL)
        for w, proc in sorted(workers.items()):
            _, err = proc.communicate(timeout=120)
            errs[w] = err[-3000:]
            if w not in doomed:
                assert proc.returncode == 0, err
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
    assert all(workers[w].returncode == -signal.SIGKILL for w in doomed), [
        (w, workers[w].returncode, errs.get(w)) for w in doomed
    ]
    view = _settled_show(pg_url)
    assert view.holders == 0
    # Never overspent.
    assert view.spent_tokens + view.held_tokens <= LIMITS["max_tokens"]
    assert view.spent_requests <= LIMITS["max_requests"]
    assert view.spent_cost_usd <= LIMITS["max_cost_usd"] + 1e-9
    # What the logs say: every run's spend, and the holds of the lanes a kill left in flight.
    store = lanefold.open_store(pg_url, tmp_path)
    logged = [0, 0.0, 0]
    in_flight = [0, 0.0, 0]
    for w in range(4):
        for i in range(runs[w]):
            if not store.exists(f"w{w}-r{i}"):
                continue
            state = read_state(store, f"w{w}-r{i}")
            logged = [
                logged[0] + state.spend.tokens,
                logged[1] + state.spend.cost_usd,
                logged[2] + state.spend.requests,
            ]
            for _, lane in state.in_flight():
                assert w in doomed and lane.hold is not None
                in_flight = [
                    in_flight[0] + lane.hold.tokens,
                    in_flight[1] + lane.hold.cost_usd,
                    in_flight[2] + lane.hold.requests,
                ]
    assert logged[0] > 0
    spent = (view.spent_tokens, view.spent_cost_usd, view.spent_requests)
    charged = (view.charged_tokens, view.charged_cost_usd, view.charged_requests)
    for m in range(3):
        # A killed run's holds are charged whole: at least what was in flight, never zero...
        assert logged[m] + in_flight[m] <= spent[m] + 1e-9
        # ...and nothing is spent that neither a log nor a charged hold accounts for.
        assert spent[m] - charged[m] <= logged[m] + 1e-9
    assert view.charged_tokens > 0 and view.charged_tokens >= in_flight[0]
