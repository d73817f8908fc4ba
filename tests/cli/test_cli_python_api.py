"""The `orchestrator` command end to end over the simulated backend: the Python API."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import EXAMPLE, QUESTION, cli, example_variant

import lanefold

# -- the Python API ---------------------------------------------------------------------------------


def test_run_sync_returns_a_run_result(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = lanefold.run_sync(lanefold.load_config(EXAMPLE), QUESTION, runs_dir=runs)
    assert isinstance(result, lanefold.RunResult)
    assert result.answer == "391"
    assert sum(result.votes.values()) == result.lanes_completed
    assert isinstance(result.usage, lanefold.UsageBreakdown)
    assert isinstance(result.cost, lanefold.CostBreakdown)
    assert result.usage.prefill_tokens == 40
    assert result.cost.total > 0
    assert result.events is not None and Path(result.events).is_file()
    assert capsys.readouterr() == ("", ""), "the library prints nothing"
    # the same object the CLI prints
    shown = cli(capsys, "show", result.run_id, "--runs-dir", runs, "--json")
    shown_json = shown.json
    assert shown_json.pop("reductions")[0]["reducer"] == "majority_vote"
    assert shown_json.pop("backend")["name"].startswith("simulated")  # the backend it ran on
    assert shown_json == result.model_dump(mode="json")
    again = lanefold.resume_sync(result.run_id, runs_dir=runs)
    assert again == result


def test_run_sync_raises_the_error_tree(runs: Path, tmp_path: Path) -> None:
    config = lanefold.load_config(example_variant(tmp_path, {"budget": {"max_tokens": 50}}))
    with pytest.raises(lanefold.BudgetExhaustedError) as caught:
        lanefold.run_sync(config, QUESTION, runs_dir=runs)
    assert caught.value.exit_code == 3
    with pytest.raises(lanefold.RunNotFoundError):
        lanefold.resume_sync("never-ran", runs_dir=runs)
    with pytest.raises(lanefold.ConfigError):
        lanefold.run_sync(config, QUESTION, runs_dir=runs, run_id="../escape")


@pytest.mark.anyio
async def test_async_run_and_resume(runs: Path) -> None:
    config = lanefold.load_config(EXAMPLE)
    result = await lanefold.run(config, QUESTION, runs_dir=runs, run_id="async")
    assert isinstance(result, lanefold.RunResult)
    assert result.run_id == "async"
    assert result.answer == "391"
    assert result.votes and result.usage.decode_tokens == result.lanes_completed * 60
    assert await lanefold.resume("async", runs_dir=runs) == result
    # a path is accepted where a config is
    other = await lanefold.run(EXAMPLE, QUESTION, runs_dir=runs, run_id="by-path")
    assert (other.answer, other.votes) == (result.answer, result.votes)
