"""`LOOP/MODEL` with keys kept in the store (issue 41 item 5), on files and on PostgreSQL alike:
`keys create --loops vote/gpt-4o-mini` opens that one combination, `--loops vote` the loop over
every model it lists; `/v1/models` answers each key its own; `list --model` finds a
combination's runs exactly and a loop's by its name; the key's spend is its runs' whatever model
they ran over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli

from lanefold.execution import Store, read_state
from lanefold.serve import gateway_app, loop_configs

pytest.importorskip("starlette")
from starlette.testclient import TestClient

LOOP = """
[loop]
k = 4
max_concurrency = 4
seed = 7
[sampling]
max_tokens = 32
[backend]
kind = "simulated"
model = "gpt-4o"
prompt_tokens = 20
output_tokens = 10
[serve]
models = ["gpt-4o-mini", "gpt-4.1-mini"]
"""


def _create(capsys: pytest.CaptureFixture[str], flags: list[str], name: str, loops: str) -> dict[str, str]:
    made = cli(capsys, "keys", "create", name, "--loops", loops, *flags, "--json")
    assert made.code == 0, made.err
    return {"Authorization": f"Bearer {made.json['key']}"}


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "What is 17 * 23?"}]}


def test_store_keys_reach_the_combinations_they_name(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store, flags = opened
    folder = tmp_path / "loops"
    folder.mkdir()
    (folder / "vote.toml").write_text(LOOP)
    alice = _create(capsys, flags, "alice", "vote")
    bob = _create(capsys, flags, "bob", "vote/gpt-4o-mini")
    app = gateway_app(loop_configs(folder), store, store_keys=True)
    with TestClient(app, base_url="http://gateway/v1", raise_server_exceptions=False) as client:
        listed = {
            name: [m["id"] for m in client.get("/models", headers=auth).json()["data"]]
            for name, auth in (("alice", alice), ("bob", bob))
        }
        ran = {}
        for name, auth, model in (
            ("bob", bob, "vote/gpt-4o-mini"),
            ("alice", alice, "vote"),
            ("alice", alice, "vote/gpt-4.1-mini"),
        ):
            done = client.post("/chat/completions", json=_chat(model), headers=auth)
            assert done.status_code == 200, done.text
            ran[(name, model)] = done.headers["x-lanefold-run-id"]
        refused = client.post("/chat/completions", json=_chat("vote/gpt-4.1-mini"), headers=bob)
    assert listed == {"alice": ["vote", "vote/gpt-4o-mini", "vote/gpt-4.1-mini"], "bob": ["vote/gpt-4o-mini"]}
    assert refused.status_code == 404
    assert refused.json()["error"]["message"] == (
        "model 'vote/gpt-4.1-mini' not found: loop 'vote' serves vote/gpt-4o-mini"
    )

    def found(*filters: str) -> set[str]:
        out = cli(capsys, "list", *filters, *flags, "--json").out
        return {json.loads(line)["run_id"] for line in out.splitlines()}

    assert found("--model", "vote/gpt-4o-mini") == {ran[("bob", "vote/gpt-4o-mini")]}
    assert found("--model", "vote", "--caller", "alice") == {
        ran[("alice", "vote")],
        ran[("alice", "vote/gpt-4.1-mini")],
    }
    assert found("--model", "vote/gpt-4") == set()  # a prefix ends at a `/`, never inside a name
    state = read_state(store, ran[("alice", "vote/gpt-4.1-mini")])
    assert state.started is not None and state.started.config["backend"]["model"] == "gpt-4.1-mini"
    spent = sum(read_state(store, ran[key]).spend.tokens for key in ran if key[0] == "alice")
    assert cli(capsys, "keys", "show", "alice", *flags, "--json").json["spend"]["tokens"] == spent > 0
