"""`orchestrator view` in headless Chromium (Debian's `chromium`, driven by Playwright): the runs
list, a finished run's page against `show --json`, a live run whose lanes land on the open page,
an eval's page with its curve, the budgets page on PostgreSQL, the key prompt. (docs/view.md's
screenshots are scripts/view_screenshots.py's.)

Skipped, saying why, only where Chromium or Playwright cannot be had (`make test` installs both
where it can)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_support import ROOT, Outcome, cli
from loopback import Loopback
from view_browser import url, violations

from lanefold.execution import open_store
from lanefold.view._app import create_app


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Outcome:
    """The command in a thread of its own: Playwright's sync API holds an event loop in this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(cli, capsys, *argv).result()


def test_the_runs_list_and_a_new_run_appearing_on_it(
    finished: Outcome, runs: Path, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with Loopback(create_app(open_store(None, runs))) as server:
        page.goto(url(server, "/"))
        row = page.locator("tr[data-run='done']")
        assert row.get_attribute("data-status") == "answered"
        assert "391" in row.inner_text()
        page.evaluate("window.notReloaded = true")
        example = ROOT / "examples" / "simulated.toml"
        ran = _cli(
            capsys, "run", example, "--question", "What is 17 * 23?", "--runs-dir", runs, "--run-id", "new"
        )
        assert ran.code == 0, ran.err
        page.wait_for_selector("tr[data-run='new'][data-status='answered']", timeout=10_000)
        assert page.evaluate("window.notReloaded") is True  # it came by the feed, not a reload
        assert page.locator("#runs tbody tr").first.get_attribute("data-run") == "new"  # newest first
        assert violations(page) == []


def test_a_finished_run_matches_show_json(
    finished: Outcome, runs: Path, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _cli(capsys, "show", "done", "--runs-dir", runs, "--json").json
    with Loopback(create_app(open_store(None, runs))) as server:
        page.goto(url(server, "/runs/done"))
        lanes = page.locator("#waves [data-lane][data-wave]")
        assert lanes.count() == shown["lanes_completed"]
        assert {lanes.nth(i).get_attribute("data-state") for i in range(lanes.count())} == {"landed"}
        votes = page.locator(".vote")
        tally = {
            votes.nth(i).get_attribute("data-answer"): int(votes.nth(i).get_attribute("data-votes"))
            for i in range(votes.count())
        }
        assert tally == shown["votes"]
        for line, usd in shown["cost"].items():
            cell = page.locator(f"#bill tr[data-line='{line}'] .usd")
            assert float(cell.get_attribute("data-usd")) == usd  # exact, as show --json gives it
            assert cell.inner_text().startswith("$")  # shown as money
        assert page.locator("#winner").get_attribute("data-answer") == shown["answer"]
        # the waterfall: a bar a lane, from dispatch to landing; a click on one opens its lane
        bars = page.locator("#waterfall rect.bar[data-lane]")
        assert bars.count() == shown["lanes_completed"]
        assert page.locator("#waterfall [data-mark='reduce']").count() == 1
        winner = shown["winner_lane"]
        lane = page.locator(f"#lane-1-{winner}")
        assert lane.locator(".lane-text").is_visible() is False  # closed: nothing read by hovering
        page.locator(f"#waterfall rect.bar[data-lane='{winner}']").click()
        assert lane.locator(".lane-text").is_visible()
        assert lane.locator(".lane-text").inner_text() == shown["winner_text"]
        assert violations(page) == []


def test_a_live_run_s_lanes_land_on_the_open_page(runs: Path, tmp_path: Path, page: Any) -> None:
    config = (ROOT / "examples" / "simulated.toml").read_text()
    config = config.replace("max_concurrency = 8", "max_concurrency = 2")
    config = config.replace("latency_ms = [20, 120]", "latency_ms = [400, 600]")
    (tmp_path / "slow.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [
        sys.executable,
        "-m",
        "lanefold",
        "run",
        str(tmp_path / "slow.toml"),
        "--question",
        "What is 17 * 23?",
    ]
    with Loopback(create_app(open_store(None, runs))) as server:
        writer = subprocess.Popen(
            [*argv, "--runs-dir", str(runs), "--run-id", "live", "--json"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while not (runs / "live" / "events.jsonl").exists():
                assert time.monotonic() < deadline and writer.poll() is None, "the run did not start"
                time.sleep(0.05)
            page.goto(url(server, "/runs/live"))
            landed = page.locator("#waves [data-state='landed']")
            bars = page.locator("#waterfall rect.bar[data-lane][data-state='landed']")
            first = landed.count()
            assert first < 8  # opened while the run is going
            page.locator("#lane-1-0 summary").click()  # a reader opens a lane as the others land
            seen, drawn = {first}, {bars.count()}
            while landed.count() < 8:  # sampled as they land: the page fills a few lanes at a time
                assert time.monotonic() < deadline + 30, seen
                seen.add(landed.count())
                drawn.add(bars.count())
                page.wait_for_timeout(50)
            assert len(seen - {0}) >= 2, seen
            assert len(drawn - {0}) >= 2, drawn  # the waterfall grew as they landed, bar by bar
            page.wait_for_function("document.getElementById('status').textContent === 'answered'")
            _, err = writer.communicate(timeout=30)
            assert writer.returncode == 0, err
        finally:
            if writer.poll() is None:
                writer.kill()
            writer.communicate()
        assert landed.count() == 8 and bars.count() == 8
        opened = page.locator("#lane-1-0")  # still open through every update since
        assert opened.get_attribute("open") is not None and opened.locator(".lane-text").is_visible()
        assert "Answer:" in opened.locator(".lane-text").inner_text()
        # the end of the run came without a reload too: the bill, and every event in the timeline
        page.wait_for_selector("#bill tr[data-line='total']")
        lines = (runs / "live" / "events.jsonl").read_text().splitlines()
        assert page.locator("#timeline tr").count() == len(lines)
        assert violations(page) == []


def test_an_eval_page_draws_its_curve(
    tmp_path: Path, page: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = '[loop]\nk = 3\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.7\n'
    config += "[pricing]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n"
    (tmp_path / "sim.toml").write_text(config)
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "391"}) + "\n" for i in range(6))
    )
    done = _cli(capsys, "eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "ev", "--json")
    summary = json.loads(done.out.splitlines()[-1])
    with Loopback(create_app(open_store(None, tmp_path / "runs"))) as server:
        page.goto(url(server, "/evals/ev"))
        assert float(page.locator("#accuracy").get_attribute("data-accuracy")) == summary["accuracy"]
        assert page.locator("#questions tr[data-correct]").count() == 6
        assert page.locator("svg#curve polyline").count() == 1
        page.locator("#questions a").first.click()
        page.wait_for_selector("[data-lane]")
        page.go_back()
        assert violations(page) == []

    # a second eval at one lane a question: both on the evals page, accuracy against spend
    (tmp_path / "one.toml").write_text(config.replace("k = 3", "k = 1"))
    assert _cli(capsys, "eval", "one.toml", "--dataset", "q.jsonl", "--eval-id", "ev-k1", "--json").code == 0
    with Loopback(create_app(open_store(None, tmp_path / "runs"))) as server:
        page.goto(url(server, "/evals"))
        assert page.locator("#evals tr[data-eval]").count() == 2
        assert page.locator("svg#pareto circle").count() == 2
        assert (
            page.locator("#evals tr[data-eval='ev-k1']").get_attribute("data-frontier") == "true"
        )  # cheapest
        assert violations(page) == []


def test_the_budgets_page_on_postgresql(
    pg_url: str, tmp_path: Path, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(capsys, "budget", "set", "fleet", "--max-tokens", "5000", "--store", pg_url).code == 0
    config = (
        (ROOT / "examples" / "simulated.toml")
        .read_text()
        .replace("[budget]\n", '[budget]\nshared = "fleet"\n')
    )
    (tmp_path / "fleet.toml").write_text(config)
    ran = _cli(
        capsys, "run", tmp_path / "fleet.toml", "--question", "What is 17 * 23?", "--store", pg_url, "--json"
    )
    assert ran.code == 0, ran.err
    paid = ran.json["usage"]
    with Loopback(create_app(open_store(pg_url))) as server:
        page.goto(url(server, "/budgets"))
        row = page.locator("tr[data-budget='fleet'] td")
        spent = int(row.nth(2).inner_text())
        assert 0 < spent <= sum(paid.values())  # the run's paid tokens, charged to the budget
        assert int(row.nth(4).inner_text()) == 5000 - spent - int(row.nth(3).inner_text())
        spending = page.locator("tr[data-budget='fleet'] td.runs a")
        assert spending.count() == 1 and spending.inner_text() == ran.json["run_id"]
        assert violations(page) == []


def test_the_key_is_asked_for(finished: Outcome, runs: Path, page: Any) -> None:
    with Loopback(create_app(open_store(None, runs), api_key="sesame")) as server:
        page.goto(url(server, "/runs/done"))
        assert page.locator("input[type=password]").count() == 1
        assert violations(page) == []
        page.fill("input[name=key]", "wrong")
        page.click("button")
        assert page.locator(".error").inner_text() == "wrong key"
        page.fill("input[name=key]", "sesame")
        page.click("button")
        page.wait_for_selector("tr[data-run='done']")
