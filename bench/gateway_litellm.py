"""`bench/gateway.py --litellm` (issue 41): lanefold's gateway against LiteLLM's proxy, side by
side on one machine over the same fake upstream. Figures are printed, never asserted.

The upstream is a tiny starlette app in its own uvicorn process answering every chat completion
at once with a fixed reply (no model). Both gateways run at once (at 1 worker, then at 2), and
each is measured in rounds (`--rounds`, 3): in each, the upstream alone first (the baseline),
then the two gateways one after the other, the order swapped every round, so that a machine
that slows or speeds up over minutes weighs on both alike. A measure: p50 and p99 latency at 1
and at 32 concurrent clients, and requests per second at saturation (64 clients); the clients
are tasks sharing one httpx client on lanefold's `PooledTransport` (aiohttp's pool, the light
one: on httpx's own, the client outspent either gateway at 64 connections). A
gateway's added latency is its percentile minus the same round's upstream's at the same
concurrency, its ratio the one over the other. After each round's table, the medians over the
rounds, and in how many rounds lanefold was at or below LiteLLM on each row.

Wall latency on a shared machine moves with whatever else runs: the bench's own clients, the
upstream and the gateway compete for the same cores, so runs disagree by more than the gateways
differ. Beside it, each phase counts the CPU the measured server's process tree spent (user and
system time of the process and every descendant, read from /proc before and after the phase:
a supervisor and its workers, LiteLLM's spawned workers), divided by the requests it answered;
time spent waiting for a core is not CPU time, so this figure holds still under load. The table
gives it per side and phase, and lanefold's over LiteLLM's at the same worker count.

- lanefold: `orchestrator serve --loops --store-keys --keys FILE --workers N` serving a k = 1 loop
  over the openai backend pointed at the upstream; the client's key holds a token budget (far
  above what the run spends, so nothing is refused) which every request is checked against and
  spends from, on the files store.
- LiteLLM: `litellm --config FILE --num_workers N` (`litellm[proxy]` pinned, in its own venv
  under the cache, made once) with the upstream as its one model and a master key. Its budgets
  cannot be on here: a virtual key's `max_budget` needs LiteLLM's database, reached through
  Prisma, whose engines Prisma downloads from binaries.prisma.sh at first use (not reachable
  here); `litellm_settings.max_budget` (proxy-wide) is set, so LiteLLM prices every call and adds
  it to its in-memory spend, but it logs at start that without a database that budget is NOT
  enforced. So lanefold checks and spends a budget on every request; LiteLLM only counts.

`LANEFOLD_BENCH_PROFILE=FILE` runs lanefold's one-worker gateway under yappi's CPU clock over
every thread (`bench/_cpu_profile.py`; `pip install yappi`), written to FILE when it stops
(`python -m pstats FILE`): where its CPU per request goes. Profiling slows it, so that run's
figures are not the gateway's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from lanefold.backends.openai import PooledTransport

LITELLM = "litellm[proxy]==1.100.0"  # the newest whose proxy extra installs from this PyPI mirror
MASTER_KEY = "sk-bench-master"
MODEL = "fake"
REPLY = {
    "id": "chatcmpl-fake",
    "object": "chat.completion",
    "created": 0,
    "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "391"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
}
LOOP = """\
[loop]
k = 1
max_concurrency = 1
seed = 1
[extract]
method = "last_number"
[backend]
kind = "openai"
base_url = "{base}"
model = "{model}"
"""
LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {base}
      api_key: sk-upstream
      input_cost_per_token: 0.0000001
      output_cost_per_token: 0.0000002
general_settings:
  master_key: {master}
litellm_settings:
  max_budget: 1000000
  budget_duration: 30d
  telemetry: false
"""


def upstream_child(port: int) -> None:
    """The fake upstream: every chat completion answered at once with `REPLY` (no model)."""
    import json

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def chat(request: Request) -> Response:
        json.loads(await request.body())
        return JSONResponse(REPLY)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )
    uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off")).run()


