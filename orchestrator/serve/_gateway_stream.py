"""The loop gateway's streams: a run as server-sent events while its lanes land, and a
recorded run replayed as the end of one."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from lanefold.execution import RunResult
from lanefold.primitives import LanefoldError, RunState
from lanefold.primitives.events import AnyEvent, LaneCompleted, LaneDispatched, LaneFailed
from lanefold.serve._gateway_reply import NoAnswer, response_body
from lanefold.serve._gateway_wire import Ask, Go, refused
from lanefold.serve._guard import HTTPError, Stopping

__all__ = ("LoopStream", "Replay")


def _chunk(body: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
    kind = "chat.completion.chunk" if body["object"] == "chat.completion" else "text_completion"
    chunk: dict[str, Any] = {
        "id": body["id"],
        "object": kind,
        "created": body["created"],
        "model": body["model"],
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
        chunk["lanefold"] = body["lanefold"]
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _closing_frames(body: dict[str, Any]) -> list[bytes]:
    """The content, each choice's finish, the usage chunk and `[DONE]`."""
    frames = []
    chat = body["object"] == "chat.completion"
    for choice in body["choices"]:
        i = choice["index"]
        if chat:
            message = choice["message"]
            # a call as OpenAI streams one: its id, name and arguments in an indexed delta
            calls = [{"index": n, **call} for n, call in enumerate(message.get("tool_calls") or ())]
            delta = {"tool_calls": calls} if calls else {"content": message["content"]}
            frames.append(_chunk(body, [{"index": i, "delta": delta, "finish_reason": None}]))
            frames.append(_chunk(body, [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}]))
        else:
            frames.append(_chunk(body, [{"index": i, "text": choice["text"], "finish_reason": None}]))
            frames.append(_chunk(body, [{"index": i, "text": "", "finish_reason": choice["finish_reason"]}]))
    frames.append(_chunk(body, [], body["usage"]))
    frames.append(b"data: [DONE]\n\n")
    return frames


def _error_frame(exc: HTTPError) -> bytes:
    """A failure once the stream has begun: an event the SDKs raise as an APIError with its
    `code` (a run without an answer: `no_answer`, the reply's `lanefold` object beside)."""
    error = (
        exc.error()
        if isinstance(exc, NoAnswer)
        else {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}
    )
    return f"data: {json.dumps({'error': error})}\n\n".encode()


def _opening(ask: Ask, run_id: str, created: int) -> bytes:
    kind = "chat.completion.chunk" if ask.kind == "chat.completion" else "text_completion"
    prefix = "chatcmpl" if ask.kind == "chat.completion" else "cmpl"
    choices = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        if ask.kind == "chat.completion"
        else {"index": i, "text": "", "finish_reason": None}
        for i in range(ask.options.n)
    ]
    chunk = {
        "id": f"{prefix}-{run_id}",
        "object": kind,
        "created": created,
        "model": ask.loop,
        "choices": choices,
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _start(headers: dict[str, str]) -> dict[str, Any]:
    """The response start of a stream: the event stream's own headers, then the answer's
    (`answer_headers`: the run's id, the request's, what the key has left)."""
    sent = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return {"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *sent]}


class Replay(Response):
    """A recorded response, streamed as a live one would have ended."""

    def __init__(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__()
        self.recorded, self.answer_headers = body, headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(_start(self.answer_headers))
        frames = [
            _chunk(self.recorded, [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
        ]
        if self.recorded["object"] != "chat.completion":
            frames = []
        for frame in [*frames, *_closing_frames(self.recorded)]:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class LoopStream(Response):
    """A loop's run as server-sent events: the role chunk as soon as the first lane is
    dispatched (its wave funded: a run refused before that, by a key's budget or anything else,
    is an ordinary error response with its own status), a comment line as each lane lands (and
    a heartbeat between), then the answer, the usage chunk and `[DONE]`. The client hanging up
    cancels the run, which records its interrupt (resumable); a server stop too."""

    def __init__(
        self,
        go: Go,
        run: Callable[[Go, Callable[[AnyEvent], None] | None], Awaitable[tuple[RunResult, RunState | None]]],
        stopping: Stopping,
        clock: Callable[[], float],
        heartbeat_s: float,
        headers: dict[str, str],
    ) -> None:
        super().__init__()
        self.go, self.run, self.stopping, self.clock, self.heartbeat_s = go, run, stopping, clock, heartbeat_s
        self.answer_headers = headers  # the plain answer's (`answer_headers`), sent with the start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        go = self.go
        created = int(self.clock())
        landed_send, landed = anyio.create_memory_object_stream[str](math.inf)
        going = anyio.Event()  # the first lane is dispatched, or the run is over

        def observe(event: AnyEvent) -> None:
            if isinstance(event, LaneDispatched):
                going.set()
            elif isinstance(event, LaneCompleted | LaneFailed):
                state = "landed" if isinstance(event, LaneCompleted) else "failed"
                landed_send.send_nowait(f": lane {event.wave}.{event.lane} {state}\n\n")

        outcome: list[tuple[RunResult, RunState | None] | HTTPError] = []

        async def work() -> None:
            try:
                outcome.append(await self.run(go, observe))
            except HTTPError as exc:
                outcome.append(exc)
            except LanefoldError as exc:
                outcome.append(refused(exc))
            finally:
                landed_send.close()
                going.set()

        async def watch(scope_: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    scope_.cancel()
                    return

        async with anyio.create_task_group() as tg:
            with self.stopping.watching(tg.cancel_scope):
                tg.start_soon(watch, tg.cancel_scope)
                tg.start_soon(work)
                await going.wait()
                if outcome and isinstance(outcome[0], HTTPError):  # refused before any lane went
                    landed.close()
                    await outcome[0].response()(scope, receive, send)
                    tg.cancel_scope.cancel()
                    return
                await send(_start(self.answer_headers))
                opening = _opening(go.ask, go.run_id, created)
                await send({"type": "http.response.body", "body": opening, "more_body": True})
                async with landed:
                    while True:
                        with anyio.move_on_after(self.heartbeat_s) as beat:
                            try:
                                line = await landed.receive()
                            except anyio.EndOfStream:
                                break
                        if beat.cancelled_caught:
                            line = ": running\n\n"
                        await send({"type": "http.response.body", "body": line.encode(), "more_body": True})
                if outcome:
                    got = outcome[0]
                    try:
                        if isinstance(got, HTTPError):
                            raise got
                        frames = _closing_frames(response_body(go.ask, *got, created))
                    except HTTPError as exc:
                        frames = [_error_frame(exc), b"data: [DONE]\n\n"]
                    for frame in frames:
                        await send({"type": "http.response.body", "body": frame, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
