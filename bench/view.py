"""The view's two figures from the issue, printed as PASS/MISS against their targets, never
asserted, each beside a baseline measured in the same run:

- a run of 1,000 lanes: its page rendered in headless Chromium (navigation start to the load
  event, the 1,000 lane elements counted), target < 1 s; baseline: `read_run` of the same run
  (the fold the page needs) in this process;
- the runs list over 10,000 runs in a files store: server time of one page (`GET /`, first and
  sixth page, in-process through starlette's test client), target < 300 ms; baseline:
  a fresh store's `list_runs(limit=51)`, which reads every run's first and last lines (the view's
  store reads an ended run's log once, then only stats it);
- with `--postgres`, the same list over 10,000 runs in a PostgreSQL store (the embedded server the
  tests start): the first and sixth page's server time against reading every run's first and
  last event in one query, the way the store listed runs before it paged.

    PYTHONPATH=. .venv/bin/python bench/view.py [--runs 10000] [--lanes 1000] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

import lanefold
from lanefold.execution import open_store, read_run
from lanefold.view._app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loopback import Loopback


def _median_ms(call: object, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()  # type: ignore[operator]
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _verdict(ms: float, target_ms: float) -> str:
    return "PASS" if ms < target_ms else "MISS"


def big_run(runs: Path, lanes: int) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"k": lanes, "max_concurrency": lanes, "seed": 1, "min_quorum": 1},
            "backend": {"kind": "simulated", "latency_ms": [0, 0], "accuracy": 0.6},
            "budget": {"max_tokens": 10**9, "max_cost_usd": 10.0},
        }
    )
    lanefold.run_sync(config, "What is 17 * 23?", runs_dir=runs, run_id="big")


def many_runs(runs: Path, count: int) -> None:
    config = lanefold.parse_config({"loop": {"k": 2, "seed": 1}, "backend": {"kind": "simulated"}})
    lanefold.run_sync(config, "What is 17 * 23?", runs_dir=runs, run_id="seed")
    lines = (runs / "seed" / "events.jsonl").read_text().splitlines()
    for i in range(count):
        run_id = f"r{i:05d}"
        folder = runs / run_id
        folder.mkdir()
        body = [json.loads(line) for line in lines]
        for event in body:
            event["run_id"] = run_id
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in body))
    shutil.rmtree(runs / "seed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=1000)
    parser.add_argument("--postgres", action="store_true", help="only the runs list on PostgreSQL")
    args = parser.parse_args()
    if args.postgres:
        postgres_list(args.runs)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big_run(root / "big", args.lanes)
        store = open_store(None, root / "big")
        fold_ms = _median_ms(lambda: read_run(store, "big"))
        print(f"run of {args.lanes} lanes: read_run (baseline) {fold_ms:.0f} ms")
        page_ms = _median_ms(lambda: TestClient(create_app(store)).get("/runs/big"))
        ratio = page_ms / fold_ms
        print(
            f"run of {args.lanes} lanes: GET /runs/big server time {page_ms:.0f} ms ({ratio:.2f}x the fold)"
        )
        browser_ms = _render_ms(create_app(store), args.lanes)
        if browser_ms is not None:
            verdict = _verdict(browser_ms, 1000)
            shown = f"page rendered in Chromium {browser_ms:.0f} ms, target < 1000 ms: {verdict}"
            print(f"run of {args.lanes} lanes: {shown}")

        many_runs(root / "many", args.runs)
        store_ms = _median_ms(lambda: open_store(None, root / "many").list_runs(limit=51))
        listed = open_store(None, root / "many")
        client = TestClient(create_app(listed))
        first_ms = _median_ms(lambda: client.get("/"))
        sixth_ms = _median_ms(lambda: client.get("/?page=5"))
        print(f"{args.runs} runs: list_runs(limit=51), every log read (baseline) {store_ms:.0f} ms")
        for name, ms in (("first page", first_ms), ("sixth page", sixth_ms)):
            print(
                f"{args.runs} runs: {name} server time {ms:.0f} ms ({ms / store_ms:.2f}x the store's list), "
                f"target < 300 ms: {_verdict(ms, 300)}"
            )


def postgres_list(count: int) -> None:
    """The runs list over `count` runs in PostgreSQL, against a read of every run's head and tail."""
    from pgserver import PgServer

    with tempfile.TemporaryDirectory(prefix="lanefold-pg-") as tmp:
        server = PgServer.start(Path(tmp))
        try:
            url = server.url(server.create_database())
            config = lanefold.parse_config({"loop": {"k": 2, "seed": 1}, "backend": {"kind": "simulated"}})
            lanefold.run_sync(config, "What is 17 * 23?", store=url, run_id="seed")
            store = open_store(url)
            events = [e.model_dump(mode="json") for e in store.reader("seed").read()]
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                for i in range(count):
                    run_id = f"r{i:05d}"
                    conn.execute("INSERT INTO lanefold_runs (run_id) VALUES (%s)", (run_id,))
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO lanefold_events (run_id, sequence, type, body)"
                            " VALUES (%s, %s, %s, %s)",
                            [
                                (run_id, e["sequence"], e["type"], json.dumps({**e, "run_id": run_id}))
                                for e in events
                            ],
                        )
            every = (
                "SELECT r.run_id, f.body, t.body FROM lanefold_runs r"
                " JOIN lanefold_events f ON f.run_id = r.run_id AND f.sequence = 1"
                " JOIN LATERAL (SELECT body FROM lanefold_events e WHERE e.run_id = r.run_id"
                " ORDER BY e.sequence DESC LIMIT 1) t ON true"
            )
            with psycopg.connect(url) as conn:
                scan_ms = _median_ms(lambda: conn.execute(every).fetchall())
            client = TestClient(create_app(open_store(url)))
            first_ms = _median_ms(lambda: client.get("/"))
            sixth_ms = _median_ms(lambda: client.get("/?page=5"))
            failed_ms = _median_ms(lambda: client.get("/?status=failed"))
        finally:
            server.stop()
    print(f"{count + 1} runs, PostgreSQL: every run's head and tail in one query (baseline) {scan_ms:.0f} ms")
    for name, ms in (
        ("first page", first_ms),
        ("sixth page", sixth_ms),
        ("status=failed (no match)", failed_ms),
    ):
        print(
            f"{count + 1} runs, PostgreSQL: {name} server time {ms:.0f} ms ({ms / scan_ms:.2f}x the scan), "
            f"target < 300 ms: {_verdict(ms, 300)}"
        )


def _render_ms(app: object, lanes: int) -> float | None:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("no playwright: the browser figure is skipped (pip install playwright)")
        return None
    if chromium is None:
        print("no chromium: the browser figure is skipped (apt-get install chromium)")
        return None
    with Loopback(app) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        times = []
        for _ in range(5):
            page.goto(f"http://127.0.0.1:{server.port}/runs/big")
            assert page.locator("#waves [data-lane]").count() == lanes  # the lanes, not their waterfall bars
            times.append(page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd"))
        browser.close()
    return float(statistics.median(times))


if __name__ == "__main__":
    main()
