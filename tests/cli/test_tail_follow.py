"""`tail --follow` as an operator uses it, beside real writers.

It keeps following when a `resume` cuts a torn tail under it (and prints the final log's lines
exactly), gives up with exit 2 after `--wait SECONDS` on a run that never appears, follows a
run that appears within the wait to its end however long the run then takes, and ends quietly
with exit 0 on Ctrl-C while it waits. Every wait here is on something a process does (a line it
prints, a log's content, its exit), never on a clock, so load cannot flake it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lanefold.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "simulated.toml"
QUESTION = "What is 17 * 23?"

# The follower under test, with one line of its own: "polling" at its first sleep, which it
# takes inside its wait loop with the run's signals already in its hands. Then it is surely
# waiting, and a Ctrl-C reaches the follower rather than its start-up.
FOLLOWER = """\
import sys, anyio
from lanefold.cli import main
real_sleep, said = anyio.sleep, []
async def sleep(delay, *args, **kwargs):
    if not said:
        print("polling", flush=True)
        said.append(True)
    await real_sleep(delay, *args, **kwargs)
anyio.sleep = sleep
sys.exit(main(sys.argv[1:]))
"""


def start(*argv: str | Path, wrapped: bool = False) -> subprocess.Popen[str]:
    head = ["-c", FOLLOWER] if wrapped else ["-m", "lanefold"]
    return subprocess.Popen(
        [sys.executable, *head, *map(str, argv)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def config(tmp: Path, text: str) -> Path:
    path = tmp / "loop.toml"
    path.write_text(text)
    return path


def lines_of(log: Path) -> list[str]:
    return log.read_text().splitlines()


# Slow lanes three at a time: a kill always finds lanes in flight (as tests/cli/test_crash.py).
CRASHING = """
[loop]
k = 12
max_concurrency = 3
seed = 5
min_quorum = 6

[backend]
kind = "simulated"
latency_ms = [150, 250]
lanes_per_request = 1
"""


def torn_run(tmp: Path, runs: Path, run_id: str) -> tuple[Path, bytes]:
    """A run killed with SIGKILL after 3 lanes landed, its last line then cut in half (the
    process died mid-write). Returns the log and the torn tail."""
    log = runs / run_id / "events.jsonl"
    writer = start(
        "run", config(tmp, CRASHING), "--question", QUESTION, "--runs-dir", runs, "--run-id", run_id
    )
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count('"lane.completed"') >= 3):
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.01)  # polling the writer's log: the wait is on what it wrote
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        finish(writer)
    lines = log.read_bytes().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]
    log.write_bytes(b"".join(lines[:-1]) + torn)
    return log, torn


@pytest.mark.slow
@pytest.mark.timeout(300)  # a follower that never ends must fail, not hang
def test_follow_keeps_following_when_resume_cuts_a_torn_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    log, torn = torn_run(tmp_path, runs, "torn")
    whole = lines_of(log)[:-1]
    follower = start("tail", "torn", "--runs-dir", runs, "--follow", "--json")
    try:
        assert follower.stdout is not None
        printed = [follower.stdout.readline().rstrip("\n") for _ in whole]
        assert printed == whole, "the follower prints every whole line, never the torn tail"
        assert main(["resume", "torn", "--runs-dir", str(runs), "--json"]) == 0
        capsys.readouterr()
    finally:
        out, err = finish(follower)
    assert follower.returncode == 0, err
    assert err == ""
    final = lines_of(log)
    assert printed + out.splitlines() == final
    assert json.loads(final[-1])["type"] == "run.completed"
    resumed = [json.loads(line)["data"] for line in final if '"run.resumed"' in line]
    assert [r["torn_tail_bytes"] for r in resumed] == [len(torn)]


def test_follow_of_a_run_that_never_appears_gives_up_after_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    code = main(["tail", "never", "--runs-dir", str(runs), "--follow", "--wait", "1"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "'never'" in err and "1 s" in err
    assert out == ""
    assert not runs.exists(), "waiting for a run must not create it"


# Two slow lanes one at a time: once it appears, the run lasts longer than the follower's wait.
SLOW = """
[loop]
k = 2
max_concurrency = 1
seed = 3
min_quorum = 2

[backend]
kind = "simulated"
latency_ms = [2500, 2500]
lanes_per_request = 1
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_follow_of_a_run_that_appears_within_the_wait_follows_it_to_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --wait bounds the wait for the run to appear, not how long the follower follows it.
    runs = tmp_path / "runs"
    follower = start("tail", "soon", "--runs-dir", runs, "--follow", "--wait", "4", "--json", wrapped=True)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "polling\n"  # waiting, and nothing printed yet
        assert not runs.exists()
        assert (
            main(
                [
                    "run",
                    str(config(tmp_path, SLOW)),
                    "--question",
                    QUESTION,
                    "--runs-dir",
                    str(runs),
                    "--run-id",
                    "soon",
                    "--json",
                ]
            )
            == 0
        )
        capsys.readouterr()
    finally:
        out, err = finish(follower)
    assert follower.returncode == 0, err
    assert err == ""
    assert out.splitlines() == lines_of(runs / "soon" / "events.jsonl")
    assert json.loads(out.splitlines()[-1])["type"] == "run.completed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_ends_a_follower_waiting_for_a_run_quietly(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    follower = start("tail", "absent", "--runs-dir", runs, "--follow", wrapped=True)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "polling\n"
        follower.send_signal(signal.SIGINT)
    finally:
        out, err = finish(follower)
    assert follower.returncode == 0, err
    assert err == ""
    assert out == ""
    assert not runs.exists()
