"""The loop gateway's two figures from issue 26, each beside a baseline measured in the same run;
targets are printed as PASS/MISS, never asserted.

--overhead: what serving a loop over HTTP adds per request. The instant simulated backend (no
  latency) under one loop config, served by `orchestrator serve --loops` (uvicorn, its own
  process, files store), asked by httpx clients on loopback; baseline: `Session.run` of the same
  config in this process (the same store kind). p50 and p99 per request at 1 and 32 concurrent
  clients; target: at most 3 ms added at p50.

--optillm: the gateway against optillm 0.4.0 (its own venv, a peer process), both running
  self-consistency with optillm's k (5, fixed in its source) over one upstream:
  `orchestrator serve --backend-config examples/serve/engine.toml` (SmolLM2-135M), behind a
  counting proxy in this process. One client, one request at a time, on the first N questions
  of the shipped arithmetic sample: upstream requests and prompt tokens per client request, wall
  time per request, accuracy (the last number of the answer). Target: one upstream request per
  wave (the engine honours `n`) and lower wall time at equal k.

    PYTHONPATH=. .venv/bin/python bench/gateway.py --overhead [--requests 1024] [--profile FILE]
    PYTHONPATH=. .venv/bin/python bench/gateway.py --optillm [--questions 20]
    PYTHONPATH=. .venv/bin/python bench/gateway.py --load [--requests 2000] [--clients 64] [--store URL]
    PYTHONPATH=. .venv/bin/python bench/gateway.py --litellm [--requests 320] [--rounds 3]

--load: `serve --workers 2` with keys near their limits and a worker killed mid-run
  (bench/gateway_load.py says how).

--litellm: against LiteLLM's proxy over one fake upstream, `--workers` 1 and 2 on both sides
  (bench/gateway_litellm.py says how).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import lanefold
from lanefold.serve._gateway import create_gateway  # the app, in-process, for the ASGI row

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from loopback import Loopback  # noqa: E402  # the tests' uvicorn-in-a-thread server

QUESTION = "What is 17 * 23?"
OPTILLM = "optillm==0.4.0"
OPTILLM_K = 5  # AdvancedSelfConsistency(num_samples=5): not settable per request or by flag
SYSTEM = "You are a calculator. Reply with the number only."
MAX_TOKENS = 16
CACHE = Path(os.environ.get("LANEFOLD_CACHE", Path.home() / ".cache" / "lanefold"))


def machine() -> str:
    """The machine line: CPU model, cores, the vector flags that matter here, Python."""
    model, flags = platform.processor() or "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    shown = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}) or ["no AVX2"]
    return (
        f"{model}, {os.cpu_count()} CPU cores ({', '.join(shown)}), "
        f"{platform.python_implementation()} {platform.python_version()}, {platform.system()}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(
    argv: list[str], log: Path, ready_url: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A server in a child process (yielded: its pid names the process tree whose CPU a bench
    may count), up when `ready_url` answers; SIGINT (a clean stop) at exit."""
    with log.open("w") as out:
        child = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"{argv[2:5]} exited {child.returncode}: {log.read_text()[-800:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[2:5]} did not answer in 300 s: {log.read_text()[-800:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            time.sleep(0.2)
        yield child
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "lanefold", "serve", *args]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- --overhead ---------------------------------------------------------------------------------

INSTANT_LOOP = """\
[loop]
k = {k}
max_concurrency = {k}
seed = 1
[backend]
kind = "simulated"
latency_ms = [0.0, 0.0]
failure_rate = 0.0
"""


async def in_process(session: lanefold.Session, clients: int, each: int) -> list[float]:
    """Latencies (s) of `Session.run`, `clients` callers each running `each` in a row."""
    latencies: list[float] = []

    async def client() -> None:
        for _ in range(each):
            start = time.perf_counter()
            result = await session.run(QUESTION)
            latencies.append(time.perf_counter() - start)
            if result.answer is None:
                raise RuntimeError(f"in-process run {result.run_id}: no answer")

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(client)
    return latencies


BODY = {"model": "instant", "messages": [{"role": "user", "content": QUESTION}]}


