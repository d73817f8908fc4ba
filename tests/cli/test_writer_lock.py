"""One writer per run, as real processes contend for it.

`run` and `resume` hold an OS lock on the run (flock on the run folder's `lock` file) for as
long as they write it; the OS drops it when the process dies, so a SIGKILL leaves no stale
lock (the file stays; a writer that ends cleanly removes it). A second writer exits 2 at once
with one line naming the holder's pid (or `pid unknown`); readers (`show`, `tail`) take no lock
and are never blocked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lanefold.primitives import fold
from lanefold.stores.files import JsonlEventLog

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Slow lanes, two at a time, one request each: a run takes seconds, so two processes started
# together surely overlap, and a kill always finds lanes in flight.
CONFIG = """
[loop]
k = 6
max_concurrency = 2
seed = 11
min_quorum = 6

[backend]
kind = "simulated"
latency_ms = [1200, 1600]
lanes_per_request = 1
"""


def start(*argv: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lanefold", *map(str, argv)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(log: Path, kind: str, count: int = 1) -> None:
    """Until the log holds `count` events of `kind` (the process's doing, not a clock's)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count(f'"type":"{kind}"') >= count:
            return
        time.sleep(0.01)
    pytest.fail(f"the log never held {count} {kind}")


def in_use(line: str, run_id: str, command: str, holder: int) -> None:
    """The loser's one line names the holder's pid, or says it is unknown: a holder writes its
    pid just after it wins the flock, and a loser re-reads for about a second before it gives
    up on the pid (tests/primitives/test_run_lock.py pins that down without processes)."""
    found = re.fullmatch(
        rf"orchestrator {command}: run {re.escape(run_id)} is being written by "
        r"another process \(pid (\d+|unknown)\)",
        line,
    )
    assert found, line
    assert found.group(1) in (str(holder), "unknown"), line


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "slow.toml"
    path.write_text(CONFIG)
    return path


def test_two_resumes_after_a_kill_one_writes_the_other_exits_2(config: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    log = runs / "r" / "events.jsonl"
    first = start("run", config, "--question", "17*23?", "--runs-dir", runs, "--run-id", "r")
    wait_for(log, "lane.dispatched", 2)
    first.send_signal(signal.SIGKILL)
    first.communicate()

    a = start("resume", "r", "--runs-dir", runs, "--json")
    b = start("resume", "r", "--runs-dir", runs, "--json")
    outcomes = {proc.pid: (proc.wait(timeout=120), *proc.communicate()) for proc in (a, b)}
    codes = sorted(code for code, _, _ in outcomes.values())
    assert codes == [0, 2], outcomes
    (winner,) = [pid for pid, (code, _, _) in outcomes.items() if code == 0]
    (loser,) = [(out, err) for code, out, err in outcomes.values() if code == 2]
    assert loser[0] == ""
    in_use(loser[1].strip(), "r", "resume", winner)

    events = list(JsonlEventLog(log).read())
    state = fold(events, run_id="r")  # folds cleanly: one writer, one sequence
    assert state.result is not None
    completed = Counter(e.lane for e in events if e.type == "lane.completed")
    assert sorted(completed) == list(range(6)) and set(completed.values()) == {1}
    assert sum(e.type == "run.resumed" for e in events) == 1


def test_a_resume_against_a_live_run_exits_2_and_readers_are_never_blocked(tmp_path: Path) -> None:
    # Four processes start while the live run goes on: its lanes take long enough (about 15 s
    # in all) that it is still writing when the last of them tries, even on a loaded machine.
    config = tmp_path / "slower.toml"
    config.write_text(CONFIG.replace("[1200, 1600]", "[4500, 5000]"))
    runs = tmp_path / "runs"
    log = runs / "live" / "events.jsonl"
    live = start("run", config, "--question", "17*23?", "--runs-dir", runs, "--run-id", "live", "--json")
    try:
        wait_for(log, "lane.dispatched")
        size = log.stat().st_size
        intruder = start("resume", "live", "--runs-dir", runs)
        out, err = intruder.communicate(timeout=120)
        assert intruder.returncode == 2
        assert out == ""
        in_use(err.strip(), "live", "resume", live.pid)
        assert log.stat().st_size >= size  # nothing cut, nothing written by the intruder
        for reader in (
            start("show", "live", "--runs-dir", runs, "--json"),
            start("tail", "live", "--runs-dir", runs, "--json"),
        ):
            out, err = reader.communicate(timeout=120)
            assert reader.returncode == 0, err
            assert out
        second = start("run", config, "--question", "q", "--runs-dir", runs, "--run-id", "live")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2
        in_use(err.strip(), "live", "run", live.pid)
    finally:
        out, err = live.communicate(timeout=120)
    assert live.returncode == 0, err
    assert json.loads(out)["status"] == "answered"
    assert fold(JsonlEventLog(log).read(), run_id="live").result is not None
    assert "lock" not in {p.name for p in log.parent.iterdir()}  # the writer ended cleanly


def test_a_killed_writer_leaves_no_stale_lock(config: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    log = runs / "k" / "events.jsonl"
    proc = start("run", config, "--question", "q", "--runs-dir", runs, "--run-id", "k")
    wait_for(log, "lane.dispatched")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert (runs / "k" / "lock").read_text().strip() == str(proc.pid)  # the file stays...
    resumed = start("resume", "k", "--runs-dir", runs, "--json")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err  # ...but the lock died with its holder
    assert not (runs / "k" / "lock").exists()  # and a writer that ends cleanly removes it
