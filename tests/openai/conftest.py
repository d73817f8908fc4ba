"""Fixtures of the OpenAI backend and served-app tests.

Every server here is one the test starts on 127.0.0.1; the suite's autouse guard
(tests/conftest.py) refuses any connection or name lookup that is not loopback.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from loopback import Loopback
from openai_stub import RawHandler, Stub


@pytest.fixture(params=["asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def loopback() -> Iterator[Callable[[Any], Loopback]]:
    """Start an ASGI app on loopback; stopped when the test ends."""
    started: list[Loopback] = []

    def start(app: Any) -> Loopback:
        server = Loopback(app).__enter__()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def stub_server() -> Iterator[tuple[Stub, str]]:
    """One stub server for the session; `stub` resets it for each test."""
    server = Stub()
    with Loopback(server.app()) as running:
        yield server, running.base_url
        server.release.set()


@pytest.fixture
def stub(stub_server: tuple[Stub, str]) -> Iterator[tuple[Stub, str]]:
    """The stub server, answering as a server honouring `n`, with no requests recorded."""
    server, _ = stub_server
    server.reset()
    yield stub_server
    server.release.set()  # cut short any slow answer still in flight


@pytest.fixture
def raw_server() -> Iterator[Callable[[bytes], str]]:
    """A TCP server that answers any request with raw bytes, then closes the connection."""
    servers: list[tuple[socketserver.TCPServer, threading.Thread]] = []

    def start(payload: bytes) -> str:
        handler = type("Handler", (RawHandler,), {"payload": payload})
        server = socketserver.TCPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(5)
        server.server_close()
