"""How the served app tells a client of a failure, and the pieces that turn a backend's
outcomes into whole answers (every lane landed, one bill).

A library BackendError maps back to the status a client's `openai` backend maps to the same
error class; anything else says nothing of its insides.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from lanefold.primitives import (
    AuthenticationError,
    Backend,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    ConfigError,
    ContextLengthError,
    LanefoldError,
    RateLimitError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    ServerError,
    StoreError,
    StreamingBackend,
    TextDelta,
    Usage,
    get_logger,
    sample_all,
)
from lanefold.serve._guard import error_response

__all__ = ("Told", "bill", "closing", "on_error", "stream_of", "told", "usage_body", "whole")

_Item = TypeVar("_Item")
_log = get_logger("lanefold.serve")

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


@dataclass(frozen=True, slots=True)
class Told:
    """What a client is told of a failure: a backend's or a config's own words, else nothing
    internal."""

    status: int
    message: str
    kind: str
    code: str | None = None
    headers: dict[str, str] | None = None


def told(exc: Exception) -> Told:
    """What to tell a client of `exc`. A store the server cannot use is its operator's to fix:
    logged with its place (a folder, a database), told as a 500 without it."""
    if isinstance(exc, StoreError):
        _log.error("serve.store_error", error=str(exc))
        return Told(500, "the server cannot record the run in its store", "server_error", "store_error")
    if isinstance(exc, ConfigError):
        return Told(400, str(exc), "invalid_request_error")
    if isinstance(exc, BackendError):
        cls = next(c for c in type(exc).__mro__ if c in _BACKEND_STATUS)
        status, kind, code = _BACKEND_STATUS[cls]
        headers = None
        if exc.retry_after is not None:
            headers = {"Retry-After": str(math.ceil(exc.retry_after))}
        return Told(status, str(exc), kind, code, headers)
    if isinstance(exc, LanefoldError):
        return Told(500, "the run failed", "server_error")
    return Told(500, "internal server error", "server_error")


async def on_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's handler for any failure a route raised."""
    t = told(exc)
    return error_response(t.status, t.message, kind=t.kind, code=t.code, headers=t.headers)


def whole(request: SampleRequest, outcomes: Sequence[Sample | BackendError]) -> list[Sample]:
    """A backend's outcomes as one Sample per lane of `request`; a failed lane fails them all."""
    if len(outcomes) != len(request.lanes):
        raise BadResponseError(f"{len(outcomes)} outcomes for {len(request.lanes)} lanes")
    got: list[Sample] = []
    for outcome in outcomes:
        if isinstance(outcome, BackendError):
            raise outcome
        got.append(outcome)
    return got


def bill(samples: list[Sample]) -> Usage:
    """One backend request's usage: its first lane's prompt, every lane's output."""
    first = min(samples, key=lambda s: s.lane).usage
    output = sum(s.usage.output_tokens for s in samples)
    return Usage(first.input_tokens, first.cached_input_tokens, output)


def usage_body(billed: Usage) -> dict[str, Any]:
    """`usage` in OpenAI's shape."""
    prompt_tokens = billed.input_tokens + billed.cached_input_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": billed.output_tokens,
        "total_tokens": prompt_tokens + billed.output_tokens,
        "prompt_tokens_details": {"cached_tokens": billed.cached_input_tokens},
    }


def stream_of(backend: Backend, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
    """`backend.stream(request)`, or each lane's whole text as one delta once every lane of
    `backend.sample(request)` has landed."""
    if isinstance(backend, StreamingBackend):
        return backend.stream(request)
    return _all_at_once(backend, request)


async def _all_at_once(backend: Backend, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
    # Collected whole, not relayed lane by lane: `sample`'s caller may do only synchronous work
    # between lanes and must close it in its own task, and a response stream awaits the client
    # between chunks and is read by another task than the one that opened it.
    for sample in whole(request, await sample_all(backend, request)):
        if sample.text:
            yield TextDelta(sample.lane, sample.text)
        yield sample


@contextlib.asynccontextmanager
async def closing(iterator: AsyncIterator[_Item]) -> AsyncIterator[AsyncIterator[_Item]]:
    """Close an async generator on the way out (an early exit cancels what it was doing)."""
    try:
        yield iterator
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()