def litellm_python(cache: Path) -> Path | None:
    """LiteLLM's venv, made once under the cache; None (and the commands printed) if it cannot be."""
    venv = cache / "litellm-venv"
    commands = [
        ["python3", "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", LITELLM],
    ]
    probe = [str(venv / "bin" / "python"), "-c", "import litellm.proxy.proxy_server"]
    if (venv / "bin" / "litellm").exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return venv / "bin" / "litellm"
    print(f"installing {LITELLM} into {venv} (once)")
    for argv in commands:
        if subprocess.run(argv).returncode != 0:
            print("could not install LiteLLM; run:\n  " + "\n  ".join(" ".join(c) for c in commands))
            return None
    return venv / "bin" / "litellm"


PHASES = ("1 client", "32 clients", "64 clients")


def processes() -> dict[int, list[str]]:
    """Every process's /proc stat fields after "pid (comm) " (index 0 is its state, 1 its
    parent, 11 and 12 its user and system ticks, 13 and 14 its reaped children's), by pid."""
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        found[int(entry.name)] = stat[stat.rindex(")") + 2 :].split()
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) spent so far by process `pid` and every living descendant,
    with what each has reaped of its own children (so a worker that died and was waited for
    still counts), from /proc."""
    table = processes()
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, fields in table.items():
            if int(fields[1]) == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    ticks = sum(sum(int(f) for f in table[p][11:15]) for p in tree if p in table)  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Side:
    """One side's figures: latencies (s) at 1 and 32 clients, requests/s at saturation, the
    requests that got no 200 (an error reply or a connection cut), counted, not timed, and the
    server's CPU seconds per answered request in each of `PHASES` (None: not counted)."""

    name: str
    one: list[float]
    many: list[float]
    rps: float
    failed: list[str]
    cpu: tuple[float, float, float] | None = None
    shares: tuple[float, ...] = ()  # each worker's part of the workers' CPU at 32 clients


async def _block(
    url: str, headers: dict[str, str], clients: int, requests: int, failed: list[str]
) -> tuple[list[float], float]:
    """`requests` chat completions from `clients` concurrent clients: the latencies of those
    answered 200 and the wall time; each other one's status or error appended to `failed`."""
    latencies: list[float] = []
    left = list(range(requests))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
    # The client is lanefold's openai backend's transport (aiohttp's pool under httpx): on
    # httpx's own pool the client spent 4 to 6 ms of CPU a request at 64 connections, more than
    # either gateway, so on 2 cores it bounded what a gateway could be measured at, by an amount
    # that moved with the server's timing. Its idle connections are let go after 4 s, before
    # the servers' 5 s keep-alive ends (uvicorn's, on both sides): kept as long, one idle since
    # a block began was reused as the server closed it, and reset (ReadError).
    transport = PooledTransport(max_connections=clients)
    async with httpx.AsyncClient(transport=transport, timeout=120, headers=headers) as http:

        async def client() -> None:
            while left:
                i = left.pop()
                start = time.perf_counter()
                try:
                    reply = await http.post(url, json={**body, "user": f"u{i}"})
                except httpx.TransportError as exc:
                    failed.append(type(exc).__name__)
                    continue
                if reply.status_code != 200:
                    failed.append(str(reply.status_code))
                    continue
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(client)
        return latencies, time.perf_counter() - start


