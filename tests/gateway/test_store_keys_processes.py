"""Keys kept in the store across processes, as a user runs them (issue 41): two `orchestrator
serve --store-keys` processes over one store, a key made by `orchestrator keys create` while
they serve (no restart), its requests a minute shared by both, then revoked. On files and on
PostgreSQL."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
from cli_support import cli
from test_gateway_processes import _loops, served

pytest.importorskip("starlette")


@pytest.fixture(params=["files", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """The flags naming the store both gateways and the command line use."""
    if request.param == "files":
        return ["--runs-dir", str(tmp_path / "runs")]
    return ["--store", str(request.getfixturevalue("pg_url"))]


def _ask(url: str, key: str) -> int:
    body = {"model": "vote", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60).status_code


def test_two_gateways_see_a_new_key_share_its_rate_and_refuse_it_once_revoked(
    tmp_path: Path, where: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    loops = _loops(tmp_path, tmp_path / "calls.txt")
    args = ("--loops", str(loops), "--store-keys", *where)
    with served(tmp_path, *args) as (_, one), served(tmp_path, *args) as (_, two):
        made = cli(capsys, "keys", "create", "hana", "--rpm", "2", *where, "--json")
        assert made.code == 0, made.err
        key = made.json["key"]
        # made after both started: each sees it at its next read of the keys (no restart)
        deadline = time.monotonic() + 30
        for url in (one, two):
            while httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401:
                assert time.monotonic() < deadline, "a gateway never saw the new key"
                time.sleep(0.05)
        began = time.monotonic()
        codes = [_ask(url, key) for url in [one, two, one, two, one, two]]
        refill = math.ceil((time.monotonic() - began) * 2 / 60)  # what a minute's rate refilled
        answered = codes.count(200)
        assert 2 <= answered <= 2 + refill, codes  # two a minute, across both processes
        assert set(codes) <= {200, 429}
        assert cli(capsys, "keys", "revoke", "hana", *where).code == 0
        assert _ask(one, key) == 401 and _ask(two, key) == 401  # at once, on both
    shown = cli(capsys, "keys", "show", "hana", *where, "--json").json
    assert shown["refusals"]["rate"] == codes.count(429)
