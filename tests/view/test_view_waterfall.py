"""A run as a waterfall (issue 42): each wave a band named by its purpose (a judge's wave its
own), each attempt a bar from its dispatch to its landing in seconds since the run started,
a retried lane a bar per attempt with the failed ones marked, the barrier and the reduce as
marks; each lane opened by a click for its text, answer, usage, seed, attempts and error."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from cli_support import Outcome
from starlette.testclient import TestClient

import lanefold
from lanefold.execution import open_store, read_run
from lanefold.primitives import LanefoldError
from lanefold.view._app import create_app
from lanefold.view._waterfall import waterfall


def _events(runs: Path, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]


def _seconds(event: dict[str, Any], first: dict[str, Any]) -> float:
    return (datetime.fromisoformat(event["time"]) - datetime.fromisoformat(first["time"])).total_seconds()


def test_each_attempt_is_a_bar_from_dispatch_to_landing(finished: Outcome, runs: Path) -> None:
    events, _, _ = read_run(open_store(None, runs), "done")
    drawn = waterfall(events)
    raw = _events(runs, "done")
    dispatched = {e["lane"]: _seconds(e, raw[0]) for e in raw if e["type"] == "lane.dispatched"}
    landed = {e["lane"]: _seconds(e, raw[0]) for e in raw if e["type"] == "lane.completed"}
    (band,) = drawn.bands
    assert band.purpose == "sample" and sorted(band.lanes) == sorted(dispatched)
    for lane, (attempt,) in band.lanes.items():
        assert (attempt.start, attempt.end, attempt.state) == (dispatched[lane], landed[lane], "landed")
        assert attempt.width > 0
    assert [name for name, _, _ in drawn.marks] == ["barrier 1", "reduce"]
    assert drawn.span == _seconds(raw[-1], raw[0])


def test_retries_and_failures_are_marked(tmp_path: Path) -> None:
    config = {"loop": {"k": 4, "seed": 1}, "backend": {"kind": "simulated", "failure_rate": 1.0}}
    try:
        lanefold.run_sync(lanefold.parse_config(config), "17 * 23?", runs_dir=tmp_path, run_id="broken")
    except LanefoldError:
        pass  # every lane failed: what is drawn
    events, _, _ = read_run(open_store(None, tmp_path), "broken")
    (band,) = waterfall(events).bands
    tries = [e for e in _events(tmp_path, "broken") if e["type"] == "lane.dispatched"]
    assert sum(len(a) for a in band.lanes.values()) == len(tries) > 4  # retried: a bar an attempt
    assert {a.state for attempts in band.lanes.values() for a in attempts} == {"failed"}
    assert all([a.attempt for a in attempts] == [1, 2, 3] for attempts in band.lanes.values())
    page = TestClient(create_app(open_store(None, tmp_path))).get("/runs/broken").text
    assert len(
        re.findall(
            r"<rect class=bar data-wave='1' data-lane='\d' data-attempt='\d' data-state='failed'", page
        )
    ) == len(tries)
    opened = re.search(r"<details class=lane id='lane-1-0'.*?</details>", page, re.S)
    assert opened is not None and "<dt>attempts</dt><dd>3 (3 failed)</dd>" in opened[0]
    assert "<dt>last error</dt><dd class=error>" in opened[0]


def test_a_judge_s_calls_are_their_own_band(tmp_path: Path) -> None:
    config = {
        "loop": {"k": 3, "seed": 3, "reducer": "judge_argmax"},
        "backend": {"kind": "simulated", "accuracy": 0.6},
        "judge": {"template": "Question: {question}\nCandidate: {candidate}\nScore (0-10):"},
    }
    lanefold.run_sync(lanefold.parse_config(config), "17 * 23?", runs_dir=tmp_path, run_id="judged")
    events, _, _ = read_run(open_store(None, tmp_path), "judged")
    drawn = waterfall(events)
    assert [(b.wave, b.purpose, len(b.lanes)) for b in drawn.bands] == [(1, "sample", 3), (2, "judge", 3)]
    assert drawn.bands[1].y >= drawn.bands[0].y + drawn.bands[0].height  # the judge's band below
    page = TestClient(create_app(open_store(None, tmp_path))).get("/runs/judged").text
    assert "wave 2 · judge" in page


def test_a_lane_opens_to_its_text_answer_usage_and_seed(finished: Outcome, runs: Path) -> None:
    page = TestClient(create_app(open_store(None, runs))).get("/runs/done").text
    raw = _events(runs, "done")
    done = next(e for e in raw if e["type"] == "lane.completed" and e["lane"] == 2)
    seed = next(e["data"]["seed"] for e in raw if e["type"] == "lane.dispatched" and e["lane"] == 2)
    lane = re.search(r"<details class=lane id='lane-1-2'.*?</details>", page, re.S)
    assert lane is not None
    assert f"<dt>seed</dt><dd>{seed}</dd>" in lane[0]
    assert f"<pre class=lane-text>{done['data']['text']}</pre>" in lane[0].replace("&#39;", "'")
    assert "<summary><b>lane 2</b> · " in lane[0] and " tok</span>" in lane[0]  # labelled, not bare numbers
    assert "<a href=\"#lane-1-2\"><rect class=bar data-wave='1' data-lane='2'" in page  # its bar opens it
