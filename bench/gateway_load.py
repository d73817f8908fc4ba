"""`bench/gateway.py --load` (issue 41): `orchestrator serve --workers N` under load, with a worker
killed mid-run and started again. Figures are printed as PASS/MISS, never asserted.

64 httpx clients send 2,000 chat requests (by default) to a loop on the instant simulated
backend, each from a key drawn at random out of 16 whose token budgets are set near (60 % to
100 % of) what an even share of the requests would spend, so many keys run out mid-run. Every
request carries an `Idempotency-Key`; one in four is sent a second time once answered (the retry
lands on whichever worker the kernel picks), and a request cut off by the kill is retried with
its key (so it resumes). Halfway through, one worker is sent SIGKILL; the supervisor starts
another on the same socket. At the end, counted from the store: each key's spent tokens against
its limit, the runs made against the requests answered (a retry makes none), and each retry's
answer against the first one. The added latency is the gateway's p50 and p99 against a no-HTTP
baseline measured in the same run: `Session.run` of the same config in this process, the same
64 clients, the same store kind.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import tempfile
import time
from pathlib import Path

import anyio
import httpx

import lanefold
from lanefold.execution import budget_store, open_store, read_state

LOOP = """\
[loop]
k = 4
max_concurrency = 4
seed = 1
[backend]
kind = "simulated"
latency_ms = [0.0, 0.0]
failure_rate = 0.0
prompt_tokens = 30
output_tokens = 10
"""
KEYS = 16
QUESTION = "What is {a} + {b}?"


def _keys_file(path: Path, budgets: dict[str, int]) -> dict[str, str]:
    """Write a keys file seeding `budgets` (name -> max_tokens); the secret of each name."""
    secrets = {name: f"load-{name}-{random.getrandbits(64):016x}" for name in budgets}
    rows = [
        f'[[keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(secrets[name].encode()).hexdigest()}"\n'
        + (f"budget = {{ max_tokens = {budget} }}\n" if budget else "")
        for name, budget in budgets.items()
    ]
    path.write_text("\n".join(rows))
    return secrets


class Tally:
    """What the clients saw."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.codes: dict[int, int] = {}
        self.first: dict[str, tuple[str, str]] = {}  # idempotency key -> (run id, answer)
        self.retries = 0
        self.retries_same = 0
        self.cut_off = 0  # connections lost to the kill, retried with their Idempotency-Key
        self.workers: set[str] = set()
        self.killed: list[str] = []


async def _post(
    http: httpx.AsyncClient, url: str, secret: str, question: str, idem: str, tally: Tally
) -> httpx.Response:
    body = {"model": "instant", "messages": [{"role": "user", "content": question}]}
    headers = {"Authorization": f"Bearer {secret}", "Idempotency-Key": idem}
    while True:
        try:
            reply = await http.post(url, json=body, headers=headers)
        except httpx.TransportError:  # the worker holding the connection was killed
            tally.cut_off += 1
            await anyio.sleep(0.05)
            continue
        if reply.status_code == 409:  # its run is live on the other worker: retry when it ends
            await anyio.sleep(float(reply.headers.get("Retry-After", "1")) / 10)
            continue
        if "x-lanefold-worker" in reply.headers:
            tally.workers.add(reply.headers["x-lanefold-worker"])
        return reply


async def _load(
    url: str, secrets: dict[str, str], requests: int, clients: int, kill_at: int, tally: Tally
) -> None:
    rng = random.Random(41)
    jobs = [(rng.choice(sorted(secrets)), i) for i in range(requests)]
    sent = 0
    killed: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:

        async def client() -> None:
            nonlocal sent
            while jobs:
                name, i = jobs.pop()
                sent += 1
                if sent == kill_at and not killed and tally.workers:
                    killed.append(min(tally.workers))
                    os.kill(int(killed[0]), signal.SIGKILL)
                question, idem = QUESTION.format(a=i, b=i % 7), f"load-{i}"
                start = time.perf_counter()
                reply = await _post(http, url, secrets[name], question, idem, tally)
                tally.latencies.append(time.perf_counter() - start)
                tally.codes[reply.status_code] = tally.codes.get(reply.status_code, 0) + 1
                if reply.status_code != 200:
                    continue
                got = (
                    reply.json()["lanefold"]["run_id"],
                    str(reply.json()["choices"][0]["message"]["content"]),
                )
                tally.first[idem] = got
                if i % 4 == 0:  # the retry: answered from the record, on either worker
                    again = await _post(http, url, secrets[name], question, idem, tally)
                    tally.retries += 1
                    if again.status_code == 200:
                        body = again.json()
                        tally.retries_same += (
                            body["lanefold"]["run_id"],
                            str(body["choices"][0]["message"]["content"]),
                        ) == got

        async with anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(client)
    tally.killed = killed


