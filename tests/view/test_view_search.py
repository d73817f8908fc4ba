"""Finding things in the view (issue 42 item 5, issue 41 item 6's view), on files and PostgreSQL:
runs searched by question, answer, loop, model, caller, status and time (GET parameters, a
search is a URL); an eval's questions by right or wrong; the keys list and a key's page with
the figures `keys show` and `GET /v1/usage` give, its spend over time and its runs; gateway
runs showing the model their client asked for and their caller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_support import ROOT, cli
from key_gateway import LOOP, gateway
from starlette.testclient import TestClient

import lanefold
from lanefold.config import parse_config
from lanefold.execution import Store, open_store
from lanefold.view._app import create_app


def _ask(client: TestClient, key: str, question: str) -> None:
    body = {"model": "vote", "messages": [{"role": "user", "content": question}]}
    answered = client.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert answered.status_code == 200, answered.text


def _rows(page: str) -> list[str]:
    return re.findall(r"<tr data-run='([^']+)'", page)


def _served(store: Store, capsys: pytest.CaptureFixture[str], flags: list[str]) -> dict[str, str]:
    """Two keys' gateway runs and one run from the Python API: their run ids by question."""
    keys = {}
    for name in ("alice", "bob"):
        made = cli(capsys, "keys", "create", name, "--max-tokens", "100000", *flags, "--json")
        assert made.code == 0, made.err
        keys[name] = made.json["key"]
    with gateway(store) as client:
        _ask(client, keys["alice"], "What is 17 * 23?")
        _ask(client, keys["bob"], "What is 50% of 8?")
        _ask(client, keys["alice"], "Name the capital of France.")
    lanefold.run_sync(parse_config(LOOP), "what IS 2 + 2?", store=store, run_id="local")
    return {s.question: s.run_id for s in store.list_runs()}


def test_runs_are_searched_by_question_model_caller_status_and_time(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    ids = _served(store, capsys, flags)
    client = TestClient(create_app(store))

    def found(query: str) -> list[str]:
        page = client.get(f"/?{query}")
        assert page.status_code == 200, page.text
        return _rows(page.text)

    everything = found("")
    assert len(everything) == 4
    assert found("question=WHAT+is") == [
        ids["what IS 2 + 2?"],
        ids["What is 50% of 8?"],
        ids["What is 17 * 23?"],
    ]
    assert found("question=50%25") == [ids["What is 50% of 8?"]]  # a % is itself
    assert found("caller=alice") == [ids["Name the capital of France."], ids["What is 17 * 23?"]]
    assert found("caller=alice&question=capital") == [ids["Name the capital of France."]]
    assert found("model=vote&caller=bob") == [ids["What is 50% of 8?"]]
    assert found("loop=parallel_sample") == everything
    assert found("status=failed") == []
    assert found("since=2000-01-01&until=2999-01-01") == everything
    assert found("until=2000-01-01") == []
    page = client.get("/?question=capital&caller=alice").text
    assert "value='capital'" in page and "value='alice'" in page  # the search stays in its form
    assert "no runs match" in client.get("/?question=nowhere").text
    assert client.get("/?until=tomorrow").status_code == 400
    # the runs list and a run's page say which model was asked for and by whom
    row = re.search(rf"<tr data-run='{ids['What is 50% of 8?']}'.*?</tr>", page + client.get("/").text, re.S)
    assert row is not None
    assert "<td class=model>vote</td>" in row.group(0) and ">bob</a>" in row.group(0)
    shown = client.get(f"/runs/{ids['What is 50% of 8?']}").text
    assert "<b class=model>vote</b>" in shown and 'href="/keys/bob">bob</a>' in shown
    assert "<p id=asked>" not in client.get(f"/runs/{ids['what IS 2 + 2?']}").text  # nobody's


def test_a_key_s_page_gives_keys_show_s_figures_its_spend_over_time_and_runs(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    ids = _served(store, capsys, flags)
    shown = cli(capsys, "keys", "show", "alice", *flags, "--json").json
    assert shown["spend"]["tokens"] > 0
    client = TestClient(create_app(store))
    page = client.get("/keys/alice").text
    spent = dict(re.findall(r"<tr data-unit=(\w+)><th>\w+</th><td class=spent data-spent='([^']+)'>", page))
    assert int(spent["tokens"]) == shown["spend"]["tokens"]
    assert float(spent["usd"]) == shown["spend"]["cost_usd"]
    assert int(spent["requests"]) == shown["spend"]["requests"] == 2
    assert _rows(page) == [ids["Name the capital of France."], ids["What is 17 * 23?"]]
    bars = re.findall(r"<rect class=bar data-period='[^']+' data-tokens='(\d+)'", page)
    assert sum(map(int, bars)) == sum(s.tokens for s in store.list_runs(caller="alice"))
    assert 'href="/?caller=alice"' in page
    listed = client.get("/keys").text
    assert "<tr data-key='alice'>" in listed and "<tr data-key='bob'>" in listed
    for view in (page, listed):
        for key in store.list_keys():  # type: ignore[attr-defined]
            assert key.record.sha256 not in view  # a key's hash is never shown
    assert client.get("/keys/carol").status_code == 404
    refused = client.get("/keys/-bad name")
    assert refused.status_code == 400 and "is not a key name" in refused.text


def test_an_eval_s_questions_filtered_right_or_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    config = ROOT / "examples" / "simulated.toml"
    data = tmp_path / "qs.jsonl"
    data.write_text(
        '{"question": "What is 17 * 23?", "answer": "391"}\n{"question": "What is 17 * 23?", "answer": "7"}\n'
    )
    ran = cli(capsys, "eval", config, "--dataset", data, "--runs-dir", runs, "--eval-id", "ev", "--json")
    assert ran.code == 0, ran.err
    client = TestClient(create_app(open_store(None, runs)))

    def scores(query: str) -> list[str]:
        return re.findall(r"<tr data-correct='(\w+)'>", client.get(f"/evals/ev{query}").text)

    assert sorted(scores("")) == ["false", "true"]
    assert scores("?score=right") == ["true"]
    assert scores("?score=wrong") == ["false"]
    assert client.get("/evals/ev?score=maybe").status_code == 400
