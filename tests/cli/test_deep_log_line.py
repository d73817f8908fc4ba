"""A log line nested thousands deep (an edit, a forgery) is a corrupt line named by its number,
never a RecursionError: every reader of a log (show, tail, resume) says so in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanefold.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["show", "tail", "resume"])
def test_a_line_nested_past_the_parser_is_one_line_naming_it(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(ROOT / "examples" / "simulated.toml"), "--question", "2+2?", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    log = tmp_path / "runs" / run_id / "events.jsonl"
    lines = log.read_text().splitlines()
    lines[1] = lines[1][:-1] + ', "x": ' + "[" * 50_000 + "]" * 50_000 + "}"
    log.write_text("\n".join(lines) + "\n")

    code = main([command, run_id])

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "events.jsonl:2: corrupt event log line" in err
