"""The `orchestrator` command end to end over the simulated backend: judge + argmax."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import QUESTION, ROOT, _check_result, cli, events_path, example_variant, log_events

# -- judge + argmax ---------------------------------------------------------------------------------


def test_best_of_n_example_prices_the_judge_as_verifier(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = ROOT / "examples" / "best_of_n.toml"
    result = cli(
        capsys, "run", example, "--question", QUESTION, "--runs-dir", runs, "--run-id", "best", "--json"
    ).json
    _check_result(result)
    assert result["answer"] == "391"
    assert result["votes"] == {}
    assert set(result["scores"]) == {str(lane) for lane in range(result["lanes_completed"])}
    judged = [e for e in log_events(events_path(runs, "best")) if e["type"] == "judge.completed"]
    assert len(judged) == result["lanes_completed"]
    winner = str(result["winner_lane"])
    assert result["scores"][winner] == max(v for v in result["scores"].values() if v is not None)
    # one judge call per candidate: prompt_tokens (default 64) + judge_output_tokens (16)
    assert result["usage"]["verifier_tokens"] == result["lanes_completed"] * (64 + 16)
    assert result["cost"]["verifier"] == pytest.approx(result["usage"]["verifier_tokens"] * 0.30e-6)


VERIFIER = """
def score(question, text, answer):
    return 10.0 if answer == "391" else 1.0


def broken(question, text, answer):
    raise ValueError("the verifier fell over")
"""


def _verifier_config(folder: Path, spec: str) -> Path:
    return example_variant(
        folder,
        {
            "loop": {"reducer": "judge_argmax", "min_quorum": 1},
            "judge": {"verifier": spec},
            "backend": {"latency_ms": [0, 0]},
        },
    )


def test_a_python_verifier_scores_without_an_llm_wave(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lanefold_test_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _verifier_config(tmp_path, "lanefold_test_verifier:score")
    result = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "verified", "--json"
    ).json
    assert result["answer"] == "391"
    assert result["usage"]["verifier_tokens"] == 0
    assert result["usage"]["requests"] == 1, "no second wave of backend calls"
    judged = [e["data"] for e in log_events(events_path(runs, "verified")) if e["type"] == "judge.completed"]
    assert {d["judge"] for d in judged} == {"lanefold_test_verifier:score"}
    assert sorted(d["score"] for d in judged) == sorted(result["scores"].values())


def test_an_unimportable_verifier_exits_2(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _verifier_config(tmp_path, "lanefold_no_such_module:score")
    outcome = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "noverifier")
    assert outcome.code == 2
    assert "judge.verifier" in outcome.error_line


def test_a_verifier_that_raises_leaves_a_complete_log(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lanefold_test_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _verifier_config(tmp_path, "lanefold_test_verifier:broken")
    try:
        outcome = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "broken")
    finally:
        events = log_events(events_path(runs, "broken"))
    # A verifier that raises abstains, with its reason in the record; with every candidate
    # abstaining the run ends without an answer: completed, status no_answer, exit 4.
    last = events[-1]
    assert last["type"] == "run.completed"
    assert last["data"]["result"]["status"] == "no_answer"
    assert last["data"]["result"]["answer"] is None
    assert "no candidate got a score" in last["data"]["result"]["reason"]
    assert outcome.code == 4
    assert outcome.err == ""
    judged = [e["data"] for e in events if e["type"] == "judge.completed"]
    assert judged and all(j["score"] is None and "verifier raised" in j["detail"] for j in judged)
