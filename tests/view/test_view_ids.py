"""The view's answers to ids that cannot be a run's or an eval's (issue 38): 400 naming the id's
rule, never the 503 a store failure gets (the page and the live feed used to answer 503, or
422 as if a log were corrupt); an id that could be one but is not there, 404. Two
`Authorization` headers are refused, not one of them read."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from lanefold.execution import open_store
from lanefold.view._app import create_app

MALFORMED = {
    "space": "bad%20id!",
    "too long": "x" * 300,
    "encoded dots": "%2E%2E",
    "nul": "a%00b",
}


def _client(runs: Path, **options: str) -> TestClient:
    return TestClient(create_app(open_store(None, runs), **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize(
    "page", ["/runs/", "/live/runs/", "/evals/", "/live/evals/", "/compares/", "/sweeps/"]
)
def test_a_malformed_id_is_400_naming_the_rule(tmp_path: Path, page: str, raw: str) -> None:
    r = _client(tmp_path / "runs").get(page + raw)
    assert r.status_code == 400, (r.status_code, r.text[-300:])
    assert "is not a plain name" in r.text


@pytest.mark.parametrize(
    "page", ["/runs/", "/live/runs/", "/evals/", "/live/evals/", "/compares/", "/sweeps/"]
)
def test_an_id_that_is_not_there_is_404(tmp_path: Path, page: str) -> None:
    client = _client(tmp_path / "runs")
    assert client.get(page + "20260101-000000-abcdef").status_code == 404
    assert client.get(page + "a%2Fb").status_code == 404  # a path no page has


def test_two_authorization_headers_are_refused(tmp_path: Path) -> None:
    client = _client(tmp_path / "runs", api_key="sesame")
    assert client.get("/", headers={"Authorization": "Bearer sesame"}).status_code == 200
    twice = [("Authorization", "Bearer wrong"), ("Authorization", "Bearer sesame")]
    for headers in (twice, list(reversed(twice))):
        r = client.get("/", headers=headers)
        assert r.status_code == 400
        assert "Authorization: sent 2 times; send one" in r.text and "sesame" not in r.text