def one_client(requests: int) -> int:
    """Requests sent by the one client: half the 32 clients' (160 by default), so that its p99
    is the third slowest, not the slowest of a few dozen (40 before, whose p99 was their max)."""
    return max(20, requests // 2)


def children_cpu(pid: int) -> dict[int, float]:
    """CPU seconds so far of each direct child of `pid` (a supervisor's workers; not
    multiprocessing's resource tracker), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for child, fields in processes().items():
        if int(fields[1]) != pid:
            continue
        with contextlib.suppress(OSError):
            if b"resource_tracker" in Path(f"/proc/{child}/cmdline").read_bytes():  # multiprocessing's
                continue
        found[child] = (int(fields[11]) + int(fields[12])) / tick
    return found


def measure(name: str, url: str, headers: dict[str, str], requests: int, pid: int) -> Side:
    """A warm-up, then 1 client, 32 clients and saturation (64 clients), in that order, each
    phase's CPU counted over the process tree of `pid` (the server measured)."""
    failed: list[str] = []
    anyio.run(_block, url, headers, 8, 64, failed)
    cpu: list[float] = []
    blocks: list[tuple[list[float], float]] = []
    shares: tuple[float, ...] = ()
    for clients, count in ((1, one_client(requests)), (32, requests), (64, requests * 2)):
        before, workers = tree_cpu(pid), children_cpu(pid)
        blocks.append(anyio.run(_block, url, headers, clients, count, failed))
        cpu.append((tree_cpu(pid) - before) / max(1, len(blocks[-1][0])))
        if clients == 32:
            after = children_cpu(pid)
            spent = [after[child] - workers[child] for child in sorted(after) if child in workers]
            if len(spent) > 1 and sum(spent) > 0:
                shares = tuple(part / sum(spent) for part in spent)
    (one, _), (many, _), (done, seconds) = blocks
    return Side(name, one, many, len(done) / seconds, failed, (cpu[0], cpu[1], cpu[2]), shares)


def table(sides: list[Side]) -> list[str]:
    """The printed rows: each side's p50/p99 at 1 and 32 clients with what it adds over the
    first side (the upstream) and the ratio, then requests/s and the ratio to the upstream's."""
    from gateway import percentile  # the bench's folder is on sys.path as the script's own

    base = sides[0]
    pair = f"{'added':>9} | {'ratio':>6}"
    head = f"{'side':>22} | {'clients':>7} | {'p50':>9} | {pair} | {'p99':>9} | {pair}"
    lines = [head, "-" * len(head)]
    for clients, pick in ((1, "one"), (32, "many")):
        b = getattr(base, pick)
        b50, b99 = percentile(b, 50) * 1e3, percentile(b, 99) * 1e3
        for side in sides:
            mine = getattr(side, pick)
            p50, p99 = percentile(mine, 50) * 1e3, percentile(mine, 99) * 1e3
            cells = [f"{side.name:>22}", f"{clients:>7}"]
            for value, baseline in ((p50, b50), (p99, b99)):
                cells += [f"{value:6.2f} ms", f"{value - baseline:6.2f} ms", f"{value / baseline:5.2f}x"]
            lines.append(" | ".join(cells))
    lines.append("")
    lines.append(f"{'side':>22} | {'requests/s at saturation (64 clients)':>38} | {'of upstream':>11}")
    for side in sides:
        lines.append(f"{side.name:>22} | {side.rps:38.0f} | {side.rps / base.rps:10.2f}x")
    lines += cpu_table(sides)
    for side in sides:
        if side.shares:
            parts = ", ".join(f"{share:.0%}" for share in side.shares)
            lines.append(f"{side.name}: each worker's share of the workers' CPU at 32 clients: {parts}")
    for side in sides:
        if side.failed:
            counts = {what: side.failed.count(what) for what in sorted(set(side.failed))}
            lines.append(f"{side.name}: {len(side.failed)} requests not answered 200 (untimed): {counts}")
    return lines


def cpu_table(sides: list[Side]) -> list[str]:
    """The CPU rows: each side's server CPU per answered request in each phase, then lanefold's
    over LiteLLM's at the same worker count (below 1: lanefold spends less)."""
    counted = [side for side in sides if side.cpu is not None]
    if not counted:
        return []
    head = f"{'side':>22} | " + " | ".join(f"{p:>10}" for p in PHASES)
    lines = [
        "",
        "server CPU per answered request (user + system, the process tree), ms",
        head,
        "-" * len(head),
    ]
    for side in counted:
        assert side.cpu is not None
        lines.append(f"{side.name:>22} | " + " | ".join(f"{c * 1e3:7.2f} ms" for c in side.cpu))
    by_name = {side.name: side.cpu for side in counted}
    for name, ours in by_name.items():
        theirs = by_name.get(name.replace("lanefold", "LiteLLM")) if name.startswith("lanefold") else None
        if ours is None or theirs is None:
            continue
        label = f"{name.split(', ', 1)[1]}: lanefold/LiteLLM"
        cells = [f"{a / b:9.2f}x" if b > 0 else f"{'-':>10}" for a, b in zip(ours, theirs, strict=True)]
        lines.append(f"{label:>22} | " + " | ".join(cells))
    return lines


@contextlib.contextmanager
def _lanefold(root: Path, upstream: str, workers: int) -> Iterator[tuple[str, dict[str, str], int]]:
    from gateway import free_port, process, serve_argv
    from gateway_load import _keys_file

    loops = root / f"loops-{workers}"
    loops.mkdir()
    (loops / f"{MODEL}.toml").write_text(LOOP.format(base=upstream, model=MODEL))
    secret = _keys_file(root / f"keys-{workers}.toml", {"bench": 10**12})["bench"]
    port = free_port()
    argv = serve_argv(
        "--loops", str(loops), "--runs-dir", str(root / f"runs-{workers}"), "--port", str(port),
        "--keys", str(root / f"keys-{workers}.toml"), "--store-keys", "--workers", str(workers),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    profile = os.environ.get("LANEFOLD_BENCH_PROFILE")  # the bench's switch, never the library's
    if profile and workers == 1:  # one worker serves in the process started: profile it whole
        argv = [
            sys.executable,
            str(Path(__file__).with_name("_cpu_profile.py")),
            str(Path(profile).resolve()),
            *argv[3:],
        ]
    with process(argv, root / f"lanefold-{workers}.log", f"{base}/models") as child:
        yield f"{base}/chat/completions", {"Authorization": f"Bearer {secret}"}, child.pid


@contextlib.contextmanager
def _litellm(root: Path, exe: Path, upstream: str, workers: int) -> Iterator[tuple[str, dict[str, str], int]]:
    from gateway import free_port, process

    config = root / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(model=MODEL, base=upstream, master=MASTER_KEY))
    port = free_port()
    argv = [str(exe), "--config", str(config), "--port", str(port), "--num_workers", str(workers)]
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "DISABLE_SCHEMA_UPDATE": "True"}
    base = f"http://127.0.0.1:{port}"
    with process(argv, root / f"litellm-{workers}.log", f"{base}/health/liveliness", env) as child:
        yield f"{base}/v1/chat/completions", {"Authorization": f"Bearer {MASTER_KEY}"}, child.pid


