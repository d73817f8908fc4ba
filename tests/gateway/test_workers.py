"""`orchestrator serve --workers 2` as a user runs it (issue 41): two forked workers behind one
port on files and on PostgreSQL; requests spread over both (each reply names its worker), an
idempotent retry landing on the other worker answered from the record, a key's budget never
overspent across them, and a worker killed with SIGKILL started again while the port answers."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_gateway_processes import KEY, _keys, _loops, _orchestrator, _port, served

from lanefold.execution import Store, open_store, read_state

pytest.importorskip("starlette")

WORKER = "x-lanefold-worker"


@pytest.fixture(params=["files", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The flags naming the store the gateway and the checks read."""
    if request.param == "files":
        return ["--runs-dir", str(tmp_path / "runs")]
    return ["--store", str(request.getfixturevalue("pg_url"))]


def _chat(url: str, question: str, idempotency: str | None = None) -> httpx.Response:
    """One request on a connection of its own (so the kernel may hand it to either worker)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    if idempotency is not None:
        headers["Idempotency-Key"] = idempotency
    body = {"model": "vote", "messages": [{"role": "user", "content": question}]}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60)


def _workers_seen(url: str, want: int, tries: int = 40) -> set[str]:
    """The worker pids answering /v1/models, asked 16 at a time until `want` are seen."""
    seen: set[str] = set()

    def ask(_: int) -> str:
        reply = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply.headers[WORKER]

    with ThreadPoolExecutor(16) as pool:
        for _ in range(tries):
            seen |= set(pool.map(ask, range(16)))
            if len(seen) >= want:
                break
    return seen


def _store(where: list[str], tmp_path: Path) -> Store:
    return open_store(where[1]) if where[0] == "--store" else open_store(None, tmp_path / "runs")


def test_two_workers_share_one_port_idempotency_and_a_budget(tmp_path: Path, where: list[str]) -> None:
    calls = tmp_path / "calls.txt"
    loops = _loops(tmp_path, calls)
    keys = _keys(tmp_path, "budget = {max_tokens = 1500}")
    with served(tmp_path, "--loops", str(loops), "--keys", str(keys), "--workers", "2", *where) as (_, url):
        pids = _workers_seen(url, 2)
        assert len(pids) == 2, pids  # both workers answer on the one port
        first = _chat(url, "What is 17 * 23?", idempotency="once")
        assert first.status_code == 200, first.text
        lines = len(calls.read_text().splitlines())
        # The retry, sent until it lands on the other worker: answered from the record there.
        for _ in range(200):
            again = _chat(url, "What is 17 * 23?", idempotency="once")
            assert again.status_code == 200, again.text
            assert again.json()["lanefold"]["run_id"] == first.json()["lanefold"]["run_id"]
            assert again.json()["choices"] == first.json()["choices"]
            if again.headers[WORKER] != first.headers[WORKER]:
                break
        assert again.headers[WORKER] != first.headers[WORKER], "every retry landed on the first worker"
        assert len(calls.read_text().splitlines()) == lines  # nothing sampled again
        # Spend the key out from both workers at once: never past its 1,500 tokens.
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: _chat(url, f"What is {i} + {i}?").status_code, range(16)))
    assert 200 in statuses and 429 in statuses, statuses
    assert set(statuses) <= {200, 429}
    store = _store(where, tmp_path)
    view = store.read_budget("key:alice")  # type: ignore[attr-defined]
    assert view is not None
    assert view.spent_tokens <= 1500
    assert view.spent_tokens == sum(read_state(store, s.run_id).spend.tokens for s in store.list_runs())
    assert sum(1 for s in store.list_runs()) == 1 + statuses.count(200)  # the retries made no run


def test_a_burst_of_new_connections_is_spread_over_the_workers(tmp_path: Path) -> None:
    """Each worker listens on a socket of its own (SO_REUSEPORT, on Linux): the kernel spreads
    connections by address, so a client pool opening 32 at once reaches both (on one shared
    socket, the worker already awake could take the whole burst and keep it)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("one shared socket off Linux (serve._run.balanced_workers)")
    loops = _loops(tmp_path, tmp_path / "calls.txt")
    argv = ("--loops", str(loops), "--keys", str(_keys(tmp_path)), "--workers", "2")
    with served(tmp_path, *argv, "--runs-dir", str(tmp_path / "runs")) as (_, url):
        assert len(_workers_seen(url, 2)) == 2  # both up

        def ask(_: int) -> str:
            reply = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
            assert reply.status_code == 200, reply.text
            return reply.headers[WORKER]

        with ThreadPoolExecutor(32) as pool:
            counts = Counter(pool.map(ask, range(32)))
        assert _listening(int(url.rsplit(":", 1)[1].split("/")[0])) == 2  # one socket each
    # Binomial(32, 1/2): fewer than 4 on one worker about once in 400,000 bursts.
    assert len(counts) == 2 and min(counts.values()) >= 4, counts


