"""What `orchestrator eval` costs on top of its runs, and what sharing one engine buys.

1. Overhead. An instant simulated backend (no latency, no faults) at K = 8 lanes, N = 1,000
   questions, run two ways through one Session each:
   - eval: `run_eval` at concurrency 1 (every question a governed run `<eval_id>-<i>`, each
     scored, appended to results.jsonl, then results.csv and summary.json written);
   - loop: a plain `for` loop awaiting `Session.run` on each question (the runs and their logs,
     nothing else).
   Both are sequential, so the ratio is the eval's own bookkeeping, not concurrency. Sides are
   interleaved per repetition after a warm-up; the median is reported. Target: eval within 1.2x.
2. Sharing. SmolLM2-135M on the bundled engine (CPU unless CUDA is there), one loaded model,
   `run_eval` over the same arithmetic questions at Q = 1 and Q = 8 questions in flight (K = 4
   lanes each at temperature 0.8, 8 tokens at most): questions per second. On the engine the
   lanes of concurrent questions decode in one batch. Target: Q = 8 at least 2x Q = 1. Skipped
   (said so) where the engine or its model is not installed.

Targets are printed as PASS/MISS, never asserted. Wall time is the figure; process CPU time is
printed beside it, steadier on a machine shared with other work.

    PYTHONPATH=. .venv/bin/python bench/eval.py [--quick] [--questions 1000] [--repeats 3]
                                                [--engine-questions 32] [--engine-repeats 3]
                                                [--skip-engine]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

import lanefold
from lanefold.backends.simulated import SimulatedConfig
from lanefold.evaluate import Item
from lanefold.evaluate._eval import run_eval
from lanefold.primitives import Backend, ConfigError

INSTANT = SimulatedConfig(answer="391", accuracy=0.7, latency_ms=(0.0, 0.0), failure_rate=0.0, seed=0)
TEMPLATE = (
    "Question: What is 120 plus 35?\nAnswer: 155\n\n"
    "Question: What is 25 times 3?\nAnswer: 75\n\nQuestion: {question}\nAnswer:"
)


@dataclass(slots=True)
class Timing:
    wall: float
    cpu: float


async def stopwatch(work: Callable[[], Awaitable[Any]]) -> Timing:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    await work()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def sim_config(k: int) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {"loop": {"k": k, "max_concurrency": k}, "backend": INSTANT.model_dump(mode="json")}
    )


def sim_items(n: int) -> list[Item]:
    return [Item(i, f"What is 17 * 23? (question {i})", "391") for i in range(n)]


async def eval_side(
    config: lanefold.LoopConfig,
    items: list[Item],
    scratch: Path,
    concurrency: int = 1,
    backend: Backend | None = None,
) -> Timing:
    async def work() -> None:
        summary = await run_eval(
            config, items, eval_id="bench", runs_dir=scratch, concurrency=concurrency, backend=backend
        )
        if summary.n != len(items) or summary.failed:
            raise RuntimeError(f"eval: {summary.n} rows, {summary.failed} failed")

    return await stopwatch(work)


async def loop_side(config: lanefold.LoopConfig, items: list[Item], scratch: Path) -> Timing:
    async def work() -> None:
        async with lanefold.Session(config, runs_dir=scratch) as session:
            for item in items:
                result = await session.run(item.question, run_id=f"bench-{item.index}")
                if result.answer is None:
                    raise RuntimeError(f"loop: no answer to question {item.index}")

    return await stopwatch(work)


async def timed(side: Callable[[Path], Awaitable[Timing]]) -> Timing:
    scratch = Path(tempfile.mkdtemp(prefix="lanefold-bench-eval-"))
    try:
        return await side(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


async def overhead(n: int, k: int, repeats: int) -> None:
    config, items = sim_config(k), sim_items(n)
    sides: dict[str, Callable[[Path], Awaitable[Timing]]] = {
        "eval": lambda scratch: eval_side(config, items, scratch),
        "loop": lambda scratch: loop_side(config, items, scratch),
    }
    await timed(lambda scratch: eval_side(config, items[:20], scratch))  # warm-up: imports
    await timed(lambda scratch: loop_side(config, items[:20], scratch))  # and first-call caches
    runs: dict[str, list[Timing]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, side in sides.items():
            runs[name].append(await timed(side))
    wall = {name: statistics.median(t.wall for t in ts) for name, ts in runs.items()}
    cpu = {name: statistics.median(t.cpu for t in ts) for name, ts in runs.items()}
    print(f"\n1. eval overhead: instant simulated backend, K = {k}, N = {n} questions, median of {repeats}")
    print(f"{'side':<6} {'wall s':>8} {'ms/question':>12} {'cpu s':>8}")
    for name in sides:
        print(f"{name:<6} {wall[name]:>8.2f} {1000 * wall[name] / n:>12.3f} {cpu[name]:>8.2f}")
    ratio, cpu_ratio = wall["eval"] / wall["loop"], cpu["eval"] / cpu["loop"]
    print(f"eval / loop: {ratio:.3f}x wall, {cpu_ratio:.3f}x cpu (target <= 1.2x: {verdict(ratio <= 1.2)})")


async def sharing(n: int, repeats: int) -> None:
    print(
        f"\n2. one engine shared: SmolLM2-135M, K = 4, {n} questions, questions/s at Q = 1 "
        f"and Q = 8, median of {repeats}"
    )
    try:
        from lanefold.backends.engine import EngineBackend, EngineConfig

        backend = EngineBackend(EngineConfig(model="smollm2-135m"))
        config = lanefold.parse_config(
            {
                "loop": {"k": 4, "seed": 0},
                "prompt": {"template": TEMPLATE},
                "sampling": {"temperature": 0.8, "max_tokens": 8, "stop": ["\n"]},
                "extract": {"method": "last_number"},
                "backend": {"kind": "engine"},
            }
        )
        questions = [
            Item(i, f"What is {a} plus {b}?", str(a + b))
            for i, (a, b) in enumerate((a, b) for a in range(10, 99, 7) for b in range(3, 60, 11))
        ][:n]
        await timed(lambda scratch: eval_side(config, questions[:4], scratch, 4, backend))  # load
    except (ImportError, ConfigError) as exc:
        print(f"SKIP: the engine or its model is not installed here ({exc})")
        return
    try:
        runs: dict[int, list[Timing]] = {1: [], 8: []}
        for repeat in range(repeats):
            for q in sorted(runs, reverse=repeat % 2 == 1):  # alternate which goes first
                runs[q].append(
                    await timed(
                        lambda scratch, q=q: eval_side(  # type: ignore[misc]
                            config, questions, scratch, q, backend
                        )
                    )
                )
    finally:
        await backend.aclose()
    rate = {q: n / statistics.median(t.wall for t in ts) for q, ts in runs.items()}
    for q, value in rate.items():
        each = ", ".join(f"{n / t.wall:.2f}" for t in runs[q])
        print(f"Q = {q}: {value:.2f} questions/s (each repeat: {each})")
    ratio = rate[8] / rate[1]
    print(f"Q = 8 / Q = 1: {ratio:.2f}x (target >= 2x: {verdict(ratio >= 2.0)})")


async def main(args: argparse.Namespace) -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, {platform.platform()}"
    )
    await overhead(args.questions, 8, args.repeats)
    if not args.skip_engine:
        await sharing(args.engine_questions, args.engine_repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--engine-questions", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine-repeats", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="200 questions, 1 repeat, 16 on the engine, 1 repeat there"
    )
    parser.add_argument("--skip-engine", action="store_true")
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.questions, parsed.repeats, parsed.engine_questions = 200, 1, 16
        parsed.engine_repeats = 1
    anyio.run(main, parsed)
