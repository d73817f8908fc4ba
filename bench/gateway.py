"""What the loop gateway adds to a run (issue 26's performance section).

`--overhead`: the same loop (parallel_sample, k = 8, majority vote) on the instant simulated
backend (no latency), every request a run recorded in a files store:

- in-process: `Session.run` awaited by 1 caller, then by 32 callers at once (asyncio tasks);
- gateway: `orchestrator serve --loops` in its own process, and an httpx client sending chat
  completions from 1, then 32, connections at once.

Per-request latency p50 and p99 of each, measured in this run, and the difference: what the
gateway adds (HTTP, JSON, the request's checks and config, its response). Target: at most 3 ms
added at p50, at 1 and at 32 clients. Printed, never asserted. On a 2-core machine the client
and the gateway share the cores: at 32 clients the figure includes that contention.

    PYTHONPATH=. .venv/bin/python bench/gateway.py --overhead [--requests 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

import lanefold

LOOP = """
[loop]
k = 8
max_concurrency = 8
seed = 7
min_quorum = 3
[prompt]
template = "Question: {question}\\nEnd with 'Answer: <number>'.\\n"
[extract]
method = "regex"
regex = 'Answer:\\s*([-0-9.,]+)'
[backend]
kind = "simulated"
latency_ms = [0, 0]
[budget]
max_tokens = 1000000
"""
QUESTION = "What is 17 * 23?"


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{len(os.sched_getaffinity(0))} cores, {model}, load {os.getloadavg()[0]:.2f}"


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


async def in_process(folder: Path, requests: int, clients: int) -> list[float]:
    config = lanefold.load_config(folder / "loops" / "vote.toml")
    latencies: list[float] = []
    async with lanefold.Session(
        config, runs_dir=folder / f"runs-session-{clients}-{time.monotonic_ns()}"
    ) as s:
        await s.run(QUESTION)  # warm

        async def caller(n: int) -> None:
            for _ in range(n):
                start = time.perf_counter()
                await s.run(QUESTION)
                latencies.append(time.perf_counter() - start)

        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(caller, requests // clients + (i < requests % clients))
    return latencies


async def over_http(url: str, requests: int, clients: int) -> list[float]:
    latencies: list[float] = []
    body = {"model": "vote", "messages": [{"role": "user", "content": QUESTION}]}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        (await client.post("/chat/completions", json=body)).raise_for_status()  # warm

        async def caller(n: int) -> None:
            for _ in range(n):
                start = time.perf_counter()
                response = await client.post("/chat/completions", json=body)
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()

        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(caller, requests // clients + (i < requests % clients))
    return latencies


def cpu_s(pid: int) -> float:
    """A process's user and system CPU seconds so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_gateway(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["serve", "--loops", "loops", "--runs-dir", "runs-gateway", "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, "-m", "lanefold", *args],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/models", timeout=1)
            return process, url
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the gateway did not start") from None
            time.sleep(0.05)


def overhead(requests: int, rounds: int) -> None:
    print(f"machine: {machine()}; python {sys.version.split()[0]}")
    print(
        f"loop: parallel_sample k = 8 on the instant simulated backend; "
        f"{requests} requests a side, {rounds} rounds"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "loops").mkdir()
        (folder / "loops" / "vote.toml").write_text(LOOP)
        process, url = start_gateway(folder)
        try:
            print(
                "| clients | Session.run p50 / p99 ms | gateway p50 / p99 ms | added p50 / p99 ms | target "
                "| CPU ms a request: Session.run / gateway process / httpx client |"
            )
            print("|---|---|---|---|---|---|")
            for clients in (1, 32):
                base: list[float] = []
                served: list[float] = []
                cpu = {"base": 0.0, "server": 0.0, "client": 0.0}
                for r in range(rounds):  # interleaved, the order turned each round
                    sides = [("base", in_process, folder), ("served", over_http, url)]
                    for name, fn, where in sides if r % 2 == 0 else reversed(sides):
                        mine, theirs = time.process_time(), cpu_s(process.pid)
                        got = anyio.run(fn, where, requests, clients)  # type: ignore[arg-type]
                        (base if name == "base" else served).extend(got)
                        if name == "base":
                            cpu["base"] += time.process_time() - mine
                        else:
                            cpu["client"] += time.process_time() - mine
                            cpu["server"] += cpu_s(process.pid) - theirs
                per = {k: 1000 * v / (rounds * (requests + 1)) for k, v in cpu.items()}
                b50, b99 = quantiles(base)
                s50, s99 = quantiles(served)
                added = 1000 * (s50 - b50)
                verdict = "PASS" if added <= 3.0 else "MISS"
                print(
                    f"| {clients} | {1000 * b50:.2f} / {1000 * b99:.2f} "
                    f"| {1000 * s50:.2f} / {1000 * s99:.2f} | "
                    f"**{added:.2f}** / {1000 * (s99 - b99):.2f} | 3 ms at p50: {verdict} "
                    f"| {per['base']:.2f} / {per['server']:.2f} / {per['client']:.2f} |"
                )
        finally:
            process.terminate()
            process.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", action="store_true", help="the gateway's overhead per request")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    overhead(args.requests, args.rounds)  # the one mode so far: --overhead


if __name__ == "__main__":
    main()
