"""Every registered store, opened for a test: `opened` (tests/conftest.py) gives the store and
the command-line flags that name it; `store` the store alone."""

from __future__ import annotations

import pytest

from lanefold.primitives import Store


@pytest.fixture
def store(opened: tuple[Store, list[str]]) -> Store:
    return opened[0]
