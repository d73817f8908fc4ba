"""Crash and resume as a real crash happens: a subprocess killed with SIGKILL mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import lanefold
from lanefold.stores.files import JsonlEventLog

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

CONFIG = """
[loop]
k = 12
max_concurrency = 3
seed = 5
min_quorum = 6

[sampling]
max_tokens = 64

[backend]
kind = "simulated"
latency_ms = [150, 250]
lanes_per_request = 1
call_log = "{calls}"

[pricing]
input_per_mtok = 1.0
cached_input_per_mtok = 0.5
output_per_mtok = 2.0
"""


def write_config(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(CONFIG.format(calls=tmp / f"{name}.calls"))
    return path


def events(runs: Path, run_id: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]


def kill_after_completions(config: Path, runs: Path, run_id: str, completions: int) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lanefold",
            "run",
            str(config),
            "--question",
            "17*23?",
            "--runs-dir",
            str(runs),
            "--run-id",
            run_id,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = runs / run_id / "events.jsonl"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if log.exists() and log.read_text().count('"lane.completed"') >= completions:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the run never reached the kill point")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def completed_lanes(evs: list[dict[str, object]]) -> set[int]:
    return {int(e["lane"]) for e in evs if e["type"] == "lane.completed"}  # type: ignore[call-overload]


def test_sigkill_then_resume_finishes_without_redoing_completed_lanes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    baseline = lanefold.run_sync(write_config(tmp_path, "base"), "17*23?", runs_dir=runs, run_id="base")

    config = write_config(tmp_path, "crash")
    kill_after_completions(config, runs, "crash", completions=4)
    before = events(runs, "crash")
    done_before = completed_lanes(before)
    assert 4 <= len(done_before) < 12
    assert before[-1]["type"] not in ("run.completed", "run.failed")
    calls_before = (tmp_path / "crash.calls").read_text().splitlines()

    result = lanefold.resume_sync("crash", runs_dir=runs)

    # Completed lanes were never dispatched again: count the backend's own calls.
    calls_after = (tmp_path / "crash.calls").read_text().splitlines()[len(calls_before) :]
    redone = {int(line.split()[1]) for line in calls_after}
    assert redone and not (redone & done_before)
    per_lane = Counter(int(line.split()[1]) for line in calls_before + calls_after)
    assert all(per_lane[lane] == 1 for lane in done_before)

    # Same answer and votes as an uninterrupted run with the same seed.
    assert (result.answer, result.votes) == (baseline.answer, baseline.votes)
    assert result.resumes == 1

    # Spend is not counted twice: completed lanes once each, in-flight attempts at their hold.
    after = events(runs, "crash")
    resumed = [e for e in after if e["type"] == "run.resumed"]
    assert len(resumed) == 1
    in_flight = resumed[0]["data"]["in_flight"]  # type: ignore[index]
    completed_out = sum(
        e["data"]["usage"]["gen_ai.usage.output_tokens"]  # type: ignore[index]
        for e in after
        if e["type"] == "lane.completed"
    )
    assert len([e for e in after if e["type"] == "lane.completed"]) == 12
    # The bill shows what the crash cut off as its own line: each in-flight attempt's whole
    # hold (prompt 64 + max_tokens 64), never as decode tokens no lane decoded.
    assert result.usage.decode_tokens == completed_out == baseline.usage.decode_tokens
    assert result.usage.cut_off_tokens == (64 + 64) * len(in_flight)
    assert result.cost.cut_off > 0
    folded = lanefold.fold(
        JsonlEventLog(runs / "crash" / "events.jsonl").read(), lanefold.load_config(config).pricing
    )
    assert lanefold.UsageBreakdown.of(folded.spend) == result.usage


def test_a_kill_mid_write_leaves_a_torn_tail_that_resume_cuts_and_records(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = write_config(tmp_path, "torn")
    kill_after_completions(config, runs, "torn", completions=3)
    log = runs / "torn" / "events.jsonl"
    whole = log.read_bytes()
    lines = whole.splitlines(keepends=True)
    # The process died halfway through writing its last line.
    torn = lines[-1][: len(lines[-1]) // 2]
    log.write_bytes(b"".join(lines[:-1]) + torn)

    result = lanefold.resume_sync("torn", runs_dir=runs)
    assert result.answer is not None
    after = events(runs, "torn")
    resumed = next(e for e in after if e["type"] == "run.resumed")
    assert resumed["data"]["torn_tail_bytes"] == len(torn)  # type: ignore[index]
    assert resumed["data"]["torn_tail_line"] == len(lines)  # type: ignore[index]
    assert [e["sequence"] for e in after] == list(range(1, len(after) + 1))
    assert after[-1]["type"] == "run.completed"


def test_resume_of_a_finished_run_returns_the_record_and_calls_nothing(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = write_config(tmp_path, "done")
    first = lanefold.run_sync(config, "17*23?", runs_dir=runs, run_id="done")
    size = (runs / "done" / "events.jsonl").stat().st_size
    calls = (tmp_path / "done.calls").read_text()
    again = lanefold.resume_sync("done", runs_dir=runs)
    assert again == first
    assert (runs / "done" / "events.jsonl").stat().st_size == size
    assert (tmp_path / "done.calls").read_text() == calls
