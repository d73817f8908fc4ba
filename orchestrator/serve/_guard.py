"""What stands between the open port and the backend: the API key, the body cap, admission
(running, waiting, refused with 429) and the watch for a client that hangs up.

Errors are answered in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lanefold.config import nests_deeper
from lanefold.serve._headers import twice_sent

__all__ = (
    "MAX_JSON_DEPTH",
    "Admission",
    "HTTPError",
    "KeyCheck",
    "ListeningStream",
    "Stopping",
    "error_response",
    "one_authorization",
    "parse_json",
    "read_body",
    "read_json",
    "unless_disconnected",
)

T = TypeVar("T")
# How deep a request's JSON may nest: an OpenAI request nests five or six deep (a message's
# content parts); far deeper is a mistake or an attack, and parsing it would exhaust the stack.
MAX_JSON_DEPTH = 64


class HTTPError(Exception):
    """A request the app refuses, answered in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        """This refusal as a response."""
        return error_response(
            self.status, str(self), kind=self.kind, param=self.param, code=self.code, headers=self.headers
        )


def error_response(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """OpenAI's error body with `status`."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class KeyCheck:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <key>``, else 401.

    The key is compared in constant time and never echoed.
    """

    def __init__(self, app: ASGIApp, *, key: str) -> None:
        self.app = app
        self._key = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [value for name, value in scope["headers"] if name.lower() == b"authorization"]
            try:
                sent = one_authorization(headers, b"")
            except HTTPError as twice:
                await twice.response()(scope, receive, send)
                return
            if not secrets.compare_digest(sent, self._key):
                refusal = HTTPError(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def one_authorization(sent: Sequence[T], empty: T) -> T:
    """The one `Authorization` header of a request (`empty` where none); two or more are
    refused (400, `twice_sent`) rather than one of them read. Never echoed."""
    refusal = twice_sent(sent)
    if refusal is not None:
        raise HTTPError(400, refusal, param="Authorization")
    return sent[0] if sent else empty


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as JSON, read chunk by chunk and refused (413) the moment it passes
    `max_bytes`, so an oversized body is never held whole."""
    return parse_json(await read_body(request, max_bytes))


def parse_json(body: bytes) -> Any:
    """A request body as JSON; 400 for one that is not JSON, or nests past `MAX_JSON_DEPTH`
    (measured before the parser, which recurses per level, sees it)."""
    if nests_deeper(body, MAX_JSON_DEPTH):
        raise HTTPError(400, f"the request body's JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(body)
    except ValueError:
        raise HTTPError(400, "the request body is not valid JSON") from None


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body's bytes, refused (413) the moment they pass `max_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> HTTPError:
    # Connection: close, so the server hangs up instead of draining the rest of the body.
    return HTTPError(
        413,
        f"the request body is larger than this server's {max_bytes} bytes (--max-body-bytes)",
        code="request_too_large",
        headers={"Connection": "close"},
    )


@dataclass(slots=True, eq=False)
class _Waiter:
    lanes: int
    admitted: anyio.Event


class Admission:
    """Requests on the backend at once, counted in lanes, up to `capacity` (the backend's batch);
    beyond it a request waits its turn in arrival order, and beyond `max_waiting` waiting ones
    it is refused with 429 and Retry-After. `capacity = None`: every request runs at once."""

    def __init__(self, capacity: int | None, max_waiting: int | None, retry_after: float = 1.0) -> None:
        self.capacity, self.max_waiting, self.retry_after = capacity, max_waiting, retry_after
        self.running = 0  # lanes admitted
        self._queue: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting their turn."""
        return len(self._queue)

    @contextlib.asynccontextmanager
    async def admit(self, lanes: int) -> AsyncIterator[None]:
        """Hold `lanes` of the capacity while the block runs (waiting first where it is full)."""
        if self.capacity is None:
            yield
            return
        lanes = max(1, min(lanes, self.capacity))  # a request larger than a batch goes in turns
        if not self._queue and self.running + lanes <= self.capacity:
            self.running += lanes
        else:
            if self.max_waiting is not None and len(self._queue) >= self.max_waiting:
                raise HTTPError(
                    429,
                    f"the server is busy ({self.running} lanes running, {len(self._queue)} "
                    "requests waiting); retry later",
                    kind="rate_limit_error",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(math.ceil(self.retry_after))},
                )
            waiter = _Waiter(lanes, anyio.Event())
            self._queue.append(waiter)
            try:
                await waiter.admitted.wait()
            except BaseException:  # cancelled while waiting, or just as it was admitted
                if waiter.admitted.is_set():
                    self._release(lanes)
                else:
                    self._queue.remove(waiter)
                    self._release(0)
                raise
        try:
            yield
        finally:
            self._release(lanes)

    def _release(self, lanes: int) -> None:
        assert self.capacity is not None
        self.running -= lanes
        while self._queue and self.running + self._queue[0].lanes <= self.capacity:
            waiter = self._queue.popleft()
            self.running += waiter.lanes
            waiter.admitted.set()


class Stopping:
    """The server's stop: every request's work registers its cancel scope here, and `stop`
    cancels them all, so a Ctrl-C ends requests in flight at once instead of waiting them out."""

    def __init__(self) -> None:
        self.stopped = False
        self._scopes: set[anyio.CancelScope] = set()

    @contextlib.contextmanager
    def watching(self, scope: anyio.CancelScope) -> Iterator[None]:
        """Cancel `scope` on `stop` (at once if already stopped) while the block runs."""
        if self.stopped:
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)

    def stop(self) -> None:
        """Cancel every request's work, now and from now on."""
        self.stopped = True
        for scope in list(self._scopes):
            scope.cancel()


def _shutting_down() -> HTTPError:
    return HTTPError(503, "the server is shutting down", kind="server_error", code="server_shutting_down")


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(
    request: Request, stopping: Stopping, work: Callable[[], Awaitable[T]]
) -> T | None:
    """`work()`, cancelled the moment the client hangs up (then None): a request nobody waits
    for stops using the backend. A server stop cancels it too (503). Call it once the body has
    been read."""
    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await _until_disconnected(request.receive)
            tg.cancel_scope.cancel()

        with stopping.watching(tg.cancel_scope):
            tg.start_soon(watch)
            try:
                outcome.append(await work())
            except Exception as exc:  # raised below, outside the task group's exception group
                failure.append(exc)
            tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not outcome and stopping.stopped:
        raise _shutting_down()
    return outcome[0] if outcome else None


class ListeningStream(StreamingResponse):
    """A StreamingResponse that stops its body (closing the generator, which cancels the
    backend's work) the moment the client hangs up, whatever ASGI version the server speaks;
    Starlette's own waits for the next chunk's send to fail under ASGI 2.4. A server stop ends
    the stream with an error event and `[DONE]`."""

    def __init__(self, content: AsyncIterator[str], stopping: Stopping, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started: list[bool] = []
        finished: list[bool] = []
        gone: list[bool] = []

        async def sending(message: Message) -> None:
            started.append(True)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finished.append(True)

        with anyio.CancelScope() as stop, self.stopping.watching(stop):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._respond, sending, tg.cancel_scope)
                await _until_disconnected(receive)
                gone.append(True)
                tg.cancel_scope.cancel()
        if self.stopping.stopped and not gone and not finished:
            error = _shutting_down()
            event = {
                "error": {
                    "message": str(error),
                    "type": error.kind,
                    "param": None,
                    "code": error.code,
                    "status": error.status,
                }
            }
            if not started:
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
            with contextlib.suppress(OSError):
                body = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
                await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _respond(self, send: Send, done: anyio.CancelScope) -> None:
        try:
            with contextlib.suppress(OSError):  # the client left mid-send
                await self.stream_response(send)
        finally:  # a body cut off between chunks is closed here, not by the GC
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()
        done.cancel()
