"""The gateway as a user runs it: `orchestrator serve --loops` in its own process, killed and
restarted, two replicas on one PostgreSQL store, and its bad input told in one line."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from lanefold.execution import open_store, read_state

pytest.importorskip("starlette")

KEY = "gateway-test-key-42"
LOOP = """
[loop]
k = 6
max_concurrency = 6
seed = 3
min_quorum = 2
[prompt]
template = "Question: {question}\\nEnd with 'Answer: <number>'.\\n"
[sampling]
max_tokens = 64
[extract]
method = "regex"
regex = 'Answer:\\s*([-0-9.,]+)'
[backend]
kind = "simulated"
accuracy = 0.6
latency_ms = [%(low)s, %(high)s]
prompt_tokens = 30
output_tokens = 40
call_log = "%(calls)s"
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loops(folder: Path, calls: Path, low: float = 1, high: float = 5) -> Path:
    loops = folder / "loops"
    loops.mkdir(parents=True, exist_ok=True)
    (loops / "vote.toml").write_text(LOOP % {"low": low, "high": high, "calls": calls})
    return loops


def _keys(folder: Path, budget: str = "") -> Path:
    path = folder / "keys.toml"
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(f'[[keys]]\nname = "alice"\nsha256 = "{sha}"\n{budget}\n')
    return path


def _orchestrator(*args: str, cwd: Path) -> list[str]:
    return [sys.executable, "-m", "lanefold", *args]


