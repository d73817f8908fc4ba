"""Reasons everywhere (issue 42): a run without an answer says why on its page, with the
figures its record holds (the result's reason, `run.failed`'s class and message), a failed
lane its error's class and message, a stopped or interrupted run the command that resumes it,
and money is shown as money with the exact figure beside it."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_support import Outcome
from starlette.testclient import TestClient

import lanefold
import lanefold.cli._view as view_cli
from lanefold.cli import main
from lanefold.execution import open_store, run_record
from lanefold.primitives import LanefoldError
from lanefold.view._app import create_app
from lanefold.view._words import money

QUESTION = "What is 17 * 23?"


def _run(runs: Path, run_id: str, config: dict[str, Any]) -> None:
    try:
        lanefold.run_sync(lanefold.parse_config(config), QUESTION, runs_dir=runs, run_id=run_id)
    except LanefoldError:
        pass  # recorded as run.failed: what the page reads


def _page(runs: Path, run_id: str) -> str:
    answer = TestClient(create_app(open_store(None, runs), resume_flags=["--runs-dir", str(runs)])).get(
        f"/runs/{run_id}"
    )
    assert answer.status_code == 200, answer.text
    return answer.text


def _reason(page: str) -> tuple[str, str, str]:
    """(data-kind, headline, line) of the page's reason."""
    found = re.search(
        r"<div id=reason data-kind='(\w+)'><p><b class=headline>(.*?)</b>: <span class=line>(.*?)</span>",
        page,
        re.S,
    )
    assert found is not None, page
    kind, headline, line = found.groups()
    return kind, html.unescape(headline), html.unescape(line)


def _failed(runs: Path, run_id: str) -> str:
    events = [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "run.failed"
    return f"{events[-1]['data']['error']}: {events[-1]['data']['message']}"


def test_a_run_whose_lanes_gave_no_answer_says_so_with_the_figures(tmp_path: Path) -> None:
    config = {
        "loop": {"k": 4, "seed": 1, "min_quorum": 3},
        "backend": {"kind": "simulated"},
        "extract": {"regex": r"Final:\s*(\d+)"},
    }
    _run(tmp_path, "silent", config)
    page = _page(tmp_path, "silent")
    reason = run_record(open_store(None, tmp_path), "silent")["reason"]
    assert reason.startswith("4 of 4 completed lanes gave no answer")
    assert _reason(page) == ("no_answer", "no answer", reason)
    assert "id=winner" not in page and "(lane None)" not in page  # never "None (lane None)"


def test_a_run_the_budget_could_not_fund_says_budget_exhausted(tmp_path: Path) -> None:
    config = {
        "loop": {"k": 8, "seed": 1, "min_quorum": 8},
        "backend": {"kind": "simulated"},
        "budget": {"max_tokens": 300},
    }
    _run(tmp_path, "poor", config)
    kind, headline, line = _reason(_page(tmp_path, "poor"))
    assert (kind, headline, line) == ("budget", "budget exhausted", _failed(tmp_path, "poor"))
    assert (
        line == "BudgetExhaustedError: budget max_tokens: wave 1 can fund 0 of 8 lanes, below the quorum of 8"
    )


def test_a_loop_stopped_by_the_budget_without_an_answer_says_budget_exhausted(tmp_path: Path) -> None:
    """adaptive_sample stops between waves when the budget funds no more (its outcome's
    `budget_stop`), then its lanes so far give no answer: a result, not a failure."""
    config = {
        "loop": {"coordinator": "adaptive_sample", "window": 4, "max_lanes": 40, "seed": 1},
        "backend": {"kind": "simulated"},
        "extract": {"regex": r"Final:\s*(\d+)"},
        "budget": {"max_tokens": 1200},
    }
    _run(tmp_path, "spent", config)
    record = run_record(open_store(None, tmp_path), "spent")
    assert record["status"] == "no_answer" and record["outcome"]["budget_stop"] is True
    kind, headline, line = _reason(_page(tmp_path, "spent"))
    assert (kind, headline) == ("budget", "budget exhausted")
    assert line == f"the loop stopped for the budget; {record['reason']}"


def test_a_run_below_its_quorum_says_quorum_not_reached(tmp_path: Path) -> None:
    config = {
        "loop": {"k": 6, "seed": 3, "min_quorum": 6},
        "backend": {"kind": "simulated", "failure_rate": 0.5},
        "retry": {"max_attempts": 1},
    }
    _run(tmp_path, "short", config)
    kind, headline, line = _reason(_page(tmp_path, "short"))
    assert (kind, headline, line) == ("quorum", "quorum not reached", _failed(tmp_path, "short"))
    assert re.search(r"\d of 6 lanes completed, below the quorum of 6", line), line


def test_a_run_whose_every_lane_failed_says_so_and_each_lane_its_error(tmp_path: Path) -> None:
    config = {"loop": {"k": 4, "seed": 1}, "backend": {"kind": "simulated", "failure_rate": 1.0}}
    _run(tmp_path, "broken", config)
    page = _page(tmp_path, "broken")
    assert _reason(page) == ("lanes_failed", "every lane failed", _failed(tmp_path, "broken"))
    errors = re.findall(r"<span class=lane-error data-error='(\w+)'><b>\w+</b> (.*?)</span>", page)
    events = [json.loads(line) for line in (tmp_path / "broken" / "events.jsonl").read_text().splitlines()]
    last = {e["lane"]: e["data"] for e in events if e["type"] == "lane.failed"}  # each lane's last
    assert sorted(errors) == sorted((d["error"], html.escape(d["message"])) for d in last.values())
    assert len(errors) == 4


def test_an_answered_run_gives_no_reason(finished: Outcome, runs: Path) -> None:
    page = _page(runs, "done")
    assert "id=reason" not in page and "id=winner" in page


def test_a_killed_run_says_stopped_and_how_to_resume_it(tmp_path: Path) -> None:
    lanefold.run_sync(
        lanefold.parse_config({"loop": {"k": 4}, "backend": {"kind": "simulated"}}),
        QUESTION,
        runs_dir=tmp_path,
        run_id="killed",
    )
    events = tmp_path / "killed" / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if '"lane.completed"' in line)
    events.write_text("".join(lines[: first + 1]))  # as a kill leaves it: no writer, no ending
    page = _page(tmp_path, "killed")
    assert _reason(page)[:2] == ("stopped", "stopped")
    assert f"<pre id=resume>orchestrator resume killed --runs-dir {tmp_path}</pre>" in page


