"""Loopback servers for the OpenAI tests: uvicorn in a thread, a scriptable stub, raw TCP."""

from __future__ import annotations

import inspect
import json
import socketserver
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanefold.backends.openai import OpenAIBackend, OpenAIConfig, PooledTransport

_TLS = ssl.create_default_context()
# Which test a request belongs to: `Stub.reset` moves it on, `make_backend` stamps it on every
# request. One server serves the session, so a request a test cancelled can reach it after the
# next test began (the server thread is slow under load); the stub answers it and records
# nothing, so each test's record holds its own requests (a cut request once made a test of
# five requests count six).
GENERATION = "x-stub-generation"
_generation = [0]


def make_backend(base_url: str, *, environ: dict[str, str] | None = None, **fields: Any) -> OpenAIBackend:
    """An OpenAIBackend on its own kind of transport (aiohttp's pool on asyncio, httpx's on
    trio) sharing one TLS context: building a context per client loads the CA bundle each
    time, which would dominate these tests' run time."""
    headers = {GENERATION: str(_generation[0]), **fields.pop("headers", {})}
    config = OpenAIConfig(base_url=base_url, **{"model": "m", "headers": headers, **fields})
    transport = PooledTransport(max_connections=config.max_connections, verify=_TLS)
    return OpenAIBackend(config, environ=environ, transport=transport)


class NetworkGuardError(RuntimeError):
    """A test tried to reach something other than loopback."""


@dataclass
class Recorded:
    """One request the stub received."""

    path: str
    body: Any  # the parsed JSON, or the raw text when it was not JSON
    headers: dict[str, str]
    request: Request | None = field(default=None, repr=False, compare=False)

    async def gone(self) -> bool:
        """Whether the client has closed the connection (e.g. cancelled the request)."""
        return self.request is not None and await self.request.is_disconnected()

    @property
    def n(self) -> int:
        return int(self.body.get("n", 1))


Reply = Callable[[Recorded], Response | Awaitable[Response]]


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """A usage object as servers send it."""
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    out["total_tokens"] = prompt + completion
    return out


def choices_body(rec: Recorded, texts: list[str], **extra: Any) -> dict[str, Any]:
    """A 200 body of the API `rec` was sent to, one choice per text, with 1 token per word."""
    chat = rec.path.endswith("/chat/completions")
    choices = []
    for i, text in enumerate(texts):
        words = text.split()
        choice: dict[str, Any] = {"index": i, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if rec.body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": w, "logprob": -0.5} for w in words]}
        else:
            choice["text"] = text
            if rec.body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": words, "token_logprobs": [-0.5] * len(words)}
        choices.append(choice)
    body: dict[str, Any] = {"object": "x", "choices": choices}
    body["usage"] = usage(10, sum(len(t.split()) for t in texts))
    body.update(extra)
    return body


def honour_n(rec: Recorded) -> Response:
    """Answer `n` choices; choice i says which seed and index produced it."""
    texts = [f"seed {rec.body.get('seed')} choice {i}" for i in range(rec.n)]
    return JSONResponse(choices_body(rec, texts))


@dataclass
class Stub:
    """A scriptable OpenAI-compatible server: records requests, answers through `reply`."""

    reply: Reply = honour_n
    requests: list[Recorded] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        """Back to answering as a server honouring `n`, nothing recorded."""
        self.reply = honour_n
        self.requests.clear()
        self.release.clear()
        _generation[0] += 1

    async def hold(self, seconds: float) -> None:
        """Sleep in small steps, cut short when the test ends."""
        end = time.monotonic() + seconds
        # a threading.Event: the test thread sets it, this loop runs in the server thread
        while time.monotonic() < end and not self.release.is_set():  # noqa: ASYNC110
            await anyio.sleep(0.01)

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            raw = (await request.body()).decode()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            rec = Recorded(request.url.path, body, dict(request.headers), request)
            if rec.headers.get(GENERATION, str(_generation[0])) != str(_generation[0]):
                return Response(status_code=409)  # an earlier test's request, cut short there
            self.requests.append(rec)
            out = self.reply(rec)
            return await out if inspect.isawaitable(out) else out

        paths = ("/v1/chat/completions", "/v1/completions")
        return Starlette(routes=[Route(p, endpoint, methods=["POST"]) for p in paths])


class RawHandler(socketserver.StreamRequestHandler):
    payload: bytes = b""

    def handle(self) -> None:
        length = 0
        while line := self.rfile.readline():
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        self.rfile.read(length)  # read it all, so closing sends FIN rather than RST
        self.wfile.write(self.payload)
        self.wfile.flush()
