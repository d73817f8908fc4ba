"""Any lanefold Backend served over HTTP as an OpenAI-compatible API.

`/v1/models`, `/v1/completions` and `/v1/chat/completions`. A request's `n` becomes ONE
SampleRequest of `n` lanes with `share_prefix=True`, so a prefix-sharing backend (the bundled
engine) prefills the prompt once and forks it; lane i samples with `seed + i`. Errors use
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``; a library BackendError
maps back to the status a client's OpenAI backend maps to the same error class.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator._serve_wire import ChatBody, CompletionBody, flatten_messages
from primitives import (
    AuthenticationError,
    Backend,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    ConfigError,
    ContextLengthError,
    LanefoldError,
    LaneRequest,
    RateLimitError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    StreamingBackend,
    TextDelta,
    Usage,
    sample_all,
)

__all__ = ("create_app", "serve", "serve_async")

_Body = TypeVar("_Body", bound=BaseModel)
_Item = TypeVar("_Item")

# BackendError class -> (status, OpenAI error type, code); first match in MRO order wins.
_BACKEND_STATUS: dict[type[BackendError], tuple[int, str, str | None]] = {
    RateLimitError: (429, "rate_limit_error", "rate_limit_exceeded"),
    ContextLengthError: (400, "invalid_request_error", "context_length_exceeded"),
    RequestRejectedError: (400, "invalid_request_error", None),
    # The backend's own credentials failed: not the client's fault, so not a 401.
    AuthenticationError: (502, "server_error", "upstream_authentication_failed"),
    BackendTimeoutError: (504, "server_error", "timeout"),
    BadResponseError: (502, "server_error", "bad_upstream_response"),
    ServerError: (503, "server_error", None),
    BackendError: (500, "server_error", None),
}


class _HTTPError(Exception):
    """A request the app refuses, answered in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


def _error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, _HTTPError)
    return _error(exc.status, str(exc), param=exc.param, code=exc.code)


@dataclass(frozen=True, slots=True)
class _Told:
    """What a client is told of a failure: a backend's or a config's own words, else nothing
    internal."""

    status: int
    message: str
    kind: str
    code: str | None = None
    headers: dict[str, str] | None = None


def _told(exc: Exception) -> _Told:
    if isinstance(exc, ConfigError):
        return _Told(400, str(exc), "invalid_request_error")
    if isinstance(exc, BackendError):
        cls = next(c for c in type(exc).__mro__ if c in _BACKEND_STATUS)
        status, kind, code = _BACKEND_STATUS[cls]
        headers = None
        if exc.retry_after is not None:
            headers = {"Retry-After": str(math.ceil(exc.retry_after))}
        return _Told(status, str(exc), kind, code, headers)
    if isinstance(exc, LanefoldError):
        return _Told(500, "the run failed", "server_error")
    return _Told(500, "internal server error", "server_error")


async def _on_error(request: Request, exc: Exception) -> JSONResponse:
    told = _told(exc)
    return _error(told.status, told.message, kind=told.kind, code=told.code, headers=told.headers)


async def _parse(request: Request, model: type[_Body]) -> _Body:
    try:
        data = json.loads(await request.body())
    except ValueError:
        raise _HTTPError(400, "the request body is not valid JSON") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise _HTTPError(400, f"{param}: {first['msg']}", param=param) from None


def _whole_lanes(request: SampleRequest, outcomes: Sequence[Sample | BackendError]) -> list[Sample]:
    """A backend's outcomes as one Sample per lane of `request`; a failed lane fails them all."""
    if len(outcomes) != len(request.lanes):
        raise BadResponseError(f"{len(outcomes)} outcomes for {len(request.lanes)} lanes")
    got: list[Sample] = []
    for outcome in outcomes:
        if isinstance(outcome, BackendError):
            raise outcome
        got.append(outcome)
    return got


def _bill(samples: list[Sample]) -> Usage:
    """One backend request's usage: its first lane's prompt, every lane's output."""
    first = min(samples, key=lambda s: s.lane).usage
    output = sum(s.usage.output_tokens for s in samples)
    return Usage(first.input_tokens, first.cached_input_tokens, output)


def _usage_body(billed: Usage) -> dict[str, Any]:
    prompt_tokens = billed.input_tokens + billed.cached_input_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": billed.output_tokens,
        "total_tokens": prompt_tokens + billed.output_tokens,
        "prompt_tokens_details": {"cached_tokens": billed.cached_input_tokens},
    }


