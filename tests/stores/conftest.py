"""Every registered store, opened for a test: `opened` gives the store and the command-line
flags that name it; `store` the store alone. A store registered without an opener here fails
the suites that use them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lanefold.execution._store import open_store
from lanefold.primitives import STORES, Store


def _files(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, list[str]]:
    return open_store(None, tmp_path / "runs"), ["--runs-dir", str(tmp_path / "runs")]


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, list[str]]:
    url = str(request.getfixturevalue("pg_url"))
    return open_store(url), ["--store", url]


# How the suite opens each registered store, and the flags that name it on the command line.
OPENERS: dict[str, Callable[[pytest.FixtureRequest, Path], tuple[Store, list[str]]]] = {
    "files": _files,
    "postgres": _postgres,
}


@pytest.fixture(params=STORES.names())
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, list[str]]:
    opener = OPENERS.get(request.param)
    if opener is None:
        pytest.fail(f"store {request.param!r} is registered but has no opener in the conformance suite")
    return opener(request, tmp_path)


@pytest.fixture
def store(opened: tuple[Store, list[str]]) -> Store:
    return opened[0]
