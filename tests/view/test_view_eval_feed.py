"""An eval page's live feed without a browser (issue 42, item 4): what it sends for an eval
that has ended (its parts once, then `end`), for one whose results cannot be read (one line,
`refused`), and the curve drawn across to the eval's total."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import cli
from starlette.testclient import TestClient

from lanefold.execution import open_store
from lanefold.view._app import create_app
from lanefold.view._charts import curve


def _events(client: TestClient, path: str) -> list[tuple[str, str]]:
    with client.stream("GET", path) as feed:
        body = "".join(feed.iter_text())
    return re.findall(r"^event: (\w+)\ndata: (.*)$", body, re.M)


@pytest.fixture
def evaluated(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text(
        '[loop]\nk = 3\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.6\n'
    )
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "391"}) + "\n" for i in range(4))
    )
    assert cli(capsys, "eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "ev").code == 0
    return tmp_path / "runs"


def test_an_ended_eval_s_feed_sends_its_parts_once_then_ends(evaluated: Path) -> None:
    events = _events(TestClient(create_app(open_store(None, evaluated))), "/live/evals/ev?score=wrong")
    assert [kind for kind, _ in events] == ["swap", "end"]
    parts = json.loads(events[0][1])
    assert set(parts) == {"eval-progress", "score-filter", "question-rows", "eval-curve"}
    assert "data-landed='4' data-total='4' data-ended='true'" in parts["eval-progress"]
    assert "data-correct='true'" not in parts["question-rows"]  # the page's filter, kept


def test_results_that_cannot_be_read_end_the_feed_in_one_line(evaluated: Path) -> None:
    rows = evaluated / "ev" / "results.jsonl"
    rows.write_text("not a row\n" + rows.read_text())
    (evaluated / "ev" / "summary.json").unlink()
    events = _events(TestClient(create_app(open_store(None, evaluated))), "/live/evals/ev")
    assert [kind for kind, _ in events] == ["refused"]
    assert json.loads(events[0][1])["line"].startswith("orchestrator show: ")


def test_a_running_eval_s_curve_reaches_across_to_its_total() -> None:
    assert curve([True, False], total=4)[-1][0] < 390 / 2 + 10  # a third of the way: 2 of 4
    assert curve([True, False])[-1][0] == 390  # no total known: across to the last landed
    assert curve([True, True, True], total=2)[-1][0] == 390  # more landed than said: never past the edge


def test_an_eval_on_postgresql_feeds_its_parts(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text('[loop]\nk = 3\nseed = 1\n[backend]\nkind = "simulated"\n')
    (tmp_path / "q.jsonl").write_text(json.dumps({"question": "Q?", "answer": "391"}) + "\n")
    ran = cli(capsys, "eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "pg-ev", "--store", pg_url)
    assert ran.code == 0, ran.err
    client = TestClient(create_app(open_store(pg_url)))
    page = client.get("/evals/pg-ev").text
    assert "data-landed='1' data-total='1' data-ended='true'" in page and "data-live" not in page
    events = _events(client, "/live/evals/pg-ev")
    assert [kind for kind, _ in events] == ["swap", "end"]
    assert "data-landed='1'" in json.loads(events[0][1])["eval-progress"]
