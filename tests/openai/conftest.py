"""Fixtures of the OpenAI backend and served-app tests.

Every server here is one the test starts on 127.0.0.1, and an autouse guard refuses any
connection or name lookup that is not loopback, so a test can never reach the network.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openai_stub import Loopback, NetworkGuardError, RawHandler, Stub

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@pytest.fixture(params=["asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every connect and name lookup that is not loopback."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK_HOSTS:
            raise NetworkGuardError(f"test tried to connect to {address[0]}")

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in _LOOPBACK_HOSTS:
            raise NetworkGuardError(f"test tried to resolve {name}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(proxy, raising=False)


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
