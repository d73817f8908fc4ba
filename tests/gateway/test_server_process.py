"""What every served process does once it is loaded and listening (`run_server`, started
through `lanefold.serve.serving_loop` by `serve`, `serve --loops`, its workers and `view`),
each checked in a server of its own process:

- it freezes its long-lived objects out of the garbage collector's sweeps (`gc.freeze`), so
  that a full sweep under load walks only what requests made, not the imports, the app and its
  backends (a 60-90 ms pause of every request in flight on the gateway at about 115,000
  objects, docs/gateway.md);
- it runs on uvloop's event loop where uvloop is installed (the serve extra installs it on
  Linux and macOS), on asyncio's own where it is not: less CPU a gateway request;
- it marks each request it serves (`serving`), so that a request alone in flight makes its
  store calls on the loop (`offload`), and requests in flight together in worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]

# Each server's end: it binds a port, prints it, and serves `app` through `run_server` (started
# by `run`, loading with `load`) until SIGTERM.
SERVED = """
async def nothing():
    pass

sock = listen("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
{run}(
    lambda: run_server(app, what="probe", host="127.0.0.1", port=0, sock=sock, load={load}, aclose=nothing)
)
"""

# A server of one route answering with what the collector holds frozen (a freeze is the
# process's: made here, it would keep the test session's objects for good).
FREEZE = """
import gc, weakref, anyio
from lanefold.serve._run import listen, run_server

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    frozen = gc.get_freeze_count()
    garbage = sum(1 for made in dropped if made() is not None)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": f"{frozen} {garbage}".encode()})

class Cycle:  # garbage made while loading: collected before the freeze, never kept by it
    def __init__(self):
        self.me = self

dropped = []

async def load():
    dropped.extend(weakref.ref(Cycle()) for _ in range(100))
""" + SERVED.format(run="anyio.run", load="load")

# A server of one route answering with the module of the event loop it runs on (`BLOCK` set:
# uvloop cannot be imported there, as on a platform without it).
LOOP = """
import asyncio, os, sys
if os.environ.get("BLOCK"):
    sys.modules["uvloop"] = None  # an import of it raises ImportError
from lanefold.serve import listen, serving_loop
from lanefold.serve._run import run_server

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": type(asyncio.get_running_loop()).__module__.encode()})
""" + SERVED.format(run="serving_loop", load="nothing")

# A server answering where `offload` made its call: "loop" or "thread"; `/two` waits for a
# second request to `/two` before its call, so that two are in flight together.
OFFLOAD = """
import threading, anyio
from lanefold.primitives import offload
from lanefold.serve._run import listen, run_server

arrived, both = [], None

async def app(scope, receive, send):
    global both
    if scope["type"] != "http":
        return
    if scope["path"] == "/two":
        both = both or anyio.Event()
        arrived.append(None)
        if len(arrived) == 2:
            both.set()
        await both.wait()
    here = threading.get_ident()
    where = "loop" if await offload(threading.get_ident) == here else "thread"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": where.encode()})
""" + SERVED.format(run="anyio.run", load="nothing")


@contextlib.contextmanager
def _server(code: str, **env: str) -> Iterator[str]:
    """The base URL of the server `code` starts, stopped by SIGTERM after the block (a clean
    stop: exit 0)."""
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield f"http://127.0.0.1:{int(process.stdout.readline())}"
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err


def _served(code: str, **env: str) -> str:
    """What the one route of the server `code` starts answers."""
    with _server(code, **env) as url:
        return httpx.get(f"{url}/", timeout=60).text


def test_the_server_freezes_what_it_loaded_and_keeps_no_garbage() -> None:
    reply = _served("import gc; gc.disable()\n" + FREEZE)  # no sweep but the server's own
    frozen, garbage = map(int, reply.split())
    assert frozen > 10_000  # the imports, the app, uvicorn's server: everything loaded
    assert garbage == 0  # the cycles `load` dropped were collected, not frozen for good


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")
def test_a_server_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")  # the serve extra's on this platform: `make test` installs it
    assert _served(LOOP, BLOCK="").startswith("uvloop")


def test_a_server_runs_on_asyncios_loop_without_uvloop() -> None:
    assert _served(LOOP, BLOCK="1").startswith("asyncio")


def test_a_lone_request_makes_its_store_calls_on_the_loop_and_requests_together_in_threads() -> None:
    with _server(OFFLOAD) as url:
        assert httpx.get(f"{url}/one", timeout=60).text == "loop"

        async def two() -> list[str]:
            async with httpx.AsyncClient(timeout=60) as client:
                replies = await asyncio.gather(client.get(f"{url}/two"), client.get(f"{url}/two"))
            return [reply.text for reply in replies]

        assert asyncio.run(two()) == ["thread", "thread"]
        assert httpx.get(f"{url}/one", timeout=60).text == "loop"  # both counted out
