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

`--optillm`: against optillm 0.4.0 (PyPI; a peer in a venv of its own, built once under
`${LANEFOLD_CACHE:-~/.cache/lanefold}/optillm-venv`) doing self-consistency over the same
upstream: `orchestrator serve` on the bundled engine (SmolLM2-135M, fp32, one thread), behind a
counting proxy. optillm's `self_consistency-` approach samples 5 answers one request at a time
(temperature 1) and returns the largest cluster of similar texts; the gateway serves a
parallel_sample loop with k = 5 at temperature 1 and majority vote on the last number, its
`openai` backend merging the wave into one `n = 5` request. The same chat request goes to both
(a system turn asking for the number, the question as the user's) for the first N questions of
the shipped 1-digit addition sample, alternating which goes first: upstream requests and prompt
tokens paid per client request (counted at the proxy), wall time per request, and accuracy (the
last number in the reply against the gold answer). Targets: one upstream request per wave where
the upstream honours `n`, and lower wall time at equal k.

    PYTHONPATH=. .venv/bin/python bench/gateway.py --overhead [--requests 400] [--rounds 3]
    PYTHONPATH=. .venv/bin/python bench/gateway.py --optillm [--questions 20]
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


OPTILLM = "optillm==0.4.0"
UPSTREAM = """
[backend]
kind = "engine"
model = "smollm2-135m"
device = "cpu"
threads = 1
"""
PEER_LOOP = """
[loop]
k = 5
max_concurrency = 5
seed = 7
min_quorum = 1
[prompt]
template = "{question}"
[sampling]
temperature = 1.0
max_tokens = %(max_tokens)d
[extract]
method = "last_number"
[backend]
kind = "openai"
base_url = "%(upstream)s"
model = "smollm2-135m"
n = "auto"
timeout_s = 600
[budget]
max_tokens = 10000000
"""
SYSTEM = "Answer with the number only."


def optillm_venv() -> Path:
    """optillm's own venv (built once): its many dependencies never meet the project's."""
    cache = Path(os.environ.get("LANEFOLD_CACHE", Path.home() / ".cache" / "lanefold"))
    venv = cache / "optillm-venv"
    python = venv / "bin" / "python"
    ok = (
        python.exists()
        and subprocess.run([str(python), "-c", "import optillm"], capture_output=True).returncode == 0
    )
    if not ok:
        print(f"building {venv} ({OPTILLM}, torch pinned to the CPU wheel); minutes, once")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = [str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0", OPTILLM, "torch==2.13.0"]
        if subprocess.run(install).returncode != 0:
            raise SystemExit(f"could not install {OPTILLM}: run {' '.join(install)} by hand")
    return python


class Counter:
    """A loopback proxy in front of the upstream, counting its requests and the prompt tokens
    its responses bill."""

    def __init__(self, upstream: str) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        client = httpx.AsyncClient(base_url=upstream, timeout=600)

        async def forward(request: Request) -> Response:
            body = await request.body()
            self.requests += 1
            got = await client.post(
                request.url.path.removeprefix("/v1"),
                content=body,
                headers={"content-type": "application/json"},
            )
            usage = got.json().get("usage") or {}
            self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.cached_tokens += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            return Response(got.content, status_code=got.status_code, media_type="application/json")

        async def models(request: Request) -> Response:
            got = await client.get("/models")
            return Response(got.content, status_code=got.status_code, media_type="application/json")

        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", forward, methods=["POST"]),
                Route("/v1/completions", forward, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
            ]
        )


def _wait(url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.2)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peer(questions: int, max_tokens: int) -> None:
    import json
    import re

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from loopback import Loopback

    python = optillm_venv()
    rows = [
        json.loads(line)
        for line in (
            Path(__file__).resolve().parents[1] / "examples/datasets/arithmetic/1_digit_addition.jsonl"
        )
        .read_text()
        .splitlines()[:questions]
    ]
    print(f"machine: {machine()}; optillm {OPTILLM.split('==')[1]}; {questions} questions, k = 5")
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "upstream.toml").write_text(UPSTREAM)
        up_port = _port()
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lanefold",
                "serve",
                "--backend-config",
                "upstream.toml",
                "--port",
                str(up_port),
            ],
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(upstream)
        try:
            _wait(f"http://127.0.0.1:{up_port}/v1", upstream, "the upstream")
            counter = Counter(f"http://127.0.0.1:{up_port}/v1")
            with Loopback(counter.app) as proxy:
                (folder / "loops").mkdir()
                loop = PEER_LOOP % {"max_tokens": max_tokens, "upstream": proxy.base_url}
                (folder / "loops" / "self_consistency.toml").write_text(loop)
                gw_port, opt_port = _port(), _port()
                gateway = subprocess.Popen(
                    [sys.executable, "-m", "lanefold", "serve", "--loops", "loops", "--port", str(gw_port)],
                    cwd=folder,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                processes.append(gateway)
                optillm = subprocess.Popen(
                    [
                        str(python),
                        "-m",
                        "optillm.server",
                        "--base-url",
                        proxy.base_url,
                        "--port",
                        str(opt_port),
                    ],
                    cwd=folder,
                    env={**os.environ, "OPENAI_API_KEY": "unused", "OPTILLM_API_KEY": ""},
                    stdout=subprocess.DEVNULL,
                    stderr=(folder / "optillm.log").open("wb"),
                )
                processes.append(optillm)
                _wait(f"http://127.0.0.1:{gw_port}/v1", gateway, "the gateway")
                _wait(f"http://127.0.0.1:{opt_port}/v1", optillm, "optillm")
                sides = {
                    "lanefold gateway": (f"http://127.0.0.1:{gw_port}/v1", "self_consistency"),
                    "optillm": (f"http://127.0.0.1:{opt_port}/v1", "self_consistency-smollm2-135m"),
                }
                figures: dict[str, dict[str, list[float]]] = {
                    n: {"requests": [], "prompt": [], "cached": [], "wall": [], "right": []} for n in sides
                }
                for i, row in enumerate(rows):
                    order = list(sides) if i % 2 == 0 else list(reversed(sides))
                    for name in order:
                        url, model = sides[name]
                        body = {
                            "model": model,
                            "messages": [
                                {"role": "system", "content": SYSTEM},
                                {"role": "user", "content": row["question"]},
                            ],
                            "max_tokens": max_tokens,
                            "temperature": 1.0,
                        }
                        before = (counter.requests, counter.prompt_tokens, counter.cached_tokens)
                        start = time.perf_counter()
                        got = httpx.post(f"{url}/chat/completions", json=body, timeout=900)
                        wall = time.perf_counter() - start
                        if got.status_code != 200:
                            tail = (folder / "optillm.log").read_text()[-600:]
                            raise SystemExit(f"{name}: {got.status_code} {got.text[:300]} {tail}")
                        text = got.json()["choices"][0]["message"]["content"] or ""
                        numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
                        f = figures[name]
                        f["requests"].append(counter.requests - before[0])
                        f["prompt"].append(counter.prompt_tokens - before[1])
                        f["cached"].append(counter.cached_tokens - before[2])
                        f["wall"].append(wall)
                        f["right"].append(float(bool(numbers) and numbers[-1] == str(row["answer"]).strip()))
        finally:
            for process in processes:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
    print(
        "| side | upstream requests / client request | prompt tokens paid upstream (cached) "
        "| wall s / request (median) | accuracy |"
    )
    print("|---|---|---|---|---|")
    for name, f in figures.items():
        print(
            f"| {name} | {statistics.mean(f['requests']):.1f} | {statistics.mean(f['prompt']):.0f} "
            f"({statistics.mean(f['cached']):.0f}) | {statistics.median(f['wall']):.2f} "
            f"| {statistics.mean(f['right']):.3f} ({int(sum(f['right']))}/{len(f['right'])}) |"
        )
    ours, theirs = figures["lanefold gateway"], figures["optillm"]
    ratio = statistics.median(ours["wall"]) / statistics.median(theirs["wall"])
    one = statistics.mean(ours["requests"]) <= 1.0
    print(
        f"gateway / optillm wall time: **{ratio:.2f}x** "
        f"({'PASS' if ratio < 1 else 'MISS'}: lower at equal k); "
        f"one upstream request per wave: {'PASS' if one else 'MISS'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", action="store_true", help="the gateway's overhead per request")
    parser.add_argument("--optillm", action="store_true", help="against optillm over the same upstream")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.optillm:
        peer(args.questions, args.max_tokens)
    if args.overhead or not args.optillm:
        overhead(args.requests, args.rounds)


if __name__ == "__main__":
    main()
