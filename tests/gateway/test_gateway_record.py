"""The gateway answers from the checked fold (issue 38): an idempotent retry and `GET
/v1/runs/{id}` read the run through the same checks as `show`, so a record whose result was
edited is never served, on either store; the client hears a 5xx that names no server path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lanefold.config import load_config
from lanefold.execution import Session, open_store
from lanefold.primitives import Store
from tests.gateway.test_gateway import ALICE, BOB, bearer, chat, key_table, keys_file, loop_file
from tests.loopback import Loopback

pytest.importorskip("starlette")

from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys


@pytest.fixture(params=["files", "postgres"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, str | None]:
    """The store, and its database's URL where it is PostgreSQL."""
    if request.param == "files":
        return open_store(None, tmp_path / "runs"), None
    url = str(request.getfixturevalue("pg_url"))
    return open_store(url), url


@contextmanager
def served(tmp_path: Path, store: Store) -> Iterator[httpx.Client]:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    keys = load_keys(keys_file(tmp_path, key_table("alice", ALICE), key_table("bob", BOB)), loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    app = create_gateway(Session(store=store), loops, keys=keys, pools=pools, heartbeat_s=0.05)
    with Loopback(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def rewrite_result(stored: tuple[Store, str | None], run_id: str, change: dict[str, Any]) -> None:
    """The run's `run.completed` line with `change` merged into its result, written back where
    the store keeps it (the file's line, the database's row)."""
    store, url = stored
    events = [e.model_dump(mode="json", by_alias=True) for e in store.reader(run_id).read()]
    end = events[-1]
    assert end["type"] == "run.completed"
    end["data"]["result"].update(change)
    if url is None:
        Path(store.location(run_id)).write_text("".join(json.dumps(e) + "\n" for e in events))
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE lanefold_events SET body = %s WHERE run_id = %s AND sequence = %s",
            (json.dumps(end), run_id, end["sequence"]),
        )


def test_an_edited_winner_text_is_never_served(tmp_path: Path, stored: tuple[Store, str | None]) -> None:
    store, _ = stored
    forged = "Answer: 999 (forged)"
    headers = {**bearer(ALICE), "Idempotency-Key": "order-38"}
    with served(tmp_path, store) as client:
        first = client.post("/chat/completions", json=chat(), headers=headers)
        assert first.status_code == 200, first.text
        run_id = first.headers["x-lanefold-run-id"]
        rewrite_result(stored, run_id, {"winner_text": forged})
        again = client.post("/chat/completions", json=chat(), headers=headers)
        streamed = client.post("/chat/completions", json=chat(stream=True), headers=headers)
        record = client.get(f"/runs/{run_id}", headers=bearer(ALICE))
        not_bobs = client.get(f"/runs/{run_id}", headers=bearer(BOB))
    assert not_bobs.status_code == 404, "another key learns nothing of the run, corrupt or not"
    for response in (again, streamed, record):
        assert forged not in response.text, response.text
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["code"] == "run_record_corrupt", error
        assert run_id in error["message"] and store.location(run_id) not in error["message"]
        assert response.headers.get("x-should-retry") == "false"