@contextmanager
def served(folder: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`orchestrator serve --loops ...` on a free port; the process and its base URL."""
    port = _port()
    process = subprocess.Popen(
        _orchestrator("serve", "--port", str(port), *args, cwd=folder),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    out = process.stdout.read() if process.stdout else ""
                    raise AssertionError(f"the gateway did not start: {out}") from None
                time.sleep(0.05)
        yield process, url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _chat(url: str, question: str = "What is 17 * 23?", idempotency: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    if idempotency is not None:
        headers["Idempotency-Key"] = idempotency
    body = {"model": "vote", "messages": [{"role": "user", "content": question}]}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60)


def _completed_lanes(events: Path) -> set[tuple[int, int]]:
    done = set()
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "lane.completed":
            done.add((event["wave"], event["lane"]))
    return done


def test_sigkill_mid_request_then_a_retry_on_a_restarted_gateway_finishes_the_run(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    loops = _loops(tmp_path, calls, low=100, high=3000)
    args = ("--loops", str(loops), "--runs-dir", "runs", "--keys", str(_keys(tmp_path)))
    with served(tmp_path, *args) as (process, url):
        threading.Thread(target=lambda: _try(url), daemon=True).start()
        runs = tmp_path / "runs"
        deadline = time.monotonic() + 30
        events = None
        while time.monotonic() < deadline:
            found = list(runs.glob("*/events.jsonl"))
            if found and len(_completed_lanes(found[0])) >= 2:
                events = found[0]
                break
            time.sleep(0.01)
        assert events is not None, "no lane landed"
        process.kill()  # SIGKILL: no interrupt recorded, lanes left in flight
        process.wait()
    before = _completed_lanes(events)
    assert len(before) < 6
    attempts_before = calls.read_text().splitlines()
    with served(tmp_path, *args) as (_, url):
        retry = _chat(url, idempotency="kill-me")
    assert retry.status_code == 200, retry.text
    got = retry.json()["lanefold"]
    assert got["run_id"] == events.parent.name and got["resumes"] == 1
    redispatched = {
        tuple(map(int, line.split()[:2])) for line in calls.read_text().splitlines()[len(attempts_before) :]
    }
    assert redispatched.isdisjoint(before)  # no completed lane dispatched twice
    state = read_state(open_store(None, tmp_path / "runs"), got["run_id"])
    assert state.result is not None
    # What the response says was paid is the log's fold (the crash's cut-off lanes included).
    assert got["bill"]["usage"]["cut_off_tokens"] == state.spend.cut_off_tokens > 0
    assert retry.json()["usage"]["total_tokens"] == (
        state.spend.prefill_tokens
        + state.spend.cached_prefill_tokens
        + state.spend.decode_tokens
        + state.spend.verifier_tokens
        + state.spend.cut_off_tokens
    )


def _try(url: str) -> None:
    try:
        _chat(url, idempotency="kill-me")
    except httpx.HTTPError:
        pass  # the gateway was killed under it


def test_two_replicas_on_one_postgresql_store_share_budgets_and_idempotency(
    tmp_path: Path, pg_url: str
) -> None:
    calls = tmp_path / "calls.txt"
    loops = _loops(tmp_path, calls)
    keys = _keys(tmp_path, "budget = {max_tokens = 1500}")
    args = ("--loops", str(loops), "--store", pg_url, "--keys", str(keys))
    with served(tmp_path, *args) as (_, a), served(tmp_path, *args) as (_, b):
        first = _chat(a, idempotency="one")
        lines = len(calls.read_text().splitlines())
        on_b = _chat(b, idempotency="one")
        assert on_b.status_code == 200
        assert on_b.json()["lanefold"]["run_id"] == first.json()["lanefold"]["run_id"]
        assert len(calls.read_text().splitlines()) == lines  # the other replica sampled nothing
        statuses = [_chat(url, f"What is {i} + {i}?").status_code for i, url in enumerate([a, b] * 5)]
    assert statuses[0] == 200 and 429 in statuses
    store = open_store(pg_url)
    view = store.read_budget("key:alice")  # type: ignore[attr-defined]
    assert view is not None
    assert view.spent_tokens <= 1500
    assert view.spent_tokens == sum(read_state(store, s.run_id).spend.tokens for s in store.list_runs())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--loops", "nowhere"), "--loops: nowhere is not a folder"),
        (("--loops", "loops", "--keys", "bad_keys.toml"), "bad_keys.toml: keys.0.sha256:"),
        (("--loops", "loops", "--keys", "keys.toml", "--api-key-env", "HOME"), "--keys and --api-key-env"),
        (("--loop", "vote"), "--loop 'vote': expected NAME=CONFIG"),
        (("--keys", "keys.toml", "--backend-config", "x.toml"), "--keys: keys govern loops"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    _loops(tmp_path, tmp_path / "calls.txt")
    _keys(tmp_path)
    (tmp_path / "bad_keys.toml").write_text('[[keys]]\nname = "a"\nsha256 = "the-key-itself"\n')
    done = subprocess.run(
        _orchestrator("serve", "--port", str(_port()), *args, cwd=tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": os.environ.get("HOME", "/root")},
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_backend_served_beside_the_loops_answers_to_its_own_name(tmp_path: Path) -> None:
    """`--backend-config` beside `--loops`: /v1/models lists both, and a request naming the
    backend is the backend's plain completion (no run, no `lanefold` object)."""
    loops = _loops(tmp_path, tmp_path / "calls.txt")
    (tmp_path / "sim.toml").write_text('[backend]\nkind = "simulated"\n')
    args = ("--loops", str(loops), "--backend-config", "sim.toml", "--runs-dir", "runs")
    with served(tmp_path, *args) as (_, url):
        names = [m["id"] for m in httpx.get(f"{url}/models", timeout=10).json()["data"]]
        body = {"model": "simulated", "messages": [{"role": "user", "content": "What is 1 + 1?"}], "n": 2}
        plain = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
        looped = _chat(url)
    assert names == ["vote", "simulated"]
    assert plain.status_code == 200 and len(plain.json()["choices"]) == 2
    assert "lanefold" not in plain.json() and "x-lanefold-run-id" not in plain.headers
    assert looped.status_code == 200 and looped.json()["lanefold"]["answer"]
    assert len(list((tmp_path / "runs").iterdir())) == 1  # only the loop's request is a run
