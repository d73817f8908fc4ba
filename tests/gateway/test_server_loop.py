"""Every served process runs on uvloop's event loop where uvloop is installed (the serve
extra installs it on Linux and macOS), on asyncio's own where it is not
(`lanefold.serve.serving_loop`, the one entry of `serve`, `serve --loops`, its workers and
`view`): less CPU a gateway request (docs/gateway.md)."""

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

# A server of one route answering with the module of the event loop it runs on, in its own
# process (`BLOCK` set: uvloop cannot be imported there, as on a platform without it).
PROBE = """
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


def _served_on(block: bool) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCK": "1" if block else ""}
    process = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
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


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build")
def test_a_server_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")  # the serve extra's on this platform: `make test` installs it
    assert _served_on(block=False).startswith("uvloop")


def test_a_server_runs_on_asyncios_loop_without_uvloop() -> None:
    assert _served_on(block=True).startswith("asyncio")
