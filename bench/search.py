"""The runs search's cost in the store, against the plain first page measured in the same run:
`list_runs(limit=51)` over N runs (each a first event, six barriers and a last event), plain and
searched by question (a text few runs hold, so the whole table is matched; a text most hold),
by caller and by answer, best of 5 each. Files (the summaries the store keeps) and, with
`--postgres`, the embedded PostgreSQL server the tests start (a WHERE with an escaped ILIKE).

    PYTHONPATH=. .venv/bin/python bench/search.py [--runs 3000] [--postgres]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from lanefold.execution import open_store
from lanefold.primitives import Store
from lanefold.primitives.events import (
    RunCompleted,
    RunCompletedData,
    RunStarted,
    RunStartedData,
    WaveBarrier,
    WaveBarrierData,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SEARCHES: list[dict[str, Any]] = [
    {"question": "capital"},  # one run in 500: every run's question is matched
    {"question": "what is"},  # nearly all: the page fills at once
    {"caller": "alice"},
    {"answer": "391"},
]


def fill(store: Store, runs: int) -> None:
    for i in range(runs):
        run_id, at = f"r{i:05}", T0 + timedelta(seconds=i)
        common: dict[str, Any] = {"source": "bench", "time": at, "run_id": run_id}
        question = "Name the capital of France." if i % 500 == 0 else f"What is {i} * 23?"
        first = RunStartedData(
            config={},
            config_hash="x",
            question=question,
            coordinator="parallel_sample",
            backend="simulated",
            library_version="bench",
            caller="alice" if i % 3 == 0 else None,
        )
        log = store.create_log(run_id)
        log.append(RunStarted(id=f"{run_id}:1", sequence=1, data=first, **common))
        for seq in range(2, 8):
            barrier = WaveBarrierData(completed=[seq], failed=[])
            log.append(WaveBarrier(id=f"{run_id}:{seq}", sequence=seq, wave=1, data=barrier, **common))
        result = {"answer": "391", "lanes_completed": 2, "cost": {"total": 0.5}}
        log.append(RunCompleted(id=f"{run_id}:8", sequence=8, data=RunCompletedData(result=result), **common))
        log.close()


def best_ms(store: Store, **search: Any) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(5):
        start = time.perf_counter()
        found = len(store.list_runs(limit=51, **search))
        times.append(time.perf_counter() - start)
    return min(times) * 1000, found


def report(name: str, store: Store) -> None:
    plain, _ = best_ms(store)
    print(f"{name}: list_runs(limit=51), plain first page: {plain:.1f} ms (baseline)")
    for search in SEARCHES:
        ms, found = best_ms(store, **search)
        print(f"{name}: {search}: {ms:.1f} ms, {found} runs, {ms / plain:.1f}x the plain page")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        files = open_store(None, Path(folder) / "runs")
        fill(files, args.runs)
        report(f"files, {args.runs} runs", files)
        if args.postgres:
            from pgserver import PgServer

            server = PgServer.start(Path(tempfile.mkdtemp()))
            try:
                store = open_store(server.url(server.create_database()))
                fill(store, args.runs)
                report(f"postgres, {args.runs} runs", store)
            finally:
                server.stop()


if __name__ == "__main__":
    main()
