"""Per-lane orchestration overhead of the dispatch path, against its floor and LangGraph.

An instant simulated backend (no latency, no faults, one lane per backend call, like a remote
endpoint without `n`-merging) is driven three ways at K = 10, 100, 1000, 10000 lanes:

- ours: `orchestrator.run` (the real path: config, run store, JSONL event log with fsync
  policy `barrier`, budget ledger, dispatch, barrier, majority vote, result), max_concurrency K;
- bare: an anyio task group calling `SimulatedBackend.sample` once per lane (the floor);
- LangGraph: a StateGraph fanning out with `Send` into a node that calls the same backend,
  joined by an `operator.add` reducer and a vote node, with its async SQLite checkpointer.

Sides are interleaved per repetition and warmed up once; the median is reported as microseconds
per lane, with ratios measured in the same run. Wall time is the figure; process CPU time is
printed beside it because it is steadier on a machine shared with other work. Targets are
printed as PASS/MISS, never asserted. Peak memory is the growth of resident memory (RSS, sampled
every 2 ms) over one run, in a fresh subprocess per side after a K = 10 warm-up there.

    PYTHONPATH=. .venv/bin/python bench/dispatch.py [--quick] [--max-langgraph-k 1000]
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import itertools
import json
import operator
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import anyio

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, sample_all

try:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send
except ImportError:  # a benchmark-only dependency: `pip install -e '.[bench]'`
    StateGraph = None  # type: ignore[assignment,misc]

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is 17 * 23?"
OTEL_PORT = 0  # set in main(): a port nothing listens on
PROMPT = f"Question: {QUESTION}"
INSTANT = SimulatedConfig(latency_ms=(0.0, 0.0), failure_rate=0.0, lanes_per_request=1)
PARAMS = SamplingParams()
DURABILITY = {
    "ours": "JSONL, one write() per event (2 per lane); fsync at the barrier, reduce, run end",
    "ours-always": "as ours, with fsync after every event (policy `always`; K=1000 only)",
    "ours-otel": "as ours, plus the otel hook exporting to an endpoint that is down (K=1000 only)",
    "bare": "none (no log, no budget, no record)",
    "langgraph": "AsyncSqliteSaver defaults (WAL, synchronous=FULL, durability='async'): "
    "one committed, fsynced write per lane, a checkpoint per superstep",
}


@dataclass(slots=True)
class Timing:
    wall: float = 0.0
    cpu: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Timing]:
    timing = Timing()
    wall, cpu = time.perf_counter(), time.process_time()
    yield timing
    timing.wall, timing.cpu = time.perf_counter() - wall, time.process_time() - cpu


# -- the sides: each runs K lanes once and times only the run itself ----------------------------


async def run_ours(k: int, scratch: Path, fsync: str = "barrier") -> Timing:
    config = lanefold.parse_config(
        {
            "loop": {"k": k, "max_concurrency": k},
            "backend": INSTANT.model_dump(mode="json"),
            "log": {"fsync": fsync},
        }
    )
    with stopwatch() as timing:
        result = await lanefold.run(config, QUESTION, runs_dir=scratch)
    if result.lanes_completed != k or result.answer is None:
        raise RuntimeError(f"ours: {result.lanes_completed} of {k} lanes completed")
    return timing


async def run_ours_always(k: int, scratch: Path) -> Timing:
    return await run_ours(k, scratch, fsync="always")


def _port_nothing_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_ours_otel(k: int, scratch: Path) -> Timing:
    """ours with the otel hook, its OTLP endpoint down: what a hook costs the dispatch path."""
    config = lanefold.parse_config(
        {
            "loop": {"k": k, "max_concurrency": k},
            "backend": INSTANT.model_dump(mode="json"),
            "hooks": [{"kind": "otel", "endpoint": f"http://127.0.0.1:{OTEL_PORT}", "timeout_s": 0.5}],
        }
    )
    with stopwatch() as timing:
        result = await lanefold.run(config, QUESTION, runs_dir=scratch)
    if result.lanes_completed != k or result.answer is None:
        raise RuntimeError(f"ours-otel: {result.lanes_completed} of {k} lanes completed")
    return timing


async def run_bare(k: int, scratch: Path) -> Timing:
    backend = SimulatedBackend(INSTANT)
    samples: list[Sample] = []

    async def lane(i: int) -> None:
        out = await sample_all(backend, SampleRequest(PROMPT, PARAMS, (LaneRequest(i, i, 256),)))
        samples.append(out[0])  # type: ignore[arg-type]  # no faults at failure_rate 0

    with stopwatch() as timing:
        async with anyio.create_task_group() as tg:
            for i in range(k):
                tg.start_soon(lane, i)
    if len(samples) != k:
        raise RuntimeError(f"bare: {len(samples)} of {k} lanes completed")
    return timing


class _Graph(TypedDict):
    k: int
    texts: Annotated[list[str], operator.add]
    answer: str


class _Lane(TypedDict):
    lane: int


def _langgraph(backend: SimulatedBackend) -> Any:
    async def lane(state: _Lane) -> dict[str, list[str]]:
        i = state["lane"]
        out = await sample_all(backend, SampleRequest(PROMPT, PARAMS, (LaneRequest(i, i, 256),)))
        return {"texts": [out[0].text]}  # type: ignore[union-attr]

    def fan_out(state: _Graph) -> list[Any]:
        return [Send("lane", {"lane": i}) for i in range(state["k"])]

    def vote(state: _Graph) -> dict[str, str]:
        votes = collections.Counter(t.rsplit("Answer:", 1)[-1].strip() for t in state["texts"])
        return {"answer": votes.most_common(1)[0][0]}

    graph = StateGraph(_Graph)
    graph.add_node("lane", lane)
    graph.add_node("vote", vote)
    graph.add_conditional_edges(START, fan_out, ["lane"])
    graph.add_edge("lane", "vote")
    graph.add_edge("vote", END)
    return graph


async def run_langgraph(k: int, scratch: Path) -> Timing:
    # Graph, connection, schema and compile come before the clock: that favours LangGraph.
    graph = _langgraph(SimulatedBackend(INSTANT))
    async with AsyncSqliteSaver.from_conn_string(str(scratch / "checkpoints.db")) as saver:
        await saver.setup()
        app = graph.compile(checkpointer=saver)
        with stopwatch() as timing:
            out = await app.ainvoke({"k": k, "texts": []}, {"configurable": {"thread_id": "b"}})
    if len(out["texts"]) != k or not out["answer"]:
        raise RuntimeError(f"langgraph: {len(out['texts'])} of {k} lanes completed")
    return timing


SIDES: dict[str, Callable[[int, Path], Awaitable[Timing]]] = {
    "ours": run_ours,
    "ours-always": run_ours_always,
    "ours-otel": run_ours_otel,
    "bare": run_bare,
    "langgraph": run_langgraph,
}


async def timed(side: str, k: int) -> Timing:
    """One run in a scratch directory of its own, after a full collection."""
    scratch = Path(tempfile.mkdtemp(prefix=f"lanefold-bench-{side}-"))
    try:
        gc.collect()
        return await SIDES[side](k, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- memory: peak RSS growth over one run, in a fresh subprocess per side ----------------------


def _rss() -> int:
    with open("/proc/self/statm") as statm:  # Linux: resident pages are the second field
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(side: str, k: int) -> None:
    async def main() -> None:
        await timed(side, 10)  # imports and first-call caches land before the baseline
        gc.collect()
        base = peak = _rss()
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.002):
                peak = max(peak, _rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        await timed(side, k)
        done.set()
        sampler.join()
        print(json.dumps({"side": side, "k": k, "bytes": max(peak, _rss()) - base}))

    anyio.run(main)


def measure_memory(jobs: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
    """Peak RSS growth of one run (C heaps such as SQLite's included), in fresh interpreters.

    The timings are done by now, so the children run side by side.
    """
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    children = {
        job: subprocess.Popen(
            [sys.executable, __file__, "--memory-child", job[0], str(job[1])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        for job in jobs
    }
    peaks: dict[tuple[str, int], int | None] = {}
    for job, child in children.items():
        out, err = child.communicate(timeout=600)
        if child.returncode != 0:
            print(f"  memory child {job[0]} K={job[1]} failed: {err.strip()[-300:]}")
            peaks[job] = None
        else:
            peaks[job] = int(json.loads(out.strip().splitlines()[-1])["bytes"])
    return peaks


# -- the run and the report ---------------------------------------------------------------------


@dataclass(slots=True)
class Plan:
    ks: list[int]
    reps: int
    reps_large: int  # repetitions at K = 10000
    max_langgraph_k: int
    langgraph_budget_s: float

    def reps_at(self, k: int) -> int:
        return self.reps_large if k >= 10_000 else self.reps


class Results:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], list[Timing]] = collections.defaultdict(list)
        self.skipped: dict[int, str] = {}

    def per_lane(self, side: str, k: int, cpu: bool = False) -> float | None:
        runs = self.runs.get((side, k))
        if not runs:
            return None
        return statistics.median(t.cpu if cpu else t.wall for t in runs) / k * 1e6

    def langgraph_fits(self, k: int, plan: Plan) -> bool:
        """LangGraph is slow at large K: skip a K above the cap or over the time budget."""
        if k in self.skipped:
            return False
        if k > plan.max_langgraph_k:
            self.skipped[k] = f"above --max-langgraph-k {plan.max_langgraph_k}"
            return False
        measured = [
            (kk, statistics.median(t.wall for t in v))
            for (side, kk), v in self.runs.items()
            if side == "langgraph" and kk < k
        ]
        if measured and not self.runs.get(("langgraph", k)):
            kk, wall = max(measured)
            estimate = wall / kk * k * plan.reps_at(k)
            if estimate > plan.langgraph_budget_s:
                self.skipped[k] = (
                    f"~{estimate:.0f} s estimated for {plan.reps_at(k)} runs, "
                    f"over --langgraph-budget-s {plan.langgraph_budget_s:.0f}"
                )
                return False
        return True


async def measure(plan: Plan, sides: list[str]) -> Results:
    results = Results()
    for side in sides:  # warm up once: imports, pydantic schemas, first-call caches
        await timed(side, 100)
    for rep in range(plan.reps):
        for k in plan.ks:
            if rep >= plan.reps_at(k):
                continue
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]  # interleave the sides
            for side in order:
                if side in ("ours-always", "ours-otel") and (k != 1000 or rep >= 2):
                    continue  # the matched-durability comparison: K = 1000, two runs at most
                if side == "langgraph" and not results.langgraph_fits(k, plan):
                    continue
                results.runs[side, k].append(await timed(side, k))
    return results


def verdict(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'MISS'}  {what}")


def report(plan: Plan, res: Results, sides: list[str], seconds: float) -> None:
    print(
        f"\nlanefold dispatch benchmark: {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, {plan.reps} repetition(s)"
        f"{f' ({plan.reps_large} at K=10000)' if 10_000 in plan.ks else ''}, medians; "
        f"timed runs took {seconds:.0f} s\n"
    )
    for cpu in (False, True):
        what = "process CPU time" if cpu else "wall time"
        head = (
            f"{'K':>6} | {'ours us/lane':>12} | {'bare us/lane':>12} | {'ours/bare':>9} | "
            f"{'LangGraph us/lane':>17} | {'LangGraph/ours':>14}   [{what}]"
        )
        print(head)
        print("-" * len(head))
        for k in plan.ks:
            ours, bare = res.per_lane("ours", k, cpu), res.per_lane("bare", k, cpu)
            lg = res.per_lane("langgraph", k, cpu)
            assert ours is not None and bare is not None
            lg_cells = (
                f"{lg:17.1f} | {lg / ours:13.2f}x" if lg is not None else f"{'skipped':>17} | {'-':>14}"
            )
            print(f"{k:>6} | {ours:12.1f} | {bare:12.1f} | {ours / bare:8.2f}x | {lg_cells}")
        otel = res.per_lane("ours-otel", 1000, cpu)
        ours_1000 = res.per_lane("ours", 1000, cpu)
        if otel is not None and ours_1000 is not None:
            print(
                f"  ours with the otel hook (endpoint down) at K=1000: {otel:.1f} us/lane, "
                f"{otel / ours_1000:.2f}x ours (target <= 1.1x)"
            )
        always = res.per_lane("ours-always", 1000, cpu)
        lg = res.per_lane("langgraph", 1000, cpu)
        if always is not None:
            versus = f"; LangGraph/ours-always = {lg / always:.2f}x" if lg is not None else ""
            print(f"  ours with fsync=always at K=1000: {always:.1f} us/lane{versus}")
        print()
    print("durability:")
    for side in sides:
        print(f"  {side:>11}: {DURABILITY[side]}")
    for k, why in res.skipped.items():
        print(f"  note: LangGraph skipped at K={k}: {why}")

    print("\nlinearity (a fixed per-run cost inflates us/lane at small K):")
    walls = {k: statistics.median(t.wall for t in res.runs["ours", k]) for k in plan.ks}
    big = [k for k in plan.ks if k >= 100]
    for lo, hi in itertools.pairwise(big):
        print(
            f"  ours: {(walls[hi] - walls[lo]) / (hi - lo) * 1e6:.1f} us per added lane from K={lo} to K={hi}"
        )
    small, ref = plan.ks[0], 1000 if 1000 in plan.ks else plan.ks[-1]
    fixed = walls[small] - small * walls[ref] / ref
    print(
        f"  ours: fixed cost per run ~{fixed * 1e3:.1f} ms (K={small} less {small} lanes at the "
        f"K={ref} rate): run store, config hash, run.started, three fsyncs, result"
    )
    lo, hi = big[-2], big[-1]
    growth = walls[hi] / hi / (walls[lo] / lo)
    verdict(
        growth <= 1.5,
        f"overhead linear in K: ours us/lane at K={hi} is {growth:.2f}x that at K={lo} (target <= 1.5x)",
    )
    if 1000 in plan.ks:
        w = [res.per_lane(s, 1000) for s in ("ours", "bare", "langgraph")]
        c = [res.per_lane(s, 1000, cpu=True) for s in ("ours", "bare", "langgraph")]
        assert w[0] and w[1] and c[0] and c[1]
        verdict(
            w[0] / w[1] <= 5, f"within 5x of bare at K=1000: {w[0] / w[1]:.2f}x wall ({c[0] / c[1]:.2f}x CPU)"
        )
        if w[2] is not None and c[2] is not None:
            verdict(
                w[2] / w[0] >= 5,
                f"at least 5x less per-lane overhead than LangGraph at "
                f"K=1000: {w[2] / w[0]:.2f}x wall ({c[2] / c[0]:.2f}x CPU)",
            )
        else:
            print("MISS  LangGraph at K=1000 not measured (langgraph missing or skipped)")

    print(
        "\npeak memory (growth of resident memory over one run, sampled every 2 ms, fresh "
        "subprocess per side):"
    )
    if not Path("/proc/self/statm").exists():
        print("  unavailable: needs Linux /proc")
        return
    top = max(plan.ks)
    todo = [("ours", top), ("bare", top)]
    lg_k = max((k for k in plan.ks if res.runs.get(("langgraph", k))), default=None)
    if lg_k is not None:
        todo += [("langgraph", lg_k)] + ([("ours", lg_k)] if lg_k != top else [])
    for (side, k), peak in measure_memory(todo).items():
        if peak is not None:
            print(f"  {side:>9} K={k:>5}: {peak / 2**20:7.1f} MiB ({peak / k / 1024:.2f} KiB/lane)")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 10, 100, 1000; one repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions for K <= 1000")
    parser.add_argument("--reps-large", type=int, default=3, help="repetitions at K = 10000")
    parser.add_argument("--max-langgraph-k", type=int, default=1000)
    parser.add_argument(
        "--langgraph-budget-s",
        type=float,
        default=60.0,
        help="skip a LangGraph K whose runs are estimated to take longer",
    )
    parser.add_argument("--memory-child", nargs=2, metavar=("SIDE", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    global OTEL_PORT
    OTEL_PORT = _port_nothing_listens_on()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    reps = 1 if args.quick else args.reps
    plan = Plan(
        [10, 100, 1000] if args.quick else [10, 100, 1000, 10_000],
        reps,
        min(reps, args.reps_large),
        args.max_langgraph_k,
        args.langgraph_budget_s,
    )
    sides = ["ours", "bare", "ours-always"]
    if importlib.util.find_spec("opentelemetry.sdk") is not None:
        sides.append("ours-otel")
    if StateGraph is None:
        print("note: langgraph is not installed (pip install -e '.[bench]'); LangGraph skipped")
    else:
        sides.append("langgraph")
    gc.collect()
    gc.freeze()  # the imported modules are no run's garbage: keep them out of every collection
    start = time.perf_counter()
    results = anyio.run(measure, plan, sides)
    report(plan, results, sides, time.perf_counter() - start)


if __name__ == "__main__":
    main()
