"""Questions per second of `run_eval` in one process and on 1 and 2 Ray workers.

The same eval (simulated backend, K = 4 lanes a question, fixed latency, JSONL store in a
temporary folder) three ways, each a fresh eval id, sides interleaved per repetition:
- local: the in-process executor (the default), Q questions in flight;
- ray-1: `RayExecutor(workers=1)`, Q questions in flight on the worker;
- ray-2: `RayExecutor(workers=2)`, Q in flight on each worker (2Q in all).
Two workloads: `latency` (each lane waits --latency-ms: the shape of a remote model, where a
worker's gain is more questions in flight) and `cpu` (no latency: the orchestration's own CPU
per lane, logging and folding, is the bottleneck, and a second worker adds a second process).

One local Ray cluster is started before timing (not timed). Each side's figure is questions
per second over the whole call (worker start and backend load included), and over the steady
part (from the result a quarter of the way through, when every worker is up, to the last).
Ratios are against local, measured in the same run; the median of --repeats is printed.
Figures, not assertions: a shared machine moves them.

    PYTHONPATH=. .venv/bin/python bench/scale.py [--questions 200] [--concurrency 8]
                                                 [--latency-ms 100] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import lanefold
from lanefold.evaluate import Item
from lanefold.evaluate._eval import run_eval


def config(latency_ms: float) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 4, "seed": 3, "max_concurrency": 4},
            "backend": {
                "kind": "simulated",
                "accuracy": 0.6,
                "answer": "391",
                "distractors": ["381", "401"],
                "latency_ms": [latency_ms, latency_ms],
            },
            "log": {"fsync": "never"},
        }
    )


async def one(
    cfg: lanefold.LoopConfig, items: list[Item], folder: Path, concurrency: int, executor: Any
) -> tuple[float, float]:
    """(questions/s over the whole call, questions/s from the quarter mark to the end)."""
    seen: list[float] = []
    start = time.perf_counter()
    await run_eval(
        cfg,
        items,
        eval_id="bench",
        runs_dir=folder,
        concurrency=concurrency,
        executor=executor,
        on_result=lambda _: seen.append(time.perf_counter()),
    )
    end = time.perf_counter()
    quarter = len(seen) // 4  # by then every worker has started and delivered
    return len(items) / (end - start), (len(seen) - 1 - quarter) / (seen[-1] - seen[quarter])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="40 questions, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.questions, args.repeats = 40, 1
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=100 * 1024 * 1024,
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, no GPU use; "
        f"python {platform.python_version()}, ray {ray.__version__}"
    )
    print(f"{args.questions} questions, K=4, Q={args.concurrency} per worker, median of {args.repeats}")
    items = [Item(i, f"Question number {i}?", "391") for i in range(args.questions)]
    sides: dict[str, Callable[[], Any]] = {
        "local": lambda: None,
        "ray-1": lambda: lanefold.RayExecutor(workers=1),
        "ray-2": lambda: lanefold.RayExecutor(workers=2),
    }
    root = Path(tempfile.mkdtemp(prefix="lanefold-bench-scale-"))
    try:
        for workload, latency in (("latency", args.latency_ms), ("cpu", 0.0)):
            cfg = config(latency)
            whole: dict[str, list[float]] = {name: [] for name in sides}
            steady: dict[str, list[float]] = {name: [] for name in sides}
            for repeat in range(args.repeats):
                for name, make in sides.items():
                    folder = root / f"{workload}-{name}-{repeat}"
                    w, s = anyio.run(one, cfg, items, folder, args.concurrency, make())
                    whole[name].append(w)
                    steady[name].append(s)
                    shutil.rmtree(folder, ignore_errors=True)
            title = (
                f"{workload}: each lane {latency:g} ms"
                if latency
                else f"{workload}: no latency (orchestration CPU bound)"
            )
            print(f"\n{title}")
            print(f"  {'side':<6} {'q/s whole':>10} {'ratio':>6} {'q/s steady':>11} {'ratio':>6}")
            base_w = statistics.median(whole["local"])
            base_s = statistics.median(steady["local"])
            for name in sides:
                w, s = statistics.median(whole[name]), statistics.median(steady[name])
                print(f"  {name:<6} {w:>10.1f} {w / base_w:>5.2f}x {s:>11.1f} {s / base_s:>5.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
