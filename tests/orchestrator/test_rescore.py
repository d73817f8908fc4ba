"""`orchestrator reduce --eval`: an eval re-scored with another reducer and a verifier, no
sampling, beside the original (issue 25, "re-scoring with a verifier")."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from lanefold.cli import main
from lanefold.evaluate import read_manifest, rereductions, rescore_eval
from lanefold.execution import open_store
from lanefold.primitives import ConfigError

K = 8


@pytest.fixture
def evaluated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """An eval of 30 questions at k = 8, majority vote, on a backend right 35% of the time;
    its backend's calls logged; a verifier module in the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "checks.py").write_text(
        "def right(question, text, answer):\n    return answer == '391'\n\n"
        "def wrong_arity():\n    return True\n"
    )
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Question {i}?", "answer": "391"}) + "\n" for i in range(30))
    )
    (tmp_path / "vote.toml").write_text(
        f'[loop]\nk = {K}\nseed = 5\n[backend]\nkind = "simulated"\naccuracy = 0.35\n'
        f'call_log = "{tmp_path / "calls.log"}"\n[log]\nfsync = "never"\n'
    )
    code = main(
        ["eval", "vote.toml", "--dataset", "q.jsonl", "--eval-id", "ev", "--runs-dir", "runs", "--json"]
    )
    assert code == 0
    capsys.readouterr()
    return tmp_path


def _calls(folder: Path) -> int:
    return (folder / "calls.log").read_text().count("\n")


def test_any_pass_with_a_verifier_scores_the_evals_pass_at_k_and_samples_nothing(
    evaluated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _calls(evaluated)
    original = json.loads((evaluated / "runs" / "ev" / "summary.json").read_text())
    assert original["pass_at_k"][str(K)] > original["accuracy"]  # headroom a verifier can reach
    code = main(
        [
            "reduce",
            "--eval",
            "ev",
            "--reducer",
            "any_pass",
            "--verifier",
            "checks:right",
            "--runs-dir",
            "runs",
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["eval_id"] == "ev.r1"
    assert summary["n"] == original["n"] == 30
    assert summary["accuracy"] == pytest.approx(original["pass_at_k"][str(K)])
    assert _calls(evaluated) == before  # not one sampling call
    # the original is as it was; the re-reduction is an eval of its own beside it
    assert json.loads((evaluated / "runs" / "ev" / "summary.json").read_text()) == original
    manifest = read_manifest(open_store(None, evaluated / "runs"), "ev.r1")
    assert manifest.rescore_of is not None and manifest.rescore_of.verifier == "checks:right"
    assert manifest.run_id(0) == "ev.0"  # its rows are the original's runs
    # each run's log holds the reduction, the verifier's checks recorded
    events = [
        json.loads(line) for line in (evaluated / "runs" / "ev.0" / "events.jsonl").read_text().splitlines()
    ]
    assert [e["data"]["reducer"] for e in events if e["type"] == "reduce.started"] == ["any_pass"]
    assert any(e["type"] == "judge.completed" and e["data"]["judge"] == "checks:right" for e in events)


def test_the_same_request_again_is_the_same_re_reduction_and_another_is_the_next(
    evaluated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "reduce",
        "--eval",
        "ev",
        "--reducer",
        "any_pass",
        "--verifier",
        "checks:right",
        "--runs-dir",
        "runs",
    ]
    assert main([*args, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0  # recorded: nothing reduced again
    assert json.loads(capsys.readouterr().out)["accuracy"] == first["accuracy"]
    assert main(["reduce", "--eval", "ev", "--reducer", "majority_vote", "--runs-dir", "runs", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["eval_id"] == "ev.r2"
    original = json.loads((evaluated / "runs" / "ev" / "summary.json").read_text())
    assert again["accuracy"] == original["accuracy"]  # the eval's own reducer gives its own answers
    found = rereductions(open_store(None, evaluated / "runs"), "ev")
    assert [m.eval_id for m, _ in found] == ["ev.r1", "ev.r2"]
    # `show EVAL_ID` lists each re-reduction with its accuracy
    assert main(["show", "ev", "--runs-dir", "runs"]) == 0
    out = capsys.readouterr().out
    assert "ev.r1" in out and "any_pass with checks:right" in out and f"{first['accuracy']:.3f}" in out
    assert main(["show", "ev", "--runs-dir", "runs", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["eval_id"] for r in shown["rereductions"]] == ["ev.r1", "ev.r2"]


def test_curve_reads_a_re_reduction(evaluated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "reduce",
                "--eval",
                "ev",
                "--reducer",
                "any_pass",
                "--verifier",
                "checks:right",
                "--runs-dir",
                "runs",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["curve", "ev.r1", "--k", "1,2,4,8", "--runs-dir", "runs", "--json"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve["eval_id"] == "ev.r1"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reducer", "no_such_reducer"], "--reducer: unknown reducer 'no_such_reducer'"),
        (["--reducer", "any_pass", "--verifier", "nowhere:right"], "--verifier: "),
        (["--reducer", "any_pass", "--verifier-command", ""], "--verifier-command: empty"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    evaluated: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    before = sorted(p.name for p in (evaluated / "runs").iterdir())
    code = main(["reduce", "--eval", "ev", *args, "--runs-dir", "runs"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert sorted(p.name for p in (evaluated / "runs").iterdir()) == before


def test_an_unknown_eval_and_a_run_and_an_eval_together_are_refused(
    evaluated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reduce", "--eval", "nope", "--reducer", "majority_vote", "--runs-dir", "runs"]) == 2
    assert "--eval: no eval nope" in capsys.readouterr().err
    assert main(["reduce", "ev.0", "--eval", "ev", "--reducer", "majority_vote", "--runs-dir", "runs"]) == 2
    assert "give RUN_ID or --eval EVAL_ID" in capsys.readouterr().err


def test_a_single_run_takes_a_verifier_too(evaluated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "reduce",
            "ev.3",
            "--reducer",
            "any_pass",
            "--verifier",
            "checks:right",
            "--runs-dir",
            "runs",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["reducer"] == "any_pass"


def test_rescore_from_python(evaluated: Path) -> None:
    async def go() -> float:
        summary = await rescore_eval(
            "ev", reducer="any_pass", verifier="checks:right", runs_dir=evaluated / "runs", concurrency=3
        )
        return summary.accuracy

    original = json.loads((evaluated / "runs" / "ev" / "summary.json").read_text())
    assert anyio.run(go) == pytest.approx(original["pass_at_k"][str(K)])
    with pytest.raises(ConfigError, match="is a re-reduction of ev"):
        anyio.run(lambda: rescore_eval("ev.r1", reducer="majority_vote", runs_dir=evaluated / "runs"))
