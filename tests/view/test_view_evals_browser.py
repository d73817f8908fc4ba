"""The eval, compare and sweep pages in headless Chromium (issue 42, items 4 and 6): an eval's
page counting its questions as they land, without a reload; a compare's and a sweep's frontier
leaving out the config that paid over its budget though it would be on it otherwise.

Skipped, saying why, only where Chromium or Playwright cannot be had (`make test` installs both
where it can)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_support import Outcome, cli
from comparison_records import sweep, token_comparison, write
from loopback import Loopback
from view_browser import url, violations

from lanefold.execution import open_store
from lanefold.view._app import create_app


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Outcome:
    """The command in a thread of its own: Playwright's sync API holds an event loop in this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(cli, capsys, *argv).result()


def test_an_eval_page_counts_questions_as_they_land_without_a_reload(
    tmp_path: Path, page: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = '[loop]\nk = 3\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.6\n'
    (tmp_path / "sim.toml").write_text(config)
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "391"}) + "\n" for i in range(5))
    )
    assert _cli(capsys, "eval", "sim.toml", "--dataset", "q.jsonl", "--eval-id", "done", "--json").code == 0
    store = open_store(None, tmp_path / "runs")
    done = store.eval_record("done")
    rows = done.read_rows(lambda line: line)
    manifest = json.loads(done.read_manifest() or b"{}")
    # The same eval again as it runs: its manifest, then its rows one at a time.
    (tmp_path / "runs" / "going").mkdir()  # as run_eval makes it, before its manifest
    going = store.eval_record("going")
    going.write_manifest(json.dumps(manifest | {"eval_id": "going"}).encode())
    with Loopback(create_app(store)) as server:
        page.goto(url(server, "/evals/going"))
        assert page.locator("#landed").get_attribute("data-landed") == "0"
        assert page.locator("#landed").get_attribute("data-total") == "5"
        page.evaluate("window.notReloaded = true")
        for count, row in enumerate(rows, 1):
            going.append_row(row)
            page.wait_for_selector(f"#landed[data-landed='{count}']", timeout=10_000)
            assert page.locator("#question-rows tr[data-correct]").count() == count
            assert page.locator("#eval-curve svg").get_attribute("data-points") == str(count)
            right = page.locator("#question-rows tr[data-correct='true']").count()
            assert float(page.locator("#accuracy").get_attribute("data-accuracy") or "nan") == right / count
        summary = done.read_summary() or b""
        going.write_summary(summary, table="")
        page.wait_for_selector("#landed[data-ended='true']", timeout=10_000)
        assert page.evaluate("window.notReloaded") is True  # every count came by the feed
        expected = json.loads(summary)["accuracy"]
        assert float(page.locator("#accuracy").get_attribute("data-accuracy") or "nan") == expected
        assert violations(page) == []


def test_the_frontier_leaves_out_an_over_budget_config(tmp_path: Path, page: Any) -> None:
    write(tmp_path, token_comparison())
    write(tmp_path, sweep())
    with Loopback(create_app(open_store(None, tmp_path), runs_dir=tmp_path)) as server:
        page.goto(url(server, "/evals"))
        page.click("a[href='/compares/cmp']")
        page.wait_for_selector("svg#pareto")
        wide = page.locator("g.spot[data-name='wide']")
        assert wide.get_attribute("data-over") == "true" and wide.get_attribute("data-frontier") == "false"
        assert wide.locator("path.over").count() == 1  # drawn as a cross
        assert wide.locator("text.point-label").text_content() == "wide k=23 (over budget)"
        on = page.locator("g.spot[data-frontier='true']")
        assert sorted(on.nth(i).get_attribute("data-name") for i in range(on.count())) == ["greedy", "vote"]
        vertices = page.locator("svg#pareto polyline").get_attribute("points") or ""
        assert len(vertices.split()) == 2  # greedy and vote: the over-budget point is no vertex
        assert page.locator("line.greedy").count() == 1 and page.locator("line.budget").count() == 1
        assert "tokens" in (page.locator("svg#pareto text.axis").text_content() or "")
        assert page.locator("#pilots tr[data-name]").count() == 2
        assert page.locator("#command").inner_text().startswith("orchestrator compare wide.toml")
        assert violations(page) == []

        page.goto(url(server, "/sweeps/sw"))
        over = page.locator("g.spot[data-label='vote k=23']")
        assert over.get_attribute("data-over") == "true" and over.get_attribute("data-frontier") == "false"
        assert page.locator("g.spot[data-label='vote k=5']").get_attribute("data-frontier") == "true"
        assert page.locator("g.spot[data-greedy='true'] rect.greedy-point").count() == 1
        assert page.locator("#unused tr[data-name='vote']").count() == 1
        assert violations(page) == []
