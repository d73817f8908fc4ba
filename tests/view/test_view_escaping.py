"""Stored and reflected XSS in headless Chromium (issue 42): payloads kept in a run's question,
its answer and its lanes' text, its loop name, its model and caller, its config values, a
compare's and a sweep's config names, fitted keys and dataset, and sent as a run id, an eval
id, a compare or sweep id, a key name, search and filter values, are shown as text on every
page and never run; no page the view serves trips its Content-Security-Policy. A control page
that does place a payload unescaped shows that both checks see it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from comparison_records import compared, comparison, sweep, write
from loopback import Loopback
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from view_browser import url, violations

import lanefold
from lanefold.execution import open_store
from lanefold.view._app import CSP, create_app

SCRIPT = '<script>window.__xss = "script"</script>'
IMG = "<img src=x onerror=\"window.__xss = 'img'\">"
SVG = "'\"><svg onload=\"window.__xss = 'svg'\">"
MARK = f"{SCRIPT} {IMG} {SVG}"
# What a payload leaves in the page where it was not escaped: an element, a handler, a run.
INJECTED = """() => ({
  xss: window.__xss === undefined ? null : window.__xss,
  elements: document.querySelectorAll("img[src='x'], svg[onload], script:not([src])").length,
})"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A files store holding a run whose question, answer, lane texts and config carry the
    payloads, and a copy of it whose recorded loop name is one."""
    runs = tmp_path_factory.mktemp("hostile") / "runs"
    config = {
        "loop": {"k": 3, "seed": 5, "min_quorum": 1},
        "prompt": {"template": "{question} " + MARK},
        "extract": {"regex": r"Answer:\s*(.+)"},
        "backend": {"kind": "simulated", "answer": MARK, "accuracy": 1.0, "distractors": [MARK + "!"]},
    }
    lanefold.run_sync(lanefold.parse_config(config), f"What is {MARK}?", runs_dir=runs, run_id="hostile")
    lines = (runs / "hostile" / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["data"]["coordinator"] = MARK  # as a store written by another hand holds it
    first["data"]["model"] = first["data"]["caller"] = MARK  # and a gateway's who and what
    (runs / "named").mkdir()
    copy = "\n".join([json.dumps(first), *lines[1:]]).replace('"run_id": "hostile"', '"run_id": "named"')
    (runs / "named" / "events.jsonl").write_text(copy + "\n")
    return runs


def _visit(page: Any, address: str) -> str:
    page.goto(address)
    page.wait_for_load_state("load")
    assert page.evaluate(INJECTED) == {"xss": None, "elements": 0}, address
    assert violations(page) == [], address
    return str(page.inner_text("body"))


def test_stored_payloads_are_text_on_every_page(hostile: Path, page: Any) -> None:
    with Loopback(create_app(open_store(None, hostile))) as server:
        shown = _visit(page, url(server, "/runs/hostile"))
        assert f"What is {MARK}?" in shown  # the question
        assert page.locator("#winner").get_attribute("data-answer") == MARK  # the answer
        assert page.locator("#winner").inner_text().startswith(MARK)
        assert page.locator("#winner-text").inner_text().endswith(f"Answer: {MARK}")  # a lane's text
        assert page.locator("#waves .lane-text").first.text_content().endswith(MARK)  # a lane, closed
        assert page.locator(".vote").first.get_attribute("data-answer") == MARK
        assert json.dumps(MARK) in page.locator("#config").inner_text()  # config values, as JSON

        listed = _visit(page, url(server, "/"))
        assert page.locator("tr[data-run='named'] td").nth(1).inner_text() == MARK  # the loop name
        assert page.locator("tr[data-run='named'] td.model").inner_text() == MARK  # the model asked for
        assert page.locator("tr[data-run='named'] td.caller").inner_text() == MARK  # the caller
        assert listed.count(MARK) >= 2  # and both runs' answers

        refused = _visit(page, url(server, "/runs/named"))  # its log refused: one line, as text
        assert "orchestrator show:" in refused, refused


@pytest.mark.parametrize(
    "path",
    [
        f"/runs/{quote(IMG)}",  # a run id no store can hold: the 400 names it
        f"/evals/{quote(SVG)}",  # an eval id
        f"/?loop={quote(MARK)}&status={quote(SVG)}",  # filters, shown back in their fields
        f"/?question={quote(MARK)}&answer={quote(SVG)}&model={quote(IMG)}&caller={quote(MARK)}",  # search
        f"/?caller={quote(MARK)}",  # a search that finds the run whose caller is a payload
        f"/keys/{quote(IMG)}",  # a key name no store can hold: the 400 names it
        f"/evals/hostile?score={quote(SVG)}",
        f"/evals?prefix={quote(MARK)}",
        f"/budgets?name={quote(IMG)}",
        f"/compares/{quote(IMG)}",  # a compare id no store can hold
        f"/sweeps/{quote(SVG)}",  # a sweep id
        f"/evals/{quote(SVG)}?score=right",
    ],
)
def test_reflected_payloads_are_text(hostile: Path, page: Any, path: str) -> None:
    with Loopback(create_app(open_store(None, hostile))) as server:
        _visit(page, url(server, path))


def test_payloads_in_compare_and_sweep_records_are_text(hostile: Path, page: Any) -> None:
    """Config names, fitted values, the dataset, the scorer and the tests' statement of a
    compare's and a sweep's records, on their pages, the evals list and the plot's labels."""
    lines = [
        compared(MARK, 0.9, 450.0, fitted={"k": MARK}),
        compared("vote", 0.7, 390.0, fitted={MARK: 5}),
        compared("greedy", 0.5, 120.0, greedy=True),
    ]
    shown_as = {"dataset": MARK, "scorer": MARK, "tests": MARK}
    write(hostile, comparison(lines, "hostile-cmp").model_copy(update=shown_as))
    write(hostile, sweep("hostile-sw", name=MARK).model_copy(update=shown_as))
    with Loopback(create_app(open_store(None, hostile), runs_dir=hostile)) as server:
        shown = _visit(page, url(server, "/compares/hostile-cmp"))
        assert f"{MARK} k={MARK}" in shown and f"vote {MARK}=5" in shown  # the table's labels
        label = page.locator("g.spot text.point-label").first.text_content()
        assert label == f"{MARK} k={MARK} (over budget)"  # the plot's
        assert shlex.quote(f"{MARK}.toml") in page.locator("#command").inner_text()  # quoted for a shell
        shown = _visit(page, url(server, "/sweeps/hostile-sw"))
        assert f"{MARK} k=23" in shown and MARK in page.locator("#pilots").inner_text()
        _visit(page, url(server, "/evals"))


def test_the_key_form_and_a_live_run_trip_no_policy(hostile: Path, page: Any) -> None:
    with Loopback(create_app(open_store(None, hostile), api_key="sesame")) as server:
        _visit(page, url(server, "/runs/hostile"))  # the form, 401
        page.fill("input[name=key]", "sesame")
        page.click("button")
        page.wait_for_selector("tr[data-run='hostile']")
        _visit(page, url(server, "/runs/named"))


def test_the_checks_see_a_payload_placed_unescaped(page: Any) -> None:
    """The control: the same checks on a page that does place the payload raw, under the
    view's policy. Without it a check that can never fail would pass."""

    async def raw(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<p>{MARK}</p>", headers={"content-security-policy": CSP})

    with Loopback(Starlette(routes=[Route("/", raw)])) as server:
        page.goto(url(server, "/"))
        page.wait_for_load_state("load")
        found = page.evaluate(INJECTED)
        assert found["elements"] >= 2 and found["xss"] is None  # there, and the policy kept it from running
        assert any("script-src" in line for line in violations(page)), violations(page)