def file_create_us(folder: Path, count: int = 200) -> float:
    """Microseconds to make a folder and a file in it on `folder`'s file system (the median of
    `count`): a lanefold run makes a folder and two files (its lock and its log), each request
    of the bench one run; LiteLLM writes no file a request. Slow on some disks (and on a
    crowded /tmp: seen here at 20 to 400 us a file), so printed beside the figures."""
    import secrets
    import statistics

    times = []
    for _ in range(count):
        start = time.perf_counter()
        made = folder / f"probe-{secrets.token_hex(6)}"
        made.mkdir()
        (made / "lock").touch()
        times.append((time.perf_counter() - start) / 2)
    for made in folder.glob("probe-*"):
        (made / "lock").unlink()
        made.rmdir()
    return statistics.median(times) * 1e6


def _row_values(side: Side, base: Side) -> dict[str, float]:
    """A side's figures in one round: each latency row (ms) and its excess over the round's
    upstream, and requests a second."""
    from gateway import percentile  # the bench's folder is on sys.path as the script's own

    out: dict[str, float] = {}
    for clients, pick in ((1, "one"), (32, "many")):
        for q in (50, 99):
            value = percentile(getattr(side, pick), q) * 1e3
            out[f"{clients} client{'s' if clients > 1 else ''} p{q} added"] = (
                value - percentile(getattr(base, pick), q) * 1e3
            )
    out["requests/s at 64 clients"] = side.rps
    if side.cpu is not None:
        out["CPU ms/request at 32"] = side.cpu[1] * 1e3
    return out


