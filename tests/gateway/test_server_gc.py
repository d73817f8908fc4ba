"""The server's long-lived objects are frozen out of the garbage collector's sweeps once it is
loaded and listening (`run_server`: `gc.freeze`), so that a full sweep under load walks only
what requests made, not the imports, the app and its backends (a 60-90 ms pause of every
request in flight on the gateway at about 115,000 objects, docs/gateway.md)."""

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

# A server of one route answering with what the collector holds frozen, in its own process (a
# freeze is the process's: made here, it would keep the test session's objects for good).
PROBE = """
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


def test_the_server_freezes_what_it_loaded_and_keeps_no_garbage() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", "import gc; gc.disable()\n" + PROBE],  # no sweep but the server's own
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        reply = httpx.get(f"http://127.0.0.1:{port}/", timeout=60)
        frozen, garbage = map(int, reply.text.split())
        assert frozen > 10_000  # the imports, the app, uvicorn's server: everything loaded
        assert garbage == 0  # the cycles `load` dropped were collected, not frozen for good
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
