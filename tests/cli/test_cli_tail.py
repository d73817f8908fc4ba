"""The `orchestrator` command end to end over the simulated backend: tail."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import (
    EXAMPLE,
    QUESTION,
    ROOT,
    Outcome,
    cli,
    events_path,
    log_events,
    log_lines,
    relabel,
)

from lanefold.cli import main

# -- tail -------------------------------------------------------------------------------------------


def test_tail_prints_one_readable_line_per_event(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = log_events(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs)
    assert outcome.code == 0
    printed = outcome.out.splitlines()
    assert len(printed) == len(events)
    for line, event in zip(printed, events, strict=True):
        assert line.startswith(f"#{event['sequence']} ")
        assert event["type"] in line
        assert not line.lstrip().startswith("{")


def test_tail_json_prints_the_logs_lines(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = log_lines(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs, "--json")
    assert outcome.code == 0
    printed = outcome.out.splitlines()
    assert [json.loads(line) for line in printed] == [json.loads(line) for line in lines]
    assert printed == lines


@pytest.mark.timeout(60)  # a follower that never ends must fail, not hang
@pytest.mark.parametrize("as_json", [False, True])
def test_tail_follow_of_a_finished_run_exits_0(
    finished: Outcome, runs: Path, as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = log_lines(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs, "--follow", *(["--json"] if as_json else []))
    assert outcome.code == 0
    assert len(outcome.out.splitlines()) == len(lines)
    if as_json:
        assert outcome.out.splitlines() == lines


@pytest.mark.timeout(60)  # a follower that never ends must fail, not hang
def test_tail_follow_waits_for_a_run_that_has_not_started(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A wrapper that says "ready" once imports are done, so the follower is surely waiting
    # before the run exists; it then runs exactly what the `orchestrator` script runs.
    code = (
        "import sys; from lanefold.cli import main; print('ready', flush=True); sys.exit(main(sys.argv[1:]))"
    )
    follower = subprocess.Popen(
        [sys.executable, "-c", code, "tail", "later", "--runs-dir", str(runs), "--follow", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "ready\n"
        assert not runs.exists()
        ran = cli(
            capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "later", "--json"
        )
        assert ran.code == 0
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert err == ""
    assert out.splitlines() == log_lines(events_path(runs, "later"))
    assert json.loads(out.splitlines()[-1])["type"] == "run.completed"


@pytest.mark.parametrize(
    ("wait", "why"),
    [
        ("nan", "is not a finite number of seconds"),
        ("inf", "is not a finite number of seconds"),
        ("-inf", "is not a finite number of seconds"),
        ("1e999", "is not a finite number of seconds"),
        ("-1", "is negative"),
        ("soon", "is not a number of seconds"),
    ],
)
def test_tail_wait_takes_a_finite_number_of_seconds(
    wait: str, why: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--wait nan` used to reach anyio's move_on_after and end in a ValueError traceback.
    with pytest.raises(SystemExit) as exit_:
        main(["tail", "later", "--runs-dir", str(runs), "--follow", f"--wait={wait}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines() == [
        f"orchestrator tail: error: argument --wait: {wait!r} {why} (see orchestrator tail --help)"
    ]


def test_tail_follow_ends_on_ctrl_c_quietly_with_exit_0(finished: Outcome, runs: Path) -> None:
    # A run that has started and not ended: the follower waits for more. Every wait below is
    # on something the follower does (a line it prints), never on a clock: load cannot flake it.
    log = events_path(runs, "waiting")
    log.parent.mkdir()
    log.write_text(relabel(log_lines(events_path(runs, "done")), "waiting")[0] + "\n", encoding="utf-8")
    follower = subprocess.Popen(
        [sys.executable, "-m", "lanefold", "tail", "waiting", "--runs-dir", str(runs), "--follow"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # printed from inside the follow loop
        assert first.startswith("#1 ") and "run.started" in first
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert err == ""
    assert out == ""