async def over_http(http: httpx.AsyncClient, url: str, clients: int, each: int) -> list[float]:
    """Latencies (s) of `POST /v1/chat/completions` naming the loop, as `in_process`."""
    latencies: list[float] = []

    async def client() -> None:
        for _ in range(each):
            start = time.perf_counter()
            response = await http.post(url, json=BODY)
            latencies.append(time.perf_counter() - start)
            if response.status_code != 200 or response.json()["lanefold"]["answer"] is None:
                raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(client)
    return latencies


def floor_child(port: int, canned: Path) -> None:
    """The HTTP floor: uvicorn as `serve` runs it (h11 or httptools, whichever it picks; access
    log on), answering every POST with a recorded gateway response after parsing the body."""
    import uvicorn

    body = json.loads(canned.read_text())

    async def answer(request: Request) -> Response:
        json.loads(await request.body())
        return JSONResponse(body)

    app = Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])
    uvicorn.Server(uvicorn.Config(app, port=port, log_level="info", lifespan="off")).run()


# The sides of --overhead, each the same request in a row: the baseline, then layer by layer.
SIDES = {
    "in-process": "Session.run in this process (the baseline)",
    "asgi": "the gateway app in this process, through httpx.ASGITransport (no socket, no server)",
    "http floor": "uvicorn in its own process answering a recorded response: no run (HTTP's cost)",
    "gateway": "`orchestrator serve --loops` in its own process, over loopback",
}