def _listening(port: int) -> int:
    """How many sockets listen on `port` (TCP state 0A in /proc/net/tcp and tcp6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                count += int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A"
    return count


def test_a_killed_worker_is_started_again_and_the_port_keeps_answering(
    tmp_path: Path, where: list[str]
) -> None:
    loops = _loops(tmp_path, tmp_path / "calls.txt")
    with served(
        tmp_path, "--loops", str(loops), "--keys", str(_keys(tmp_path)), "--workers", "2", *where
    ) as (
        process,
        url,
    ):
        before = _workers_seen(url, 2)
        assert len(before) == 2, before
        killed = min(before)
        os.kill(int(killed), signal.SIGKILL)
        # Answered all along: by the survivor at once, then by the survivor and the new worker.
        deadline = time.monotonic() + 60
        after: set[str] = set()
        while len(after - {killed}) < 2:
            assert time.monotonic() < deadline, f"no worker started again: {after}"
            reply = _chat(url, "What is 2 + 2?")
            assert reply.status_code == 200, reply.text
            after |= _workers_seen(url, 3, tries=1)
        assert killed not in after
        assert process.poll() is None  # the supervisor lives on
    assert process.returncode == 0  # and stops cleanly on SIGTERM


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--loops", "loops", "--workers", "0"), "orchestrator serve: --workers 0: at least 1"),
        (("--backend-config", "x.toml", "--workers", "2"), "--workers: several workers serve loops"),
    ],
)
def test_bad_workers_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    _loops(tmp_path, tmp_path / "calls.txt")
    done = subprocess.run(
        _orchestrator("serve", "--port", str(_port()), *args, cwd=tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr


def test_a_worker_that_cannot_start_stops_the_server_with_its_code(tmp_path: Path) -> None:
    """A store no worker can reach: not started again forever, but the server's exit 2 (a
    single process's code for it), the worker's error and the supervisor's, no traceback."""
    _loops(tmp_path, tmp_path / "calls.txt")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"postgresql://nobody@127.0.0.1:{unused.getsockname()[1]}/none"
        argv = ["serve", "--port", str(_port()), "--loops", "loops", "--store", dead, "--store-keys"]
        done = subprocess.run(
            _orchestrator(*argv, "--workers", "2", cwd=tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert "cannot connect" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("orchestrator serve: worker ")
    assert "exited with code 2; the server stopped" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_keys_file_seeds_the_store_once_for_all_workers(tmp_path: Path, where: list[str]) -> None:
    """`--store-keys --keys FILE --workers 4`: the file seeded once before the workers start
    (four workers seeding it at once raced: 'key ...: already in', the server stopped)."""
    loops = _loops(tmp_path, tmp_path / "calls.txt")
    names = [f"k{n:02d}" for n in range(24)]
    keys = tmp_path / "keys.toml"
    rows = [
        f'[[keys]]\nname = "{n}"\nsha256 = "{hashlib.sha256(f"s-{n}".encode()).hexdigest()}"\n' for n in names
    ]
    keys.write_text(
        "\n".join(rows) + f'[[keys]]\nname = "alice"\nsha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"\n'
    )
    args = ("--loops", str(loops), "--store-keys", "--keys", str(keys), "--workers", "4", *where)
    with served(tmp_path, *args) as (_, url):
        for name in names:
            reply = httpx.get(f"{url}/usage", headers={"Authorization": f"Bearer s-{name}"}, timeout=30)
            assert reply.status_code == 200, reply.text
