"""The `orchestrator` command end to end over the simulated backend: show and resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import (
    QUESTION,
    Outcome,
    cli,
    events_path,
    example_variant,
    log_events,
    log_lines,
    relabel,
)

# -- show and resume --------------------------------------------------------------------------------


def test_show_and_resume_print_the_runs_object(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = events_path(runs, "done")
    before = log.read_bytes()
    shown = cli(capsys, "show", "done", "--runs-dir", runs, "--json")
    resumed = cli(capsys, "resume", "done", "--runs-dir", runs, "--json")
    assert (shown.code, resumed.code) == (0, 0)
    # show adds every reduction of the run, its own first, and the backend it ran on
    shown_json = shown.json
    reductions = shown_json.pop("reductions")
    assert [r["reduction"] for r in reductions] == [1]
    started = json.loads(log.read_text().splitlines()[0])
    assert shown_json.pop("backend") == {"name": started["data"]["backend"]}  # (no structured notes)
    assert reductions[0]["winner"] == finished.json["answer"]
    assert shown_json == finished.json
    assert resumed.json == finished.json
    assert resumed.out == finished.out
    assert log.read_bytes() == before, "show and resume of a finished run append nothing"


def test_resume_of_a_finished_run_calls_no_backend(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = tmp_path / "calls.txt"
    config = example_variant(tmp_path, {"backend": {"call_log": str(calls), "latency_ms": [0, 0]}})
    ran = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "counted", "--json"
    )
    assert ran.code == 0
    made = calls.read_text().splitlines()
    assert len(made) == 8  # one attempt per lane, no faults
    assert cli(capsys, "resume", "counted", "--runs-dir", runs).code == 0
    assert calls.read_text().splitlines() == made


def test_show_without_json_is_readable(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = cli(capsys, "show", "done", "--runs-dir", runs)
    assert shown.code == 0
    assert "391" in shown.out
    assert "{" not in shown.out.splitlines()[0]


@pytest.mark.parametrize("subcommand", ["resume", "show", "tail"])
def test_unknown_run_id_exits_2(subcommand: str, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs.mkdir()
    outcome = cli(capsys, subcommand, "unknown-id", "--runs-dir", runs)
    assert outcome.code == 2
    assert "unknown-id" in outcome.error_line
    assert outcome.out == ""
    assert list(runs.iterdir()) == [], "looking up a run must not create it"


def _corrupt(lines: list[str], kind: str, at: int) -> list[str]:
    """Lines with line number `at` (1-based) spoilt."""
    spoilt = list(lines)
    i = at - 1
    if kind == "garbage":
        spoilt[i] = "{not json"
    elif kind == "blank":
        spoilt[i] = ""
    elif kind == "duplicate":
        spoilt.insert(i, lines[i - 1])
    elif kind == "unknown-type":
        event = json.loads(lines[i])
        event["type"] = "lane.teleported"
        spoilt[i] = json.dumps(event)
    elif kind == "wrong-sequence":
        event = json.loads(lines[i])
        event["sequence"] += 5
        spoilt[i] = json.dumps(event)
    return spoilt


@pytest.mark.parametrize("finished_log", [True, False], ids=["finished", "unfinished"])
@pytest.mark.parametrize("kind", ["garbage", "blank", "duplicate", "unknown-type", "wrong-sequence"])
def test_a_corrupt_log_makes_resume_and_show_exit_2_naming_the_line(
    finished: Outcome, kind: str, finished_log: bool, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = relabel(log_lines(events_path(runs, "done")), "bad")
    if not finished_log:
        lines = lines[:12]  # a crash after some lanes landed: resumable, were it not corrupt
    log = events_path(runs, "bad")
    log.parent.mkdir()
    log.write_text("\n".join(_corrupt(lines, kind, at=5)) + "\n", encoding="utf-8")
    before = log.read_bytes()
    for subcommand in ("resume", "show", "tail"):
        outcome = cli(capsys, subcommand, "bad", "--runs-dir", runs, "--json")
        assert outcome.code == 2, subcommand
        assert re.search(r"events\.jsonl:5\b", outcome.error_line), outcome.error_line
        assert outcome.out == ""
    assert log.read_bytes() == before, "a corrupt log is left as it was found"


def test_resume_cuts_a_torn_tail_and_finishes(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = relabel(log_lines(events_path(runs, "done")), "torn")
    half = lines[12][: len(lines[12]) // 2]
    log = events_path(runs, "torn")
    log.parent.mkdir()
    log.write_text("\n".join(lines[:12]) + "\n" + half, encoding="utf-8")
    resumed = cli(capsys, "resume", "torn", "--runs-dir", runs, "--json")
    assert resumed.code == 0, resumed.err
    result = resumed.json
    original = finished.json
    assert result["answer"] == original["answer"]
    assert result["votes"] == original["votes"]
    events = log_events(log)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    marks = [e for e in events if e["type"] == "run.resumed"]
    assert len(marks) == 1
    assert marks[0]["data"]["torn_tail_bytes"] == len(half.encode())
    assert events[-1]["type"] == "run.completed"
