"""The view's winner is the fold's winning lane (issue 38): on a best-of-N run, whose judge
wave numbers its lanes as the candidates' wave does, the page shows the winning candidate's
text (what `show --json` gives as `winner_text`), never a judge's output."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import lanefold
from lanefold.cli import main
from lanefold.execution import open_store
from lanefold.view._app import create_app

JUDGED = {
    "loop": {"k": 4, "seed": 3, "reducer": "judge_argmax"},
    "backend": {"kind": "simulated", "accuracy": 0.6},
    "judge": {"template": "Question: {question}\nCandidate: {candidate}\nScore (0-10):"},
}


def test_a_judged_run_s_page_shows_the_winning_candidate_s_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    lanefold.run_sync(lanefold.parse_config(JUDGED), "17 * 23?", runs_dir=runs, run_id="judged")
    assert main(["show", "judged", "--runs-dir", str(runs), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    events = [json.loads(line) for line in (runs / "judged" / "events.jsonl").read_text().splitlines()]
    judge_lanes = {e["lane"] for e in events if e["type"] == "lane.completed" and e["wave"] == 2}
    assert shown["winner_lane"] in judge_lanes and shown["winner_wave"] == 1  # the number is ambiguous
    page = TestClient(create_app(open_store(None, runs))).get("/runs/judged").text
    found = re.search(r"<pre id=winner-text>(.*?)</pre>", page, re.DOTALL)
    assert found is not None and html.unescape(found[1]) == shown["winner_text"] != ""
