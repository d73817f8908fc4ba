"""The PostgreSQL store as real processes use it: one writer per run across processes (the
advisory lock dies with its holder), SIGKILL mid-run then resume, and `tail --follow` woken by
LISTEN/NOTIFY. The file-log versions are tests/cli/test_writer_lock.py, tests/cli/test_crash.py and
tests/cli/test_tail_follow.py; waits here are on what a process does (rows it commits, a session it
opens, its exit), never on a clock.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import lanefold
from lanefold import PgStore, read_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Slow lanes, two at a time, one request each: a run takes seconds, so a kill always finds
# lanes in flight and a second writer always finds the first still writing.
CONFIG = """
[loop]
k = 6
max_concurrency = 2
seed = 11
min_quorum = 6

[sampling]
max_tokens = 64

[backend]
kind = "simulated"
latency_ms = [{latency}]
lanes_per_request = 1
call_log = "{calls}"

[store]
url = "{url}"
password_env = "LANEFOLD_PG_PASSWORD"
"""

# The follower under test, saying "slept" if it ever sleeps: following a PostgreSQL log waits
# on the connection's socket for a NOTIFY, never on a timer.
FOLLOWER = """\
import sys, anyio
from lanefold.cli import main
real_sleep = anyio.sleep
async def sleep(delay, *args, **kwargs):
    print("slept", flush=True)
    await real_sleep(delay, *args, **kwargs)
anyio.sleep = sleep
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def db(pg_server: Any, tmp_path: Path) -> dict[str, Any]:
    name = pg_server.create_database()
    bare = pg_server.url(name, password=False)
    # `run` reads the password from the variable its config names; the commands without a
    # config (`resume`, `tail`) from libpq's own PGPASSWORD.
    env = {**os.environ, "LANEFOLD_PG_PASSWORD": pg_server.password, "PGPASSWORD": pg_server.password}
    return {"url": pg_server.url(name), "bare": bare, "env": env, "tmp": tmp_path}


def config(db: dict[str, Any], name: str, latency: str = "1200, 1600") -> Path:
    path = db["tmp"] / f"{name}.toml"
    path.write_text(CONFIG.format(latency=latency, calls=db["tmp"] / f"{name}.calls", url=db["bare"]))
    return path


def start(
    db: dict[str, Any],
    *argv: str | Path,
    head: tuple[str, ...] = ("-m", "lanefold"),
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *head, *map(str, argv)],
        cwd=ROOT,
        env=db["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def rows(url: str, run_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        try:
            found = conn.execute(
                "SELECT body FROM lanefold_events WHERE run_id = %s ORDER BY sequence", (run_id,)
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [json.loads(body) for (body,) in found]


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"never: {what}")


def count(url: str, run_id: str, kind: str) -> int:
    return sum(event["type"] == kind for event in rows(url, run_id))


def in_use(err: str, run_id: str, command: str) -> int:
    found = re.fullmatch(
        rf"orchestrator {command}: run {re.escape(run_id)} is being written by "
        r"another process \(pid (\d+)\)",
        err.strip(),
    )
    assert found, err
    return int(found.group(1))


def test_one_writer_across_processes_and_a_sigkill_frees_the_run(db: dict[str, Any]) -> None:
    url, bare = db["url"], db["bare"]
    # Lanes of a minute: the writer is surely still writing whatever the load; it never ends
    # on its own, it is killed.
    slow = config(db, "live", "60000, 60000")
    live = start(db, "run", slow, "--question", "17*23?", "--run-id", "live", "--json")
    try:
        wait_until(lambda: count(url, "live", "lane.dispatched") >= 1, "the run dispatched")
        intruder = start(db, "resume", "live", "--store", bare)
        out, err = finish(intruder)
        assert intruder.returncode == 2 and out == ""
        assert in_use(err, "live", "resume") == live.pid
        second = start(db, "run", slow, "--question", "q", "--run-id", "live")
        _, err = finish(second)
        assert second.returncode == 2 and in_use(err, "live", "run") == live.pid
        reader = start(db, "show", "live", "--store", bare, "--json")  # readers take no lock
        out, err = finish(reader)
        assert reader.returncode == 0, err
        assert json.loads(out)["status"] == "unfinished"
        assert live.poll() is None
        before = rows(url, "live")
    finally:
        live.send_signal(signal.SIGKILL)
        finish(live)
    # The server ended the dead writer's session and its lock with it: a resume takes the run
    # and writes (it is killed too once it has: its lanes would take minutes).
    after = start(db, "resume", "live", "--store", bare)
    try:
        wait_until(lambda: count(url, "live", "run.resumed") == 1, "the resume wrote")
    finally:
        after.send_signal(signal.SIGKILL)
        finish(after)
    events = rows(url, "live")
    assert events[: len(before)] == before  # nothing the dead writer committed was touched
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    resumed = next(e for e in events if e["type"] == "run.resumed")
    in_flight = {lane for _, lane in resumed["data"]["in_flight"]}
    assert in_flight == {e["lane"] for e in before if e["type"] == "lane.dispatched"}


def test_sigkill_mid_run_then_resume_redoes_no_completed_lane(db: dict[str, Any]) -> None:
    url = db["url"]
    baseline = lanefold.run_sync(config(db, "base", "150, 250"), "17*23?", run_id="base", store=url)
    crash = config(db, "crash", "150, 250")
    proc = start(db, "run", crash, "--question", "17*23?", "--run-id", "crash")
    try:
        wait_until(lambda: count(url, "crash", "lane.completed") >= 3, "3 lanes completed")
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    before = rows(url, "crash")
    done_before = {e["lane"] for e in before if e["type"] == "lane.completed"}
    assert 3 <= len(done_before) < 6
    calls_before = (db["tmp"] / "crash.calls").read_text().splitlines()

    result = lanefold.resume_sync("crash", store=url)  # another process: this one

    calls_after = (db["tmp"] / "crash.calls").read_text().splitlines()[len(calls_before) :]
    redone = {int(line.split()[1]) for line in calls_after}
    assert redone and not (redone & done_before)
    assert (result.answer, result.votes) == (baseline.answer, baseline.votes)
    assert result.resumes == 1
    store = PgStore.from_url(url)
    _, state, _ = read_run(store, "crash")
    assert state.result == result.model_dump(mode="json")
    assert lanefold.UsageBreakdown.of(state.spend) == result.usage
    assert result.usage.decode_tokens == baseline.usage.decode_tokens


def test_tail_follow_from_another_process_is_woken_by_notify(db: dict[str, Any]) -> None:
    url, bare = db["url"], db["bare"]
    follower = start(
        db, "tail", "f", "--follow", "--json", "--store", bare, "--wait", "300", head=("-c", FOLLOWER)
    )

    def listening() -> bool:
        with psycopg.connect(url) as conn:
            # Idle after its first read of the rows, which comes after its LISTEN.
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name"
                " = 'lanefold follower' AND state = 'idle'"
                " AND query LIKE '%%sequence > %%'"
            ).fetchone()
        return bool(found and found[0])

    try:
        wait_until(listening, "the follower listens")  # before the run exists
        writer = start(db, "run", config(db, "f", "100, 200"), "--question", "q", "--run-id", "f")
        _, err = finish(writer)
        assert writer.returncode == 0, err
        out, err = finish(follower)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert "slept" not in out  # woken by NOTIFY, never by a timer
    assert [json.loads(line) for line in out.splitlines()] == rows(url, "f")
