"""Any lanefold Backend served over HTTP as an OpenAI-compatible API.

`/v1/models`, `/v1/completions` and `/v1/chat/completions`. A request's `n` becomes ONE
SampleRequest of `n` lanes with `share_prefix=True`, so a prefix-sharing backend (the bundled
engine) prefills the prompt once and forks it; lane i samples with `seed + i`. Errors use
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``; a library BackendError
maps back to the status a client's OpenAI backend maps to the same error class.
"""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
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
    Usage,
)

__all__ = ("create_app", "serve", "serve_async")

_Body = TypeVar("_Body", bound=BaseModel)

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


async def _on_library_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, ConfigError):
        return _error(400, str(exc))
    if not isinstance(exc, BackendError):
        return _error(500, "the run failed", kind="server_error")
    cls = next(c for c in type(exc).__mro__ if c in _BACKEND_STATUS)
    status, kind, code = _BACKEND_STATUS[cls]
    headers = None
    if exc.retry_after is not None:
        headers = {"Retry-After": str(math.ceil(exc.retry_after))}
    return _error(status, str(exc), kind=kind, code=code, headers=headers)


async def _on_crash(request: Request, exc: Exception) -> JSONResponse:
    return _error(500, "internal server error", kind="server_error")


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

    async def sample(
        body: ChatBody | CompletionBody, prompt: str, max_tokens: int | None, logprobs: bool
    ) -> tuple[list[Sample], dict[str, Any]]:
        if body.model is not None and body.model != model_name:
            raise _HTTPError(
                404, f"model {body.model!r} not found", param="model", code="model_not_found"
            )
        if body.stream:
            raise _HTTPError(400, "streaming is not supported", param="stream")
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
        samples: list[Sample] = []
        billed = Usage()  # per backend request: its first lane's prompt, every lane's output
        for start in range(0, body.n, step):
            chunk = tuple(lanes[start : start + step])
            outcomes = await backend.sample(SampleRequest(prompt, params, chunk, share_prefix=True))
            if len(outcomes) != len(chunk):
                raise BadResponseError(f"{len(outcomes)} outcomes for {len(chunk)} lanes")
            got: list[Sample] = []
            for outcome in outcomes:
                if isinstance(outcome, BackendError):
                    raise outcome
                got.append(outcome)
            first = got[0].usage
            output = sum(s.usage.output_tokens for s in got)
            billed += Usage(first.input_tokens, first.cached_input_tokens, output)
            samples += got
        prompt_tokens = billed.input_tokens + billed.cached_input_tokens
        return samples, {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": billed.output_tokens,
            "total_tokens": prompt_tokens + billed.output_tokens,
            "prompt_tokens_details": {"cached_tokens": billed.cached_input_tokens},
        }

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

    async def completions(request: Request) -> JSONResponse:
        body = await _parse(request, CompletionBody)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise _HTTPError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        samples, usage = await sample(body, prompt, body.max_tokens, body.logprobs is not None)
        choices = [
            {
                "index": i,
                "text": s.text,
                "finish_reason": s.finish_reason,
                # Sample carries the values, not the token strings, so only these are sent.
                "logprobs": None if s.logprobs is None else {"token_logprobs": list(s.logprobs)},
            }
            for i, s in enumerate(samples)
        ]
        return envelope("text_completion", "cmpl", choices, usage)

    async def chat(request: Request) -> JSONResponse:
        body = await _parse(request, ChatBody)
        prompt = flatten_messages([(m.role, m.text()) for m in body.messages])
        ceiling = body.max_completion_tokens or body.max_tokens
        samples, usage = await sample(body, prompt, ceiling, body.logprobs)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": s.text},
                "finish_reason": s.finish_reason,
                "logprobs": None
                if s.logprobs is None
                else {"content": [{"logprob": v} for v in s.logprobs]},
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
            LanefoldError: _on_library_error,
            Exception: _on_crash,
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
