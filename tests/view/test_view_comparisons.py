"""The compare and sweep pages without a browser (issue 42, item 4): only the compared configs
are points, each labelled with its config and fitted keys; pilots listed apart; the axis in the
comparison's unit; an over-budget point marked and never on the frontier; greedy the baseline;
the command that reproduces the record; refusals in one line."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from comparison_records import compared, comparison, sweep, token_comparison, write
from starlette.testclient import TestClient

from lanefold.execution import open_store
from lanefold.view._app import create_app
from lanefold.view._comparisons import compare_context, sweep_context
from lanefold.view._spots import label


def _client(runs: Path) -> TestClient:
    return TestClient(create_app(open_store(None, runs), runs_dir=runs))


def test_a_point_is_labelled_with_its_config_and_fitted_keys() -> None:
    assert label("vote", {"k": 23}) == "vote k=23"
    assert label("refine", {"rounds": 3, "k": 2}) == "refine rounds=3 k=2"
    assert label("greedy", {}) == "greedy"


def test_an_over_budget_config_is_marked_and_never_on_the_frontier() -> None:
    found = compare_context(token_comparison(), [])
    spots = {s.name: s for s in found["spots"]}  # type: ignore[attr-defined]
    assert spots["wide"].over and not spots["wide"].frontier  # the most accurate, and cheaper than none
    assert spots["vote"].frontier and spots["greedy"].frontier and spots["greedy"].greedy
    assert [s.label for s in found["spots"]] == ["wide k=23", "vote k=5", "greedy"]  # type: ignore[attr-defined]
    chart = found["chart"]
    assert chart.greedy_y is not None and chart.budget_x is not None  # type: ignore[attr-defined]
    # the frontier's line joins greedy and vote only: the over-budget point is not a vertex
    wide = next(m for m in chart.marks if m.spot.name == "wide")  # type: ignore[attr-defined]
    assert (wide.x, wide.y) not in chart.frontier and len(chart.frontier) == 2  # type: ignore[attr-defined]


def test_a_sweep_s_over_budget_point_is_off_its_frontier_and_unused_budgets_are_listed() -> None:
    found = sweep_context(sweep(), [])
    spots = {s.label: s for s in found["spots"]}  # type: ignore[attr-defined]
    assert set(spots) == {"vote k=5", "vote k=23", "greedy greedy"} or set(spots) == {
        "vote k=5",
        "vote k=23",
        "greedy",
    }
    assert spots["vote k=23"].over and not spots["vote k=23"].frontier
    assert spots["vote k=5"].pool and spots["vote k=5"].frontier
    assert [(u.name, u.budget, u.status) for u in found["unused"]] == [("vote", 200.0, "below_least")]  # type: ignore[attr-defined]


def test_pilots_are_listed_apart_never_points() -> None:
    found = compare_context(token_comparison(), [])
    assert [p.eval_id for p in found["pilots"]] == ["cmp-wide.pilot", "cmp-vote.pilot"]  # type: ignore[attr-defined]
    assert not any(s.eval_id and s.eval_id.endswith(".pilot") for s in found["spots"])  # type: ignore[attr-defined]
    swept = sweep_context(sweep(), [])
    assert [(p.name, p.eval_id, p.paid) for p in swept["pilots"]] == [("vote", "sw-vote.pilot", 350.0)]  # type: ignore[attr-defined]


def test_the_axis_is_in_the_comparison_s_unit() -> None:
    tokens = compare_context(token_comparison(), [])["chart"]
    assert "tokens computed" in tokens.axis  # type: ignore[attr-defined]
    assert all("$" not in text and text.endswith("tokens") for _, text in tokens.ticks)  # type: ignore[attr-defined]
    usd = comparison(
        [
            compared("vote", 0.7, 0.0004, unit="USD", fitted={"k": 5}),
            compared("greedy", 0.5, 0.0001, unit="USD", greedy=True),
        ],
        mode="cost",
    )
    dollars = compare_context(usd, [])["chart"]
    assert dollars.axis == "paid per question (USD)"  # type: ignore[attr-defined]
    assert all(text.startswith("$") for _, text in dollars.ticks)  # type: ignore[attr-defined]


def test_the_command_reproduces_the_record() -> None:
    command = compare_context(token_comparison(), ["--runs-dir", "my runs"])["command"]
    assert command == (
        "orchestrator compare wide.toml vote.toml greedy.toml --dataset q.jsonl --limit 20 --scorer exact "
        "--equal-budget tokens --budget 400 --compare-id cmp --runs-dir 'my runs'"
    )
    assert sweep_context(sweep(), [])["command"] == (
        "orchestrator sweep vote.toml greedy.toml --dataset q.jsonl --limit 20 --budgets 200,400,800 "
        "--unit tokens --scorer exact --sweep-id sw"
    )


def test_the_pages_are_linked_from_the_evals_list_and_drawn(tmp_path: Path) -> None:
    write(tmp_path, token_comparison())
    write(tmp_path, sweep())
    client = _client(tmp_path)
    listed = client.get("/evals").text
    assert 'href="/compares/cmp"' in listed and 'href="/sweeps/sw"' in listed
    page = client.get("/compares/cmp")
    assert page.status_code == 200
    assert re.findall(
        r"<g class=spot data-name='(\w+)' data-label='([^']*)' data-over='(\w+)' data-frontier='(\w+)'",
        page.text,
    ) == [
        ("wide", "wide k=23", "true", "false"),
        ("vote", "vote k=5", "false", "true"),
        ("greedy", "greedy", "false", "true"),
    ]
    assert "id=pilots" in page.text and "cmp-vote.pilot" in page.text
    assert "orchestrator compare wide.toml" in html.unescape(page.text)
    swept = client.get("/sweeps/sw")
    assert swept.status_code == 200 and "id=unused" in swept.text and "vote k=23 (over budget)" in swept.text


@pytest.mark.parametrize(
    ("path", "status", "line"),
    [
        ("/compares/nope", 404, "no compare 'nope'"),
        ("/sweeps/nope", 404, "no sweep 'nope'"),
        ("/sweeps/bad", 422, "bad/sweep.json: not a sweep record"),
    ],
)
def test_refusals_are_one_line(tmp_path: Path, path: str, status: int, line: str) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text('{"sweep_id": 3}')
    page = _client(tmp_path).get(path)
    assert page.status_code == status, page.text
    assert line in html.unescape(page.text)
