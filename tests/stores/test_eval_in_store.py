"""An eval's record goes through its store: on PostgreSQL it is wholly in the database (nothing
under --runs-dir), and `show`, `tail`, `list --eval` and `eval --resume` read it from the store
the flags name, as they read files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanefold.cli import main
from lanefold.primitives import Store


def test_an_eval_lives_in_its_store_and_is_read_from_it(
    opened: tuple[Store, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store, flags = opened
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "sim.toml").write_text('[loop]\nk = 2\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.7\n')
    (work / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "391"}) + "\n" for i in range(5))
    )
    assert main(["eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "ev", *flags, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n"] == 5
    if "--store" in flags:  # nothing of it on disk: not the runs, not the eval's record
        assert not (work / "runs").exists() and not (tmp_path / "runs").exists()
    record = store.eval_record("ev")
    assert record.exists() and not record.running() and record.read_summary() is not None
    assert summary["results"] == record.results_location

    assert main(["show", "ev", *flags, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in summary} == summary
    assert (shown["questions"], shown["running"]) == (5, False)
    assert main(["tail", "ev", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(line.startswith("#") and "run=ev." in line for line in lines)
    assert main(["tail", "ev", "--follow", *flags, "--json"]) == 0, "all there: it ends"
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert sorted(s.run_id for s in store.list_runs(eval_id="ev")) == [f"ev.{i}" for i in range(5)]

    # Continued: every row is there already, none is run or recorded again.
    assert main(["eval", "--resume", "ev", *flags, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["n"] == 5 and again["correct"] == summary["correct"]
    assert len(record.read_rows(json.loads)) == 5


def test_a_re_reduction_of_an_eval_lives_in_the_same_store(
    opened: tuple[Store, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store, flags = opened
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    (work / "gold.py").write_text("def right(question, text, answer):\n    return answer == '391'\n")
    (work / "sim.toml").write_text('[loop]\nk = 4\nseed = 2\n[backend]\nkind = "simulated"\naccuracy = 0.4\n')
    (work / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "391"}) + "\n" for i in range(8))
    )
    assert main(["eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "re", *flags, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    args = ["reduce", "--eval", "re", "--reducer", "any_pass", "--verifier", "gold:right", *flags, "--json"]
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["eval_id"] == "re.r1" and again["accuracy"] == pytest.approx(summary["pass_at_k"]["4"])
    if "--store" in flags:
        assert not (work / "runs").exists()
    assert store.eval_record("re.r1").read_summary() is not None
    assert main(["show", "re", *flags, "--json"]) == 0
    assert [r["eval_id"] for r in json.loads(capsys.readouterr().out)["rereductions"]] == ["re.r1"]
