"""The gateway answers from the checked fold (issue 38): an idempotent retry and `GET
/v1/runs/{id}` read the run through the same checks as `show`, so a record whose result was
edited, or whose reduce and result were edited alike for an answer its lanes do not give, is
never served, on either store; the client hears a 5xx that names no server path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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
def served(tmp_path: Path, store: Store, loop: str = "") -> Iterator[httpx.Client]:
    """The gateway over `store`, serving `vote` (parallel_sample, or the `[loop]` keys `loop`
    puts in place of its `k`)."""
    path = loop_file(tmp_path / "loops")
    if loop:
        path.write_text(path.read_text().replace("k = 8\n", loop))
    loops = {"vote": load_config(path)}
    keys = load_keys(keys_file(tmp_path, key_table("alice", ALICE), key_table("bob", BOB)), loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    app = create_gateway(Session(store=store), loops, keys=keys, pools=pools, heartbeat_s=0.05)
    with Loopback(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def rewrite(
    stored: tuple[Store, str | None], run_id: str, edit: Callable[[list[dict[str, Any]]], None]
) -> None:
    """The run's events as `edit` changes them, written back where the store keeps them (the
    file's lines, the database's rows)."""
    store, url = stored
    events = [e.model_dump(mode="json", by_alias=True) for e in store.reader(run_id).read()]
    edit(events)
    if url is None:
        Path(store.location(run_id)).write_text("".join(json.dumps(e) + "\n" for e in events))
        return
    import psycopg

    with psycopg.connect(url) as conn:
        for event in events:
            conn.execute(
                "UPDATE lanefold_events SET body = %s WHERE run_id = %s AND sequence = %s",
                (json.dumps(event), run_id, event["sequence"]),
            )


def rewrite_result(stored: tuple[Store, str | None], run_id: str, change: dict[str, Any]) -> None:
    """The run's `run.completed` line with `change` merged into its result."""

    def edit(events: list[dict[str, Any]]) -> None:
        assert events[-1]["type"] == "run.completed"
        events[-1]["data"]["result"].update(change)

    rewrite(stored, run_id, edit)


def crown_another(events: list[dict[str, Any]]) -> None:
    """The reduce and the result rewritten alike for a lane with another answer: a record
    that agrees with itself, and that the lanes' votes do not give."""
    reduce, result = (
        next(e["data"] for e in events if e["type"] == "reduce.completed"),
        events[-1]["data"]["result"],
    )
    other = next(
        e
        for e in events
        if e["type"] == "lane.completed" and e["data"]["answer"] not in (None, reduce["winner"])
    )
    reduce.update(winner=other["data"]["answer"], winner_lane=other["lane"])
    if "winner_wave" in reduce:
        reduce["winner_wave"] = other["wave"]
    result.update(
        answer=other["data"]["answer"],
        winner_lane=other["lane"],
        winner_wave=other["wave"],
        winner_text=other["data"]["text"],
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


def test_an_adaptive_runs_vote_forged_alike_in_reduce_and_result_is_never_served(
    tmp_path: Path, stored: tuple[Store, str | None]
) -> None:
    store, _ = stored
    headers = {**bearer(ALICE), "Idempotency-Key": "order-38-adaptive"}
    adaptive = 'coordinator = "adaptive_sample"\nwindow = 4\nmax_lanes = 12\n'
    with served(tmp_path, store, adaptive) as client:
        first = client.post("/chat/completions", json=chat(), headers=headers)
        assert first.status_code == 200, first.text
        run_id = first.headers["x-lanefold-run-id"]
        rewrite(stored, run_id, crown_another)
        again = client.post("/chat/completions", json=chat(), headers=headers)
        record = client.get(f"/runs/{run_id}", headers=bearer(ALICE))
    for response in (again, record):
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["code"] == "run_record_corrupt" and run_id in error["message"], error
