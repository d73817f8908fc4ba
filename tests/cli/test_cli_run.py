"""The `orchestrator` command end to end over the simulated backend: run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import (
    EXAMPLE,
    QUESTION,
    Outcome,
    _check_result,
    cli,
    command,
    events_path,
    example_variant,
    log_events,
)

# -- run ------------------------------------------------------------------------------------------


def test_run_json_prints_one_result_object(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "fresh", "--json"
    )
    assert outcome.code == 0
    assert outcome.err == ""
    result = outcome.json
    _check_result(result)
    assert result["run_id"] == "fresh"
    assert Path(result["events"]).resolve() == events_path(runs, "fresh").resolve()
    k, prompt, output = 8, 40, 60  # from examples/simulated.toml
    assert result["lanes_completed"] + result["lanes_failed"] == k
    assert sum(result["votes"].values()) == result["lanes_completed"]
    assert result["answer"] == max(result["votes"], key=result["votes"].get)
    usage, cost = result["usage"], result["cost"]
    # shares_prefix: the wave's prompt is computed once, served from the prefix K-1 times
    assert usage["prefill_tokens"] == prompt
    assert usage["cached_prefill_tokens"] == (k - 1) * prompt
    assert usage["decode_tokens"] == result["lanes_completed"] * output
    assert usage["verifier_tokens"] == 0
    # priced line by line from [pricing]: 0.15 / 0.075 / 0.60 USD per million tokens
    assert cost["prefill"] == pytest.approx(prompt * 0.15e-6)
    assert cost["cached_prefill"] == pytest.approx((k - 1) * prompt * 0.075e-6)
    assert cost["decode"] == pytest.approx(usage["decode_tokens"] * 0.60e-6)
    assert cost["verifier"] == 0


def test_run_without_shared_prefix_pays_every_prefill(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"backend": {"shares_prefix": False, "latency_ms": [0, 0]}})
    result = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--json").json
    assert result["usage"]["prefill_tokens"] == 8 * 40
    assert result["usage"]["cached_prefill_tokens"] == 0
    assert result["cost"]["cached_prefill"] == 0


def test_run_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = command(
        "run", "examples/simulated.toml", "--question", QUESTION, "--runs-dir", runs, "--json", "-v"
    )
    assert done.code == 0, done.err
    result = done.json  # with --json, nothing but the JSON reaches stdout (even with -v)
    _check_result(result)
    assert result["answer"] == "391"
    assert Path(result["events"]).parent.parent == runs
    assert log_events(result["events"])[-1]["type"] == "run.completed"


def test_run_is_deterministic_for_a_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", tmp_path / "a", "--json").json
    second = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", tmp_path / "b", "--json").json
    assert first["run_id"] != second["run_id"]
    for key in ("answer", "votes", "winner_lane", "lanes_completed", "usage", "cost"):
        assert first[key] == second[key], key


def test_run_without_json_prints_a_summary(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "plain")
    assert outcome.code == 0
    assert "391" in outcome.out and "plain" in outcome.out
    assert outcome.err == ""


def test_run_with_an_existing_run_id_exits_2(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = events_path(runs, "done").read_bytes()
    again = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "done", "--json"
    )
    assert again.code == 2
    assert "done" in again.error_line
    assert again.out == ""
    assert events_path(runs, "done").read_bytes() == before


@pytest.mark.parametrize("question", ["", "   "])
def test_run_with_an_empty_question_exits_2(
    question: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = cli(capsys, "run", EXAMPLE, "--question", question, "--runs-dir", runs)
    assert outcome.code == 2
    assert "question" in outcome.error_line
    assert not runs.exists()


@pytest.mark.parametrize("run_id", ["../x", "a/b", "..", "ABSOLUTE", "a/../b", ".hidden", "a b", "x\\y", ""])
def test_run_rejects_run_ids_that_are_not_plain_names(
    run_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "nest" / "runs"
    if run_id == "ABSOLUTE":
        run_id = str(tmp_path / "abs")
    outcome = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", run_id, "--json"
    )
    assert outcome.code == 2
    assert "run id" in outcome.error_line
    assert outcome.out == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == [], "nothing may be written"


@pytest.mark.parametrize("subcommand", ["resume", "show", "tail"])
@pytest.mark.parametrize("run_id", ["../done", "a/b", "..", "ABSOLUTE"])
def test_other_commands_reject_run_ids_that_are_not_plain_names(
    finished: Outcome, subcommand: str, run_id: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every path these ids could reach holds a real log, so only the id check stops them.
    inner = runs / "inner"
    good = events_path(runs, "done").read_bytes()
    for folder in (inner / "a" / "b", runs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "events.jsonl").write_bytes(good)
    if run_id == "ABSOLUTE":
        run_id = str(runs / "done")
    outcome = cli(capsys, subcommand, run_id, "--runs-dir", inner)
    assert outcome.code == 2
    assert "run id" in outcome.error_line
    assert outcome.out == ""