def test_the_bill_is_money_with_the_exact_figure_beside_it(finished: Outcome, runs: Path) -> None:
    page = _page(runs, "done")
    cost = run_record(open_store(None, runs), "done")["cost"]
    shown = dict(re.findall(r"data-line='(\w+)'><th>\w+</th><td><span class=usd data-usd=\"([^\"]+)\"", page))
    assert {k: float(v) for k, v in shown.items()} == cost  # exact
    total = re.search(r"data-line='total'><th>total</th><td><span class=usd [^>]*>([^<]+)<", page)
    assert total is not None and total[1] == money(cost["total"])
    assert re.fullmatch(r"\$[\d,]+\.\d\d|\$0\.0*[1-9]\d?", total[1]), total[1]  # not 8 decimals


@pytest.mark.parametrize(
    ("usd", "shown"),
    [
        (0.0, "$0.00"),
        (1234.5, "$1,234.50"),
        (0.125, "$0.13"),  # half a cent up, as money rounds
        (0.01, "$0.01"),
        (0.0099999, "$0.01"),
        (0.004236, "$0.0042"),  # under a cent: two significant figures, never $0.00
        (0.000012345, "$0.000012"),
        (-0.0021, "-$0.0021"),
    ],
)
def test_money_is_rounded_as_money(usd: float, shown: str) -> None:
    assert money(usd) == shown


def test_the_resume_line_the_command_gives_the_view_holds_no_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`orchestrator view --store URL` hands its pages the flags the CLI's own resume line
    uses: the URL with its password as `***` (it was passed whole, and a stopped run's page
    showed it to whoever could open the view)."""
    given: dict[str, Any] = {}
    monkeypatch.setattr(view_cli, "store_of", lambda args: None)
    monkeypatch.setattr(view_cli, "view", lambda store, **options: given.update(options))
    assert main(["view", "--store", "postgresql://ann:s3cret@127.0.0.1:5432/runs"]) == 0
    assert given["resume_flags"] == ["--store", "postgresql://ann:***@127.0.0.1:5432/runs"]
    assert main(["view", "--runs-dir", "elsewhere"]) == 0
    assert given["resume_flags"] == ["--runs-dir", "elsewhere"]
