"""The gateway's request parsing at its edges (issue 38): JSON nested past a bound is a 400
naming it, every field's JSON type is its own (a string is not a number, "yes" is not true),
a count past its bound is refused, and a second `Authorization` header is refused, not
read as the first. Each was a defect on main: a 500 with a RecursionError in the log, `"n":
"3"` and `"stream": "yes"` coerced, a second header ignored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from lanefold.config import load_config
from tests.gateway.test_gateway import ALICE, BOB, bearer, chat, gateway, key_table, keys_file, loop_file

pytest.importorskip("starlette")

MAX_JSON_DEPTH = 64  # lanefold.serve._guard.MAX_JSON_DEPTH: far past any OpenAI request's nesting


def _loops(tmp_path: Path) -> dict[str, Any]:
    return {"vote": load_config(loop_file(tmp_path / "loops"))}


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_json_nested_5000_deep_is_a_400_naming_the_bound(tmp_path: Path, path: str) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    raw = b'{"model": "vote", "prompt": "Q", "metadata": {"x": ' + deep + b"}}"
    with gateway(tmp_path, _loops(tmp_path)) as (client, runs):
        r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        at_bound = client.post(
            path,
            content=b'{"model": "vote", "prompt": "Q", "n": '
            + b"[" * (MAX_JSON_DEPTH - 1)
            + b"]" * (MAX_JSON_DEPTH - 1)
            + b"}",
            headers={"Content-Type": "application/json"},
        )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"the request body's JSON nests deeper than {MAX_JSON_DEPTH} levels"
    assert at_bound.status_code == 400 and "nests deeper" not in at_bound.text  # parsed, then refused
    assert not runs.exists() or not any(runs.iterdir())  # no run was made of it


BAD_TYPES = {
    "n": ("3", 'n: an integer was expected, got a string ("3")'),
    "stream": ("yes", 'stream: a boolean was expected, got a string ("yes")'),
    "max_tokens": ("16", 'max_tokens: an integer was expected, got a string ("16")'),
    "max_completion_tokens": (True, "max_completion_tokens: an integer was expected, got a boolean (true)"),
    "temperature": ("0.5", 'temperature: a number was expected, got a string ("0.5")'),
    "top_p": ([1], "top_p: a number was expected, got an array ([1])"),
    "stream_options": ("on", 'stream_options: an object was expected, got a string ("on")'),
    "user": (7, "user: a string was expected, got an integer (7)"),
    "seed": ("1", 'seed: an integer was expected, got a string ("1")'),
}


@pytest.mark.parametrize("field", BAD_TYPES)
def test_a_field_of_the_wrong_json_type_is_a_400_naming_it(tmp_path: Path, field: str) -> None:
    value, said = BAD_TYPES[field]
    with gateway(tmp_path, _loops(tmp_path)) as (client, _):
        r = client.post("/chat/completions", json=chat(**{field: value}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert r.json()["error"]["message"] == said


def test_a_nested_field_of_the_wrong_json_type_is_named_by_its_path(tmp_path: Path) -> None:
    with gateway(tmp_path, _loops(tmp_path)) as (client, _):
        r = client.post("/chat/completions", json=chat(stream=True, stream_options={"include_usage": 1}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.include_usage"


def test_a_keys_budget_past_what_a_bill_holds_is_refused_naming_it(tmp_path: Path) -> None:
    from lanefold.primitives import ConfigError
    from lanefold.serve import load_keys

    keys = keys_file(tmp_path, key_table("alice", ALICE, f"budget = {{ max_tokens = {2**60} }}"))
    with pytest.raises(ConfigError, match=r"keys\.0\.budget\.max_tokens: "):
        load_keys(keys, _loops(tmp_path))


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 2**53 + 1), ("max_completion_tokens", 2**31), ("n", 65), ("max_tokens", 0)],
)
def test_a_count_past_its_bound_is_a_400_naming_it(tmp_path: Path, field: str, value: int) -> None:
    with gateway(tmp_path, _loops(tmp_path)) as (client, _):
        r = client.post("/chat/completions", json=chat(**{field: value}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_the_largest_max_tokens_is_taken(tmp_path: Path) -> None:
    with gateway(tmp_path, _loops(tmp_path)) as (client, _):
        r = client.post("/chat/completions", json=chat(max_tokens=2**31 - 1, n=1, stream=False))
    assert r.status_code == 200, r.text


def test_two_authorization_headers_are_refused_not_read_as_one(tmp_path: Path) -> None:
    keys = keys_file(tmp_path, key_table("alice", ALICE), key_table("bob", BOB))
    twice = [("Authorization", f"Bearer {ALICE}"), ("Authorization", f"Bearer {BOB}")]
    with gateway(tmp_path, _loops(tmp_path), keys=keys) as (client, runs):
        refused = client.post("/chat/completions", json=chat(), headers=twice)
        models = client.get("/models", headers=twice)
        alone = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
    for r in (refused, models):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == "Authorization: sent 2 times; send one"
        assert r.json()["error"]["param"] == "Authorization"
        assert ALICE not in r.text and BOB not in r.text
    assert alone.status_code == 200
    assert len(list(runs.iterdir())) == 1  # only the request with one header ran


def test_two_authorization_headers_are_refused_by_the_api_key_env_middleware(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from lanefold.serve._guard import KeyCheck

    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse("in")

    app = KeyCheck(Starlette(routes=[Route("/", ok)]), key="k-123")
    with TestClient(app) as test:
        once = test.get("/", headers={"Authorization": "Bearer k-123"})
        # the right key last, then first: each used to be read as the one header
        twice = [("Authorization", "Bearer wrong"), ("Authorization", "Bearer k-123")]
        refused = test.get("/", headers=twice)
        reversed_ = test.get("/", headers=list(reversed(twice)))
    assert once.status_code == 200 and once.text == "in"
    for r in (refused, reversed_):
        assert r.status_code == 400, r.text
        assert json.loads(r.text)["error"]["message"] == "Authorization: sent 2 times; send one"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_store_that_cannot_hold_the_run_is_a_5xx_naming_no_server_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    # A runs folder the server cannot write used to be a 400 (the client's fault?) whose
    # message named the folder on the server. Root ignores file modes, so the folder is made
    # unusable as a user's would be by a mistake: the path is a file.
    runs = tmp_path / "server-side-runs"
    runs.write_text("not a folder\n")
    with caplog.at_level("ERROR", logger="lanefold"):
        with gateway(tmp_path, _loops(tmp_path), runs=runs) as (client, _):
            r = client.post("/chat/completions", json=chat(stream=stream))
    assert r.status_code == 500, r.text
    assert str(tmp_path) not in r.text and "server-side-runs" not in r.text
    error = json.loads(r.text.removeprefix("data: ").split("\n")[0])["error"] if stream else r.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "store_error")
    logged = [rec.getMessage() for rec in caplog.records if "store_error" in rec.getMessage()]
    assert logged and "server-side-runs" in logged[0]  # the operator's log says where
