"""The `orchestrator` command end to end over the simulated backend: failures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from cli_support import EXAMPLE, QUESTION, cli, events_path, example_variant, log_events

# -- failures -------------------------------------------------------------------------------------


def test_budget_too_small_for_the_quorum_exits_3(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"budget": {"max_tokens": 50}})
    outcome = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "poor", "--json"
    )
    assert outcome.code == 3
    assert "budget" in outcome.error_line
    assert outcome.out == ""
    events = log_events(events_path(runs, "poor"))
    assert [e["type"] for e in events[-2:]] == ["budget.exhausted", "run.failed"]
    assert not any(e["type"] == "lane.dispatched" for e in events)
    exhausted, failed = events[-2]["data"], events[-1]["data"]
    assert exhausted["limit"] == "max_tokens"
    assert exhausted["min_quorum"] == 3 and exhausted["k_fit"] < 3
    assert failed["exit_code"] == 3


def test_resume_of_a_failed_run_keeps_its_exit_code_and_log(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"budget": {"max_tokens": 50}})
    assert (
        cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "poor").code == 3
    )
    log = events_path(runs, "poor")
    before = log.read_bytes()
    outcome = cli(capsys, "resume", "poor", "--runs-dir", runs, "--json")
    assert outcome.code == 3
    assert outcome.error_line and outcome.out == ""
    assert log.read_bytes() == before
    shown = cli(capsys, "show", "poor", "--runs-dir", runs, "--json")
    assert shown.json["status"] == "failed"


def test_a_run_whose_faults_exceed_retries_exits_1_with_a_complete_log(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attempts, k = 2, 8
    config = example_variant(
        tmp_path,
        {
            "backend": {"failure_rate": 1.0, "latency_ms": [0, 0]},
            "retry": {"max_attempts": attempts, "initial_backoff_s": 0.0, "max_backoff_s": 0.0},
        },
    )
    outcome = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "faulty", "--json"
    )
    assert outcome.code == 1
    assert outcome.error_line and outcome.out == ""
    events = log_events(events_path(runs, "faulty"))
    assert events[-1]["type"] == "run.failed"
    assert events[-1]["data"]["exit_code"] == 1
    failed = [e for e in events if e["type"] == "lane.failed"]
    per_lane = Counter(e["lane"] for e in failed)
    assert per_lane == dict.fromkeys(range(k), attempts)
    for lane in range(k):
        mine = [e for e in failed if e["lane"] == lane]
        assert [e["attempt"] for e in mine] == list(range(1, attempts + 1))
        assert [e["data"]["final"] for e in mine] == [False] * (attempts - 1) + [True]
        assert all(e["data"]["retryable"] for e in mine)
    dispatched = Counter((e["lane"], e["attempt"]) for e in events if e["type"] == "lane.dispatched")
    assert dispatched == Counter((e["lane"], e["attempt"]) for e in failed)
    barrier = [e for e in events if e["type"] == "wave.barrier"]
    assert len(barrier) == 1
    assert barrier[0]["data"] == {"completed": [], "failed": list(range(k))}


def test_a_runs_dir_that_is_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.write_text("not a folder")
    outcome = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--json")
    assert outcome.code == 2
    assert str(runs) in outcome.error_line
    assert outcome.out == ""