def _stream_of(backend: Backend, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
    """`backend.stream(request)`, or each lane's whole text as one delta once every lane of
    `backend.sample(request)` has landed."""
    if isinstance(backend, StreamingBackend):
        return backend.stream(request)
    return _all_at_once(backend, request)


async def _all_at_once(backend: Backend, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
    # Collected whole, not relayed lane by lane: `sample`'s caller may do only synchronous work
    # between lanes and must close it in its own task, and a response stream awaits the client
    # between chunks and is read by another task than the one that opened it.
    for sample in _whole_lanes(request, await sample_all(backend, request)):
        if sample.text:
            yield TextDelta(sample.lane, sample.text)
        yield sample


@contextlib.asynccontextmanager
async def _closing(
    iterator: AsyncIterator[_Item],
) -> AsyncIterator[AsyncIterator[_Item]]:
    """Close an async generator on the way out (an early exit cancels what it was doing)."""
    try:
        yield iterator
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()


def create_app(
    backend: Backend,
    *,
    model_name: str,
    default_max_tokens: int = 256,
    max_n: int = 128,
    clock: Callable[[], float] = time.time,
    seed_source: Callable[[], int] | None = None,
) -> Starlette:
    """An ASGI app serving `backend` as the model `model_name`.

    The caller owns `backend` (the app never closes it). `seed_source` draws the seed of a
    request that sends none.
    """
    draw_seed = seed_source or (lambda: secrets.randbelow(2**31))

    def plan(
        body: ChatBody | CompletionBody, prompt: str, max_tokens: int | None, logprobs: bool
    ) -> list[SampleRequest]:
        """The backend requests answering `body`: its `n` lanes, at most a backend's worth each."""
        if body.model is not None and body.model != model_name:
            raise _HTTPError(
                404, f"model {body.model!r} not found", param="model", code="model_not_found"
            )
        if body.stream_options is not None and not body.stream:
            raise _HTTPError(
                400, "stream_options is only allowed with stream", param="stream_options"
            )
        if body.n > max_n:
            raise _HTTPError(400, f"n may be at most {max_n}", param="n")
        ceiling = max_tokens or default_max_tokens
        seed = draw_seed() if body.seed is None else body.seed
        params = SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=max(body.top_k, 0),
            max_tokens=ceiling,
            stop=body.stops(),
            logprobs=logprobs,
            ignore_eos=body.ignore_eos,
        )
        lanes = [LaneRequest(lane=i, seed=seed + i, max_tokens=ceiling) for i in range(body.n)]
        step = backend.max_lanes_per_request or body.n
        return [
            SampleRequest(prompt, params, tuple(lanes[i : i + step]), share_prefix=True)
            for i in range(0, body.n, step)
        ]

    async def sample(requests: list[SampleRequest]) -> tuple[list[Sample], dict[str, Any]]:
        samples: list[Sample] = []
        billed = Usage()
        for request in requests:
            got = _whole_lanes(request, await sample_all(backend, request))
            billed += _bill(got)
            samples += got
        return samples, _usage_body(billed)

    async def items(
        requests: list[SampleRequest], billed: list[Usage]
    ) -> AsyncGenerator[TextDelta | Sample, None]:
        """Every request's deltas and samples in turn; each request's bill lands in `billed`."""
        for request in requests:
            got: list[Sample] = []
            async with _closing(_stream_of(backend, request)) as stream:
                async for item in stream:
                    if isinstance(item, Sample):
                        got.append(item)
                    yield item
            billed.append(_bill(_whole_lanes(request, got)))

    async def streamed(
        body: ChatBody | CompletionBody,
        requests: list[SampleRequest],
        kind: str,
        prefix: str,
        delta: Callable[[int, str], dict[str, Any]],
        final: Callable[[Sample], dict[str, Any]],
        opening: list[dict[str, Any]],
    ) -> StreamingResponse:
        """Server-sent events: a chunk per delta, one closing each choice, usage, `[DONE]`."""
        rid, created = f"{prefix}-{uuid.uuid4().hex}", int(clock())
        with_usage = body.stream_options is not None and body.stream_options.include_usage
        billed: list[Usage] = []
        source = items(requests, billed)
        try:  # the first item before the status line: an early error keeps its own status
            first: TextDelta | Sample | None = await anext(source)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await source.aclose()
            raise

        def frame(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
            chunk: dict[str, Any] = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": choices,
            }
            if with_usage:
                chunk["usage"] = usage
            return f"data: {json.dumps(chunk)}\n\n"

        def render(item: TextDelta | Sample) -> str:
            if isinstance(item, TextDelta):
                return frame([delta(item.lane, item.text)])
            return frame([final(item)])

        async def events() -> AsyncIterator[str]:
            async with _closing(source):
                if opening:
                    yield frame(opening)
                try:
                    if first is not None:
                        yield render(first)
                    async for item in source:
                        yield render(item)
                except Exception as exc:  # the status line has gone: report it in-band
                    told = _told(exc)
                    error = {"message": told.message, "type": told.kind, "param": None,
                             "code": told.code, "status": told.status}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
            if with_usage:
                yield frame([], _usage_body(sum(billed, Usage())))
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def envelope(
        kind: str, prefix: str, choices: list[dict[str, Any]], usage: dict[str, Any]
    ) -> JSONResponse:
        return JSONResponse(
            {
                "id": f"{prefix}-{uuid.uuid4().hex}",
                "object": kind,
                "created": int(clock()),
                "model": model_name,
                "choices": choices,
                "usage": usage,
            }
        )

    async def models(request: Request) -> JSONResponse:
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "lanefold"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionBody)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise _HTTPError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        requests = plan(body, prompt, body.max_tokens, body.logprobs is not None)

        def choice(index: int, text: str, sample: Sample | None) -> dict[str, Any]:
            logprobs = None if sample is None else sample.logprobs
            return {
                "index": index,
                "text": text,
                "finish_reason": None if sample is None else sample.finish_reason,
                # Sample carries the values, not the token strings, so only these are sent.
                "logprobs": None if logprobs is None else {"token_logprobs": list(logprobs)},
            }

        if body.stream:
            return await streamed(
                body,
                requests,
                "text_completion",
                "cmpl",
                lambda lane, text: choice(lane, text, None),
                lambda s: choice(s.lane, "", s),
                [],
            )
        samples, usage = await sample(requests)
        choices = [choice(i, s.text, s) for i, s in enumerate(samples)]
        return envelope("text_completion", "cmpl", choices, usage)

    async def chat(request: Request) -> Response:
        body = await _parse(request, ChatBody)
        prompt = flatten_messages([(m.role, m.text()) for m in body.messages])
        ceiling = body.max_completion_tokens or body.max_tokens
        requests = plan(body, prompt, ceiling, body.logprobs)

        def logprobs_of(sample: Sample) -> dict[str, Any] | None:
            if sample.logprobs is None:
                return None
            return {"content": [{"logprob": v} for v in sample.logprobs]}

        if body.stream:
            return await streamed(
                body,
                requests,
                "chat.completion.chunk",
                "chatcmpl",
                lambda lane, text: {
                    "index": lane,
                    "delta": {"content": text},
                    "logprobs": None,
                    "finish_reason": None,
                },
                lambda s: {
                    "index": s.lane,
                    "delta": {},
                    "logprobs": logprobs_of(s),
                    "finish_reason": s.finish_reason,
                },
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(body.n)
                ],
            )
        samples, usage = await sample(requests)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": s.text},
                "finish_reason": s.finish_reason,
                "logprobs": logprobs_of(s),
            }
            for i, s in enumerate(samples)
        ]
        return envelope("chat.completion", "chatcmpl", choices, usage)

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        exception_handlers={
            _HTTPError: _on_http_error,
            LanefoldError: _on_error,  # answered in place
            Exception: _on_error,  # answered, then re-raised by starlette to be logged
        },
    )


async def serve_async(
    backend: Backend,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
) -> None:
    """Serve `backend` with uvicorn until interrupted, then close the backend."""
    import uvicorn  # the `serve` extra; imported here so the package loads without it

    app = create_app(backend, model_name=model_name)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")
    try:
        await uvicorn.Server(config).serve()
    finally:
        with anyio.CancelScope(shield=True):  # Ctrl-C cancels the task; still close
            await backend.aclose()


def serve(
    backend: Backend,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
) -> None:
    """Blocking: serve `backend` on `host:port` (loopback by default) until Ctrl-C."""
    try:
        anyio.run(
            lambda: serve_async(
                backend, model_name=model_name, host=host, port=port, log_level=log_level
            ),
            backend="asyncio",  # uvicorn runs on asyncio only
        )
    except KeyboardInterrupt:
        pass  # uvicorn shuts down gracefully, then re-raises the signal it captured
