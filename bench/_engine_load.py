"""The `load` rows of bench/engine.py: SmolLM2 ready to sample, each load in a fresh process.

Three ways, interleaved, `reps` times: the GGUF dequantised with no cache (the cache directory
cannot be created, so nothing is written: the path every load took before the cache), cold
(dequantised and the cache written into an empty directory) and warm (the cache just written,
read back). `load s` is `Engine.from_config` as the demo calls it (default pool, CPU), `load
cpu s` the CPU time it took (what a machine shared with other work cannot inflate as much);
`process s` adds the interpreter start and the imports (torch, tokenizers) before it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = """
import json, time
t0 = time.perf_counter()
from lanefold.backends.engine import EngineConfig
from lanefold.backends.engine._engine import Engine
t1, c1 = time.perf_counter(), time.process_time()
Engine.from_config(EngineConfig(model="smollm2-135m", device="cpu", threads={threads}))
print(json.dumps({{"load": time.perf_counter() - t1, "cpu": time.process_time() - c1}}))
"""


def _measure(cache: str, threads: int) -> tuple[float, float, float]:
    env = {**os.environ, "LANEFOLD_CACHE": cache, "PYTHONPATH": str(ROOT)}
    start = _now()
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(threads=threads)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    total = _now() - start
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return figures["load"], total, figures["cpu"]


def _now() -> float:
    import time

    return time.perf_counter()


def bench_load(reps: int, threads: int) -> None:
    """Print the load rows: median seconds and cold / warm ratios measured in this run."""
    walls: dict[str, list[tuple[float, float, float]]] = {"gguf, no cache": [], "cold": [], "warm": []}
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            blocked = Path(tmp) / "file"
            blocked.write_text("")  # a file where the cache directory would go: never written
            walls["gguf, no cache"].append(_measure(str(blocked), threads))
            walls["cold"].append(_measure(tmp, threads))
            walls["warm"].append(_measure(tmp, threads))
    warm_load = statistics.median(w[0] for w in walls["warm"])
    warm_total = statistics.median(w[1] for w in walls["warm"])
    warm_cpu = statistics.median(w[2] for w in walls["warm"])
    print(
        f"\nload: SmolLM2-135M GGUF to a ready Engine (device cpu), fresh process each, "
        f"median of {reps} interleaved; 'vs warm' = this row / warm (higher: warm is faster)"
    )
    print(
        f"{'load':<18} {'load s':>8} {'vs warm':>8} {'load cpu s':>11} {'vs warm':>8} "
        f"{'process s':>10} {'vs warm':>8}"
    )
    for name, runs in walls.items():
        load = statistics.median(w[0] for w in runs)
        total = statistics.median(w[1] for w in runs)
        cpu = statistics.median(w[2] for w in runs)
        print(
            f"{name:<18} {load:8.2f} {load / warm_load:7.1f}x {cpu:11.2f} {cpu / warm_cpu:7.1f}x "
            f"{total:10.2f} {total / warm_total:7.1f}x"
        )
    sys.stdout.flush()
