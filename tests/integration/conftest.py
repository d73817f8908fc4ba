"""Fixtures of the integration tests: servers nobody here wrote, started by `make integration`.

`scripts/integration.py` builds llama-cpp-python's server, llama.cpp's `llama-server` and vLLM's
(`scripts/vllm_env.py`), serves SmolLM2 from each on loopback and passes their base URLs in the
variables below (vLLM's tests read theirs in `test_vllm.py`). Without
them (a plain `make test`) every test here is skipped, saying which variable is missing.
"""

from __future__ import annotations

import os

import pytest


def _base_url(variable: str, server: str) -> str:
    url = os.environ.get(variable)
    if not url:
        pytest.skip(
            f"{variable} is not set: `make integration` builds {server}, starts it on loopback and sets it"
        )
    return url


@pytest.fixture(params=["asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """asyncio only: these servers are slow, and tests/openai runs the backend on trio too."""
    return str(request.param)


@pytest.fixture
def llama_cpp_python_url() -> str:
    """`http://127.0.0.1:<port>/v1` of llama-cpp-python's server (`python -m llama_cpp.server`)."""
    return _base_url("LANEFOLD_LLAMA_CPP_PYTHON_URL", "llama-cpp-python's server")


@pytest.fixture
def llama_server_url() -> str:
    """`http://127.0.0.1:<port>/v1` of llama.cpp's `llama-server` (8 slots, prompt cache on)."""
    return _base_url("LANEFOLD_LLAMA_SERVER_URL", "llama.cpp's llama-server")
