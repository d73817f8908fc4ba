"""What every served process does once it is loaded and listening (`run_server`, started
through `lanefold.serve.serving_loop` by `serve`, `serve --loops`, its workers and `view`),
each checked in a server of its own process:

- it freezes its long-lived objects out of the garbage collector's sweeps (`gc.freeze`), so
  that a full sweep under load walks only what requests made, not the imports, the app and its
  backends (a 60-90 ms pause of every request in flight on the gateway at about 115,000
  objects, docs/gateway.md);
- it runs on uvloop's event loop where uvloop is installed (the serve extra installs it on
  Linux and macOS), on asyncio's own where it is not: less CPU a gateway request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]

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

async def nothing():
    pass

sock = listen("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
anyio.run(
    lambda: run_server(app, what="probe", host="127.0.0.1", port=0, sock=sock, load=load, aclose=nothing)
)
"""

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

async def nothing():
    pass

sock = listen("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
serving_loop(
    lambda: run_server(app, what="probe", host="127.0.0.1", port=0, sock=sock, load=nothing, aclose=nothing)
)
"""


def _served(code: str, **env: str) -> str:
    """What the one route of the server `code` starts answers, the server then stopped by
    SIGTERM (a clean stop: exit 0)."""
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
        port = int(process.stdout.readline())
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=60).text
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err


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
