"""Finding things in headless Chromium (issue 42 items 5 and 6): a search by question typed into
the runs page's form and sent (the address is the search), and a key's page whose spend is the
store's own figure (`keys show`, `GET /v1/usage`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_support import Outcome, cli
from key_gateway import LOOP, gateway
from loopback import Loopback
from view_browser import url, violations

import lanefold
from lanefold.config import parse_config
from lanefold.execution import open_store
from lanefold.view._app import create_app


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Outcome:
    """The command in a thread of its own: Playwright's sync API holds an event loop in this one."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(cli, capsys, *argv).result()


def test_runs_searched_by_question_in_the_form(tmp_path: Path, page: Any) -> None:
    runs = tmp_path / "runs"

    def ask() -> None:  # in a thread of its own: Playwright's sync API holds an event loop in this one
        for i, question in enumerate(("What is 17 * 23?", "Name the capital of France.", "what is 2 + 2?")):
            lanefold.run_sync(parse_config(LOOP), question, runs_dir=runs, run_id=f"r{i}")

    with ThreadPoolExecutor(1) as thread:
        thread.submit(ask).result()
    with Loopback(create_app(open_store(None, runs))) as server:
        page.goto(url(server, "/"))
        assert page.locator("#runs tbody tr").count() == 3
        page.fill("#search input[name=question]", "WHAT IS")
        page.click("#search button")
        page.wait_for_url("**/?*question=WHAT+IS*")
        found = [page.locator("#runs tbody tr").nth(i).get_attribute("data-run") for i in range(2)]
        assert found == ["r2", "r0"] and page.locator("#runs tbody tr").count() == 2
        assert page.locator("#search input[name=question]").input_value() == "WHAT IS"
        assert violations(page) == []


def test_a_key_s_page_shows_the_store_s_spend(
    tmp_path: Path, page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    made = _cli(capsys, "keys", "create", "alice", "--max-tokens", "100000", "--runs-dir", runs, "--json")
    assert made.code == 0, made.err
    store = open_store(None, runs)

    def ask() -> None:
        with gateway(store) as client:
            for question in ("What is 17 * 23?", "What is 19 * 21?"):
                body = {"model": "vote", "messages": [{"role": "user", "content": question}]}
                headers = {"Authorization": f"Bearer {made.json['key']}"}
                assert client.post("/chat/completions", json=body, headers=headers).status_code == 200
            usage.update(client.get("/usage", headers=headers).json())

    usage: dict[str, Any] = {}
    with ThreadPoolExecutor(1) as thread:
        thread.submit(ask).result()
    shown = _cli(capsys, "keys", "show", "alice", "--runs-dir", runs, "--json").json
    assert shown["spend"] == usage["spend"] and shown["spend"]["tokens"] > 0
    with Loopback(create_app(store)) as server:
        page.goto(url(server, "/keys"))
        page.click("tr[data-key='alice'] a")
        page.wait_for_selector("#spend")
        tokens = page.locator("#spend tr[data-unit=tokens] .spent")
        assert int(tokens.inner_text()) == int(tokens.get_attribute("data-spent")) == shown["spend"]["tokens"]
        usd = page.locator("#spend tr[data-unit=usd] .spent").get_attribute("data-spent")
        assert float(usd) == shown["spend"]["cost_usd"]
        assert page.locator("#spend-plot rect.bar").count() >= 1
        assert page.locator("#runs tbody tr").count() == 2
        assert violations(page) == []
        page.click("#key-runs")
        page.wait_for_url("**/?caller=alice")
        assert page.locator("#runs tbody tr").count() == 2