async def measure_overhead(
    config: Path, runs: Path, urls: dict[str, str], requests: int, reps: int
) -> dict[tuple[str, int], list[float]]:
    """Every side at 1 and 32 clients, blocks interleaved per repetition after a warm-up."""
    got: dict[tuple[str, int], list[float]] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        lanefold.Session(config, runs_dir=runs) as session,
        httpx.AsyncClient(limits=limits, timeout=60) as http,
    ):
        app = create_gateway(session, {"instant": lanefold.load_config(config)})
        asgi = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://asgi")
        clients_of = {"asgi": asgi, "http floor": http, "gateway": http}
        urls = {**urls, "asgi": "http://asgi/v1/chat/completions"}

        async def block(side: str, clients: int, each: int) -> list[float]:
            if side == "in-process":
                return await in_process(session, clients, each)
            return await over_http(clients_of[side], urls[side], clients, each)

        for side in SIDES:
            await block(side, 4, 10)
        for rep in range(reps):
            for clients in (1, 32):
                each = max(1, requests // reps // clients)
                order = list(SIDES)[rep % len(SIDES) :] + list(SIDES)[: rep % len(SIDES)]
                for side in order:
                    got.setdefault((side, clients), []).extend(await block(side, clients, each))
        await asgi.aclose()
    return got


def overhead(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="lanefold-bench-gateway-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        root = Path(tmp)
        (root / "loops").mkdir()
        config = root / "loops" / "instant.toml"
        config.write_text(INSTANT_LOOP.format(k=args.k))
        port, floor = free_port(), free_port()
        argv = serve_argv(
            "--loops", str(root / "loops"), "--runs-dir", str(root / "gw-runs"), "--port", str(port)
        )
        if args.profile:
            argv = [sys.executable, "-m", "cProfile", "-o", str(Path(args.profile).resolve()), *argv[1:]]
        base = f"http://127.0.0.1:{port}/v1"
        stack.enter_context(process(argv, root / "gateway.log", f"{base}/models"))
        (root / "canned.json").write_text(httpx.post(f"{base}/chat/completions", json=BODY).text)
        child = [sys.executable, __file__, "--floor-child", str(floor), str(root / "canned.json")]
        stack.enter_context(process(child, root / "floor.log", f"http://127.0.0.1:{floor}/"))
        urls = {
            "gateway": f"{base}/chat/completions",
            "http floor": f"http://127.0.0.1:{floor}/v1/chat/completions",
        }
        start = time.perf_counter()
        got = anyio.run(measure_overhead, config, root / "runs", urls, args.requests, args.reps)
        seconds = time.perf_counter() - start
    import uvicorn

    parser = "httptools" if importlib.util.find_spec("httptools") else "h11 (pure Python; no httptools)"
    print(f"\nlanefold gateway overhead: {machine()}")
    print(
        f"loop: parallel_sample k={args.k}, majority vote, instant simulated backend, files store "
        f"(fsync at barrier and end); {args.reps} interleaved repetitions; took {seconds:.0f} s"
    )
    print(f"uvicorn {uvicorn.__version__}, HTTP parser {parser}, asyncio loop; httpx clients on loopback")
    for side, what in SIDES.items():
        print(f"  {side:>10}: {what}")
    print()
    head = (
        f"{'clients':>7} | {'side':>10} | {'requests':>8} | {'p50':>8} | {'p50 added':>9} | {'ratio':>6} | "
        f"{'p99':>9} | {'p99 added':>9} | {'ratio':>6}"
    )
    print(head)
    print("-" * len(head))
    added: dict[int, float] = {}
    for clients in (1, 32):
        ours = got["in-process", clients]
        b50, b99 = percentile(ours, 50) * 1e3, percentile(ours, 99) * 1e3
        for side in SIDES:
            theirs = got[side, clients]
            p50, p99 = percentile(theirs, 50) * 1e3, percentile(theirs, 99) * 1e3
            if side == "gateway":
                added[clients] = p50 - b50
            cells = [f"{clients:>7}", f"{side:>10}", f"{len(theirs):>8}"]
            for mine, baseline in ((p50, b50), (p99, b99)):
                if side == "http floor":  # no run: its whole time is what HTTP adds
                    cells += [f"{mine:6.2f} ms", f"{mine:6.2f} ms", f"{'-':>6}"]
                else:
                    cells += [f"{mine:6.2f} ms", f"{mine - baseline:6.2f} ms", f"{mine / baseline:5.2f}x"]
            print(" | ".join(cells))
    print("(added: over in-process at the same percentile; the http floor's is its whole time)\n")
    for clients, ms in added.items():
        verdict = "PASS" if ms <= 3.0 else "MISS"
        print(f"{verdict}  gateway: {ms:.2f} ms added at p50 with {clients} client(s) (target <= 3 ms)")
    if args.profile:
        print(f"gateway profile: {args.profile} (python -m pstats {args.profile})")


# -- --optillm ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Upstream:
    """What the counting proxy saw: one entry per upstream request."""

    calls: list[dict[str, int]] = field(default_factory=list)


def counting_proxy(target: str, seen: Upstream) -> Starlette:
    """Every request forwarded to `target` as it came; each POST's `n` and usage recorded."""
    client = httpx.AsyncClient(base_url=target, timeout=600)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        response = await client.request(request.method, request.url.path, content=body, headers=headers)
        if request.method == "POST":
            usage = (response.json().get("usage") or {}) if response.status_code == 200 else {}
            details = usage.get("prompt_tokens_details") or {}
            seen.calls.append(
                {
                    "n": int(json.loads(body or b"{}").get("n") or 1),
                    "prompt": int(usage.get("prompt_tokens") or 0),
                    "cached": int(details.get("cached_tokens") or 0),
                    "completion": int(usage.get("completion_tokens") or 0),
                    "status": response.status_code,
                }
            )
        kept = {k: v for k, v in response.headers.items() if k.lower() == "content-type"}
        return Response(response.content, status_code=response.status_code, headers=kept)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def optillm_python() -> Path | None:
    """optillm's venv, made once under the cache; None (and the commands printed) if it cannot be."""
    venv = CACHE / "optillm-venv"
    python = venv / "bin" / "python"
    commands = [
        ["python3", "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", OPTILLM],
    ]
    ok = subprocess.run([str(python), "-c", "import optillm.server"], capture_output=True).returncode == 0
    if ok:
        return python
    print(f"installing {OPTILLM} into {venv} (once; it pulls torch, transformers, gradio, ...)")
    for argv in commands:
        if subprocess.run(argv).returncode != 0:
            print("could not install optillm; run:\n  " + "\n  ".join(" ".join(c) for c in commands))
            return None
    return python


def arithmetic(count: int) -> list[tuple[str, str]]:
    """The first `count` questions of the shipped sample, file by file as `orchestrator eval` reads it."""
    rows = []
    for path in sorted((ROOT / "examples" / "datasets" / "arithmetic").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows.append((row["question"], str(row["answer"])))
    return rows[:count]


def last_number(text: str | None) -> str | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", (text or "").replace(",", ""))
    return found[-1] if found else None


@dataclass(slots=True)
class Row:
    side: str
    upstream: list[int] = field(default_factory=list)  # upstream requests per client request
    lanes: list[int] = field(default_factory=list)  # samples asked of upstream per client request
    prompt: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    completion: list[int] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    correct: int = 0
    failed: int = 0


def ask(row: Row, http: httpx.Client, url: str, model: str, question: str, gold: str, seen: Upstream) -> None:
    """One client request; what it cost upstream is the proxy's calls while it ran."""
    before = len(seen.calls)
    body = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
    }
    start = time.perf_counter()
    response = http.post(url, json=body)
    row.walls.append(time.perf_counter() - start)
    calls = seen.calls[before:]
    row.upstream.append(len(calls))
    row.lanes.append(sum(c["n"] for c in calls))
    row.prompt.append(sum(c["prompt"] for c in calls))
    row.cached.append(sum(c["cached"] for c in calls))
    row.completion.append(sum(c["completion"] for c in calls))
    if response.status_code != 200:
        row.failed += 1
        return
    row.correct += last_number(response.json()["choices"][0]["message"]["content"]) == gold


def optillm(args: argparse.Namespace) -> None:
    python = optillm_python()
    questions = arithmetic(args.questions)
    up, seen = free_port(), Upstream()
    with (
        tempfile.TemporaryDirectory(prefix="lanefold-bench-optillm-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        root = Path(tmp)
        engine = serve_argv(
            "--backend-config", str(ROOT / "examples" / "serve" / "engine.toml"), "--port", str(up)
        )
        stack.enter_context(process(engine, root / "upstream.log", f"http://127.0.0.1:{up}/v1/models"))
        proxy = stack.enter_context(Loopback(counting_proxy(f"http://127.0.0.1:{up}", seen)))
        model = httpx.get(f"{proxy.base_url}/models").json()["data"][0]["id"]
        (root / "loops").mkdir()
        (root / "loops" / "sc.toml").write_text(
            f'[loop]\nk = {OPTILLM_K}\nmax_concurrency = {OPTILLM_K}\nseed = 1\nreducer = "majority_vote"\n'
            '[prompt]\ntemplate = "{question}"\n'  # the user's turn as it came, as optillm sends it
            f"[sampling]\ntemperature = 1.0\nmax_tokens = {MAX_TOKENS}\n"  # optillm's T = 1
            '[extract]\nmethod = "last_number"\n'
            f'[backend]\nkind = "openai"\nbase_url = "{proxy.base_url}"\nmodel = "{model}"\n'
        )
        gw = free_port()
        gateway = serve_argv(
            "--loops", str(root / "loops"), "--runs-dir", str(root / "runs"), "--port", str(gw)
        )
        stack.enter_context(process(gateway, root / "gateway.log", f"http://127.0.0.1:{gw}/v1/models"))
        sides = {"lanefold": (f"http://127.0.0.1:{gw}/v1/chat/completions", "sc")}
        if python is not None:
            op = free_port()
            peer = [str(python), "-m", "optillm.server", "--base-url", proxy.base_url, "--port", str(op)]
            env = {"OPENAI_API_KEY": "sk-bench", "OPTILLM_LOG": "warning"}
            stack.enter_context(process(peer, root / "optillm.log", f"http://127.0.0.1:{op}/health", env))
            sides["optillm"] = (f"http://127.0.0.1:{op}/v1/chat/completions", f"self_consistency-{model}")
        rows = {side: Row(side) for side in sides}
        http = stack.enter_context(httpx.Client(timeout=600, headers={"Authorization": "Bearer sk-bench"}))
        for side, (url, name) in sides.items():  # warm-up, on a question outside the sample
            ask(Row(side), http, url, name, "What is 1 plus 1?", "2", seen)
        start = time.perf_counter()
        for i, (question, gold) in enumerate(questions):  # interleaved, the order alternating
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                ask(rows[side], http, *sides[side], question, gold, seen)
        seconds = time.perf_counter() - start
    print(f"\nlanefold gateway vs {OPTILLM}: {machine()}")
    print(
        f"self-consistency k={OPTILLM_K} (optillm's fixed num_samples), T=1.0, max_tokens={MAX_TOKENS}, "
        f"{len(questions)} arithmetic questions, one client, one request at a time; took {seconds:.0f} s"
    )
    print(
        f"upstream: `orchestrator serve --backend-config examples/serve/engine.toml` ({model}), "
        "behind a counting proxy; tokens are the upstream's usage per client request\n"
    )
    head = (
        f"{'side':>8} | {'upstream req':>12} | {'lanes':>5} | {'prompt tok':>10} | {'cached':>6} | "
        f"{'completion':>10} | {'wall p50':>8} | {'/lanefold':>9} | {'accuracy':>8} | {'failed':>6}"
    )
    print(head)
    print("-" * len(head))
    base = statistics.median(rows["lanefold"].walls)
    for row in rows.values():
        wall = statistics.median(row.walls)
        cells = [f"{row.side:>8}"]
        for width, values in ((12, row.upstream), (5, row.lanes), (10, row.prompt), (6, row.cached)):
            cells.append(f"{statistics.mean(values):{width}.1f}")
        cells += [f"{statistics.mean(row.completion):10.1f}", f"{wall:6.2f} s", f"{wall / base:8.2f}x"]
        cells += [f"{row.correct / len(questions):8.0%}", f"{row.failed:>6}"]
        print(" | ".join(cells))
    print("(per client request: means of the upstream's requests, lanes asked, usage; the median wall)")
    print()
    ours = rows["lanefold"]
    print(
        f"{'PASS' if max(ours.upstream) == 1 else 'MISS'}  lanefold: one upstream request per wave "
        f"(max {max(ours.upstream)} upstream requests per client request; the loop runs one wave)"
    )
    if "optillm" in rows:
        peer_wall = statistics.median(rows["optillm"].walls)
        print(
            f"{'PASS' if base < peer_wall else 'MISS'}  lower wall time at equal k: lanefold {base:.2f} s, "
            f"optillm {peer_wall:.2f} s per request (median)"
        )
    else:
        print("MISS  optillm not measured (no venv)")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--overhead", action="store_true", help="per-request overhead on the instant backend")
    parser.add_argument("--optillm", action="store_true", help="against optillm 0.4.0 over the engine")
    parser.add_argument("--load", action="store_true", help="serve --workers under load, a worker killed")
    parser.add_argument("--litellm", action="store_true", help="against LiteLLM's proxy, one fake upstream")
    parser.add_argument(
        "--requests",
        type=int,
        help="--overhead: requests per side and concurrency (1024); --load: in all (2000); "
        "--litellm: at 32 clients a side (320)",
    )
    parser.add_argument("--clients", type=int, default=64, help="--load: concurrent clients")
    parser.add_argument("--workers", type=int, default=2, help="--load: serve --workers")
    parser.add_argument("--store", metavar="URL", help="--load: a postgresql:// store (default: files)")
    parser.add_argument("--reps", type=int, default=4, help="--overhead: interleaved repetitions")
    parser.add_argument("--rounds", type=int, default=3, help="--litellm: rounds of every side, interleaved")
    parser.add_argument("--k", type=int, default=8, help="--overhead: the loop's lanes")
    parser.add_argument(
        "--profile", metavar="FILE", help="--overhead: cProfile the gateway process into FILE"
    )
    parser.add_argument("--floor-child", nargs=2, metavar=("PORT", "CANNED"), help=argparse.SUPPRESS)
    parser.add_argument("--questions", type=int, default=20, help="--optillm: the first N of the sample")
    args = parser.parse_args()
    if args.floor_child:
        floor_child(int(args.floor_child[0]), Path(args.floor_child[1]))
        return
    if not (args.overhead or args.optillm or args.load or args.litellm):
        parser.error("name --overhead, --optillm, --load, --litellm or several")
    if args.load:
        from gateway_load import load  # the bench's folder is on sys.path as the script's own

        load(argparse.Namespace(**{**vars(args), "requests": args.requests or 2000}), machine())
    if args.litellm:
        from gateway_litellm import compare

        compare(args, machine(), CACHE)
    if args.overhead:
        args.requests = args.requests or 1024
        overhead(args)
    if args.optillm:
        optillm(args)


if __name__ == "__main__":
    main()