def summary(rounds: list[list[Side]]) -> list[str]:
    """Each row's median over the rounds for every side, and in how many rounds lanefold was at
    or below LiteLLM (at the same worker count, in the same round: the machine the same)."""
    import statistics

    values: dict[str, dict[str, list[float]]] = {}
    for sides in rounds:
        base = sides[0]
        for side in sides[1:]:
            for row, value in _row_values(side, base).items():
                values.setdefault(side.name, {}).setdefault(row, []).append(value)
    rows = list(next(iter(values.values())).keys()) if values else []
    names = list(values)
    lines = [
        "",
        f"medians over {len(rounds)} rounds (each round: the upstream, then both gateways, "
        "their order swapped every round)",
    ]
    head = f"{'row':>26} | " + " | ".join(f"{n:>22}" for n in names)
    lines += [head, "-" * len(head)]
    for row in rows:
        cells = [
            f"{statistics.median(values[n][row]):22.1f}" if row in values[n] else f"{'-':>22}" for n in names
        ]
        lines.append(f"{row:>26} | " + " | ".join(cells))
    lines.append("")
    for ours in (n for n in names if n.startswith("lanefold")):
        theirs = ours.replace("lanefold", "LiteLLM")
        if theirs not in values:
            continue
        wins = []
        for row in rows:
            a, b = values[ours].get(row), values[theirs].get(row)
            if not a or not b:
                continue
            better = (lambda x, y: x >= y) if row.startswith("requests/s") else (lambda x, y: x <= y)
            wins.append(f"{row}: {sum(better(x, y) for x, y in zip(a, b, strict=True))}/{len(a)}")
        lines.append(f"{ours}, rounds at or below LiteLLM (above, for requests/s): " + "; ".join(wins))
    return lines


def compare(args: argparse.Namespace, machine: str, cache: Path) -> None:
    """Run every side, round after round, and print each round's table and the medians (see
    the module's docstring)."""
    from gateway import free_port, process

    exe = litellm_python(cache)
    requests, count = args.requests or 320, max(1, args.rounds)
    rounds: list[list[Side]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lanefold-bench-litellm-") as tmp:
        root = Path(tmp)
        create = file_create_us(root)
        port = free_port()
        child = [sys.executable, __file__, str(port)]
        upstream = f"http://127.0.0.1:{port}/v1"
        with process(child, root / "upstream.log", f"{upstream}/models") as up:
            for workers in (1, 2):
                with contextlib.ExitStack() as stack:
                    gateways = [
                        (
                            f"lanefold, {workers} worker(s)",
                            *stack.enter_context(_lanefold(root, upstream, workers)),
                        )
                    ]
                    if exe is not None:
                        gateways.append(
                            (
                                f"LiteLLM, {workers} worker(s)",
                                *stack.enter_context(_litellm(root, exe, upstream, workers)),
                            )
                        )
                    for turn in range(count):
                        sides = [
                            measure(
                                "upstream (baseline)", f"{upstream}/chat/completions", {}, requests, up.pid
                            )
                        ]
                        for name, url, headers, pid in gateways[:: 1 if turn % 2 == 0 else -1]:
                            sides.append(measure(name, url, headers, requests, pid))
                        sides[1:] = sorted(sides[1:], key=lambda side: side.name, reverse=True)
                        rounds.append(sides)
                        print(f"\n{workers} worker(s), round {turn + 1} of {count}")
                        print("\n".join(table(sides)))
    seconds = time.perf_counter() - started
    peer = LITELLM if exe else "LiteLLM (not installed)"
    print(f"\nlanefold gateway vs {peer}: {machine}, shared with other jobs")
    print(
        f"fake upstream (starlette on uvicorn, its own process, no model); lanefold: k = 1 loop over the "
        f"openai backend, a key with a token budget (--store-keys, files store in {tempfile.gettempdir()}, "
        f"{create:.0f} us to make a file there); LiteLLM: master key, litellm_settings.max_budget; "
        f"1 client x {one_client(requests)}, 32 clients x {requests}, 64 clients x {requests * 2} "
        f"requests a side a round, {count} round(s) a worker count; took {seconds:.0f} s"
    )
    print("\n".join(summary([r for r in rounds if r[1].name.endswith("1 worker(s)")])))
    print("\n".join(summary([r for r in rounds if r[1].name.endswith("2 worker(s)")])))


if __name__ == "__main__":  # the upstream's own process, started by `compare`
    upstream_child(int(sys.argv[1]))
