"""The openai backend's HTTP client against a fake upstream: CPU and wall a request, httpx's own
transport (the baseline) against the backend's (`PooledTransport`: aiohttp's pool on asyncio).

The upstream is `bench/gateway_litellm.py`'s fake (starlette on uvicorn, its own process,
answering every chat completion at once). In this process an `httpx.AsyncClient` as the
backend builds it (JSON body, whole body read, parsed) sends REQUESTS requests from C tasks at
once, C = 1 and 32, on each transport in turn, the two interleaved for `--reps` rounds; the
client's own CPU (user + system, `resource.getrusage`) and wall time per request, medians over
the rounds, and the ratio of the backend's transport to httpx's. Nothing is asserted.

    PYTHONPATH=. .venv/bin/python bench/upstream_client.py [--requests 2000] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway import free_port, machine, process  # a script beside this one

from lanefold.backends.openai import PooledTransport

BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "What is 17 * 23?"}]}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def block(url: str, clients: int, requests: int, transport: httpx.AsyncBaseTransport | None) -> None:
    left = list(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60, transport=transport) as http:

        async def client() -> None:
            while left:
                left.pop()
                response = await http.post(url, json=BODY)
                assert response.status_code == 200, response.text
                response.json()

        async with anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests a block")
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()
    sides = {
        "httpx's transport": lambda clients: None,
        "PooledTransport": lambda clients: PooledTransport(max_connections=clients),
    }
    versions = f"aiohttp {aiohttp.__version__}, httpx {httpx.__version__}"
    print(f"upstream client: {machine()}, {versions}")
    with tempfile.TemporaryDirectory(prefix="upstream-client-") as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}/v1"
        fake = [sys.executable, str(Path(__file__).with_name("gateway_litellm.py")), str(port)]
        with process(fake, Path(tmp) / "upstream.log", f"{base}/models"):
            for clients in (1, 32):
                got: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
                asyncio.run(block(f"{base}/chat/completions", clients, 200, None))  # warm-up
                for _ in range(args.reps):
                    for name, make in sides.items():
                        cpu, wall = cpu_s(), time.perf_counter()
                        asyncio.run(block(f"{base}/chat/completions", clients, args.requests, make(clients)))
                        per = 1e3 / args.requests
                        got[name].append(((cpu_s() - cpu) * per, (time.perf_counter() - wall) * per))
                medians = {n: [statistics.median(r[i] for r in got[n]) for i in (0, 1)] for n in got}
                base_cpu, base_wall = medians["httpx's transport"]
                for name, (cpu, wall) in medians.items():
                    print(
                        f"{clients:>2} client(s), {name:>18}: "
                        f"{cpu:.3f} ms CPU/request ({cpu / base_cpu:.2f}x), "
                        f"{wall:.3f} ms wall/request ({wall / base_wall:.2f}x), "
                        f"medians of {args.reps} rounds of {args.requests}"
                    )


if __name__ == "__main__":
    main()