async def _baseline(config: Path, runs: Path, requests: int, clients: int) -> list[float]:
    latencies: list[float] = []
    left = list(range(requests))
    async with lanefold.Session(config, runs_dir=runs) as session:

        async def client() -> None:
            while left:
                i = left.pop()
                start = time.perf_counter()
                await session.run(QUESTION.format(a=i, b=i % 7))
                latencies.append(time.perf_counter() - start)

        async with anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(client)
    return latencies


def load(args: argparse.Namespace, machine: str) -> None:
    """Run the load test and print its table (see the module's docstring)."""
    from gateway import free_port, percentile, process, serve_argv  # the bench's helpers

    with tempfile.TemporaryDirectory(prefix="lanefold-bench-load-") as tmp:
        root = Path(tmp)
        (root / "loops").mkdir()
        config = root / "loops" / "instant.toml"
        config.write_text(LOOP)
        where = ["--store", args.store] if args.store else ["--runs-dir", str(root / "gw-runs")]
        # A request's spend, from one run of the config: the keys' budgets are set from it.
        per_request = anyio.run(_one_spend, config, root / "probe")
        share = per_request * args.requests // KEYS
        rng = random.Random(7)
        budgets = {f"key{n:02d}": rng.randint(share * 6 // 10, share) for n in range(KEYS)}
        secrets = _keys_file(root / "keys.toml", budgets)
        port = free_port()
        argv = serve_argv(
            "--loops", str(root / "loops"), *where, "--port", str(port), "--keys", str(root / "keys.toml"),
            "--store-keys", "--workers", str(args.workers),
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}/v1"
        tally = Tally()
        with process(argv, root / "gateway.log", f"{base}/models"):
            start = time.perf_counter()
            anyio.run(
                _load,
                f"{base}/chat/completions",
                secrets,
                args.requests,
                args.clients,
                args.requests // 2,
                tally,
            )
            seconds = time.perf_counter() - start
            # The clients' kept connections stay on the workers they reached; fresh ones show
            # which workers answer now (the survivor and the one started in the killed one's place).
            secret = next(iter(secrets.values()))
            alive = {
                httpx.get(f"{base}/models", headers={"Authorization": f"Bearer {secret}"}).headers[
                    "x-lanefold-worker"
                ]
                for _ in range(64)
            }
        baseline = anyio.run(_baseline, config, root / "base-runs", args.requests, args.clients)
        store = budget_store(open_store(args.store, root / "gw-runs"))
        over = []
        for name, limit in budgets.items():
            view = store.read_budget(f"key:{name}")
            spent = view.spent_tokens if view is not None else 0
            if spent > limit:
                over.append(f"{name} {spent}/{limit}")
        runs = sum(1 for _ in open_store(args.store, root / "gw-runs").list_runs())
        restarted = "killed by SIGKILL; started worker" in (root / "gateway.log").read_text()
    answered = tally.codes.get(200, 0)
    print(f"\nlanefold gateway under load: {machine}")
    print(
        f"`serve --workers {args.workers} --store-keys` on {'PostgreSQL' if args.store else 'files'}; "
        f"{args.clients} clients, {args.requests} requests over {KEYS} keys (token budgets 60-100 % of "
        f"an even share, {per_request} tokens a request); worker SIGKILLed at request {args.requests // 2}; "
        f"took {seconds:.0f} s ({args.requests / seconds:.0f} requests/s)"
    )
    print(
        f"replies: {dict(sorted(tally.codes.items()))}; connections cut by the kill, retried: {tally.cut_off}"
    )
    print(
        f"workers answering fresh connections after the load: {len(alive)}, the killed one "
        f"{'among them' if alive & set(tally.killed) else 'not among them'} (a new one started: {restarted})"
    )
    print()
    b50, b99 = percentile(baseline, 50) * 1e3, percentile(baseline, 99) * 1e3
    g50, g99 = percentile(tally.latencies, 50) * 1e3, percentile(tally.latencies, 99) * 1e3
    print(f"{'side':>32} | {'p50':>9} | {'p99':>9}")
    print(f"{'Session.run in-process (baseline)':>32} | {b50:6.2f} ms | {b99:6.2f} ms")
    print(f"{'gateway, 2 workers, over HTTP':>32} | {g50:6.2f} ms | {g99:6.2f} ms")
    print(f"{'added':>32} | {g50 - b50:6.2f} ms | {g99 - b99:6.2f} ms")
    print()
    print(f"{'PASS' if not over else 'MISS'}  keys over their limit (spent from the store): {over or 'none'}")
    print(f"{'PASS' if tally.retries_same == tally.retries else 'MISS'}  idempotent retries answered "
          f"with the first run's answer: {tally.retries_same} of {tally.retries}")  # fmt: skip
    print(f"      runs in the store: {runs}, requests answered: {answered} (a retry makes no run)")
    print(f"{'PASS' if restarted else 'MISS'}  the killed worker was started again")


async def _one_spend(config: Path, runs: Path) -> int:
    async with lanefold.Session(config, runs_dir=runs) as session:
        result = await session.run(QUESTION.format(a=1, b=1))
    return int(read_state(open_store(None, runs), result.run_id).spend.tokens)
