"""Statuses, bodies and transport failures mapped to the library's errors; the key never leaks."""

from __future__ import annotations

import email.utils
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from openai_stub import Recorded, Stub, choices_body, make_backend
from starlette.responses import JSONResponse, PlainTextResponse, Response

from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
from lanefold.backends.openai._errors import parse_retry_after
from lanefold.primitives import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    ConfigError,
    ContextLengthError,
    LaneRequest,
    RateLimitError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    sample_all,
)

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0
KEY = "sk-test-4f1c9a7e2b-do-not-log"


def one_lane() -> SampleRequest:
    return SampleRequest("p", SamplingParams(max_tokens=8), (LaneRequest(0, 7, 8),))


def error(message: str, **fields: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", **fields}}


CASES: list[tuple[int, dict[str, str], Any, type[BackendError], float | None, str]] = [
    (429, {"Retry-After": "7"}, error("slow down"), RateLimitError, 7.0, "slow down"),
    (429, {"Retry-After": "0.5"}, error("slow down"), RateLimitError, 0.5, "slow down"),
    (
        429,
        {"Retry-After": email.utils.formatdate(NOW + 30, usegmt=True)},
        error("later"),
        RateLimitError,
        30.0,
        "later",
    ),
    (429, {}, error("no header"), RateLimitError, None, "no header"),
    (503, {"Retry-After": "2"}, error("overloaded"), ServerError, 2.0, "overloaded"),
    (500, {}, "plain text trace", ServerError, None, "plain text trace"),
    (502, {}, error("bad gateway"), ServerError, None, "bad gateway"),
    (408, {}, error("too slow"), BackendTimeoutError, None, "too slow"),
    (401, {}, error("Incorrect API key provided"), AuthenticationError, None, "Incorrect API"),
    (400, {}, error("top_p must be <= 1"), RequestRejectedError, None, "top_p must be <= 1"),
    (403, {}, error("forbidden model"), RequestRejectedError, None, "forbidden model"),
    (404, {}, error("The model `m` does not exist"), RequestRejectedError, None, "does not"),
    (
        422,
        {},
        {"detail": [{"loc": ["body", "n"], "msg": "bad n"}]},
        RequestRejectedError,
        None,
        "bad n",
    ),
    # llama-cpp-python's server
    (
        400,
        {},
        error("Requested tokens (900) exceed context window of 512", code="context_length_exceeded"),
        ContextLengthError,
        None,
        "exceed context window",
    ),
    # llama.cpp's llama-server
    (
        400,
        {},
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size",
                "type": "exceed_context_size_error",
            }
        },
        ContextLengthError,
        None,
        "available context size",
    ),
    # OpenAI
    (
        400,
        {},
        error("This model's maximum context length is 4096 tokens."),
        ContextLengthError,
        None,
        "maximum context length",
    ),
]


@pytest.mark.parametrize(("status", "headers", "body", "cls", "retry_after", "text"), CASES)
async def test_status_maps_to_the_library_error(
    stub: tuple[Stub, str],
    status: int,
    headers: dict[str, str],
    body: Any,
    cls: type[BackendError],
    retry_after: float | None,
    text: str,
) -> None:
    server, url = stub

    def reply(rec: Recorded) -> Response:
        if isinstance(body, str):
            return PlainTextResponse(body, status_code=status, headers=headers)
        return JSONResponse(body, status_code=status, headers=headers)

    server.reply = reply
    b = make_backend(url)
    b._clock = lambda: NOW  # the HTTP-date case measures from a fixed now
    async with b:
        with pytest.raises(BackendError) as caught:
            await sample_all(b, one_lane())
    err = caught.value
    assert type(err) is cls
    assert err.retry_after == retry_after
    assert text in str(err)
    assert f"HTTP {status}" in str(err)
    assert err.retryable == (cls in (RateLimitError, ServerError, BackendTimeoutError))


def test_clock_comes_in_through_the_constructor() -> None:
    b = OpenAIBackend(OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m"), clock=lambda: 5.0)
    assert b._clock() == 5.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("12", 12.0),
        (" 3 ", 3.0),
        ("-4", 0.0),
        ("soon", None),
        ("nan", None),
        (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"choices": [{"index": 0, "message": {"content": "x"}',  # cut short
        b'{"object": "chat.completion"}',  # no choices
        b'{"choices": [{"index": 0, "message": {"content": 5}}]}',  # wrong type
        b'{"choices": [{"index": 3, "message": {"content": "x"}}]}',  # index beyond n
        b"",
    ],
)
async def test_malformed_body_is_a_bad_response(stub: tuple[Stub, str], body: bytes) -> None:
    server, url = stub
    server.reply = lambda rec: Response(body, media_type="application/json")
    async with make_backend(url) as b:
        with pytest.raises(BadResponseError) as caught:
            await sample_all(b, one_lane())
    assert caught.value.retryable


async def test_a_200_without_choices_for_a_lane_is_a_bad_response(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = lambda rec: JSONResponse({"choices": [], "usage": None})
    async with make_backend(url) as b:
        with pytest.raises(BadResponseError, match="no choice"):
            await sample_all(b, one_lane())


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # aiohttp's pool, httpx's
async def test_slow_server_times_out(stub: tuple[Stub, str]) -> None:
    server, url = stub

    async def slow(rec: Recorded) -> Response:
        await server.hold(5.0)
        return JSONResponse({})

    server.reply = slow
    async with make_backend(url, timeout_s=0.1) as b:
        with pytest.raises(BackendTimeoutError, match=r"no answer within 0\.1 s"):
            await sample_all(b, one_lane())


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # aiohttp's pool, httpx's
async def test_connection_dropped_before_an_answer_is_a_server_error(
    raw_server: Callable[[bytes], str],
) -> None:
    async with make_backend(raw_server(b"")) as b:
        with pytest.raises(ServerError) as caught:
            await sample_all(b, one_lane())
    assert caught.value.retryable


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # aiohttp's pool, httpx's
async def test_body_cut_short_is_a_bad_response(raw_server: Callable[[bytes], str]) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    url = raw_server(head + b'{"choices": [{"index": 0, "mess')
    async with make_backend(url) as b:
        with pytest.raises(BadResponseError, match="truncated body"):
            await sample_all(b, one_lane())


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # aiohttp's pool, httpx's
async def test_nothing_listening_is_a_server_error() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with make_backend(f"http://127.0.0.1:{port}/v1") as b:
        with pytest.raises(ServerError):
            await sample_all(b, one_lane())


def test_the_guard_refuses_anything_but_loopback() -> None:
    with pytest.raises(RuntimeError, match="network"):
        socket.create_connection(("192.0.2.1", 80), timeout=0.1)
    with pytest.raises(RuntimeError, match="network"):
        socket.getaddrinfo("example.com", 443)


def test_missing_key_variable_is_a_config_error_naming_it() -> None:
    config = OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="LF_KEY")
    with pytest.raises(ConfigError, match="LF_KEY"):
        OpenAIBackend(config, environ={})


async def test_the_key_never_appears_in_errors_events_or_reprs(stub: tuple[Stub, str]) -> None:
    server, url = stub
    seen: list[str] = []

    def echo(rec: Recorded) -> Response:
        auth = rec.headers.get("authorization", "")
        seen.append(auth)
        status = [401, 429, 500, 400, 200][len(seen) % 5]
        if status == 200:  # a malformed 200 that carries the key
            return Response(f'{{"choices": "{auth}"', media_type="application/json")
        if rec.n > 1:  # a refusal of n that echoes the key, so it lands in the event
            return JSONResponse(error(f"Only one completion choice is allowed {auth}"), 400)
        return JSONResponse(error(f"echo {auth}"), status_code=status, headers={"Retry-After": "1"})

    server.reply = echo
    b = make_backend(url, api_key_env="LF_TEST_KEY", environ={"LF_TEST_KEY": KEY})
    texts: list[str] = [repr(b), repr(b._config), b._config.model_dump_json(), repr(b._redact)]
    two = SampleRequest("p", SamplingParams(), (LaneRequest(0, 1, 8), LaneRequest(1, 2, 8)))
    async with b:
        for request in [one_lane()] * 6 + [two]:
            try:
                outcomes = list(await sample_all(b, request))
            except BackendError as err:
                outcomes = [err]
            for out in outcomes:
                if isinstance(out, BaseException):
                    texts += [str(out), repr(out), "".join(traceback.format_exception(out))]
        events = b.drain_events()
        texts += [repr(e) for e in events]
    assert events  # the refusal, key and all, was recorded
    assert f"Bearer {KEY}" in seen  # the key was sent, so the scan below can fail
    assert len(texts) > 15
    leaked = [t for t in texts if KEY in t]
    assert leaked == []
    assert any("[redacted]" in t for t in texts)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # aiohttp's pool, httpx's
async def test_requests_beyond_max_connections_wait_for_one(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    live, peak = [0], [0]

    async def slow(rec: Recorded) -> Response:
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await server.hold(0.25)
        live[0] -= 1
        return JSONResponse(choices_body(rec, ["ok"]))

    server.reply = slow
    lanes = tuple(LaneRequest(i, i, 8) for i in range(6))
    # The backend's own transport, so the limit applies: six one-lane requests go through two
    # connections in three rounds, the last two waiting 0.5 s for a connection (a wait
    # for a connection is not bounded by timeout_s).
    config = OpenAIConfig(base_url=url, model="m", n="never", max_connections=2, timeout_s=0.4)
    async with OpenAIBackend(config) as b:
        out = await sample_all(b, SampleRequest("p", SamplingParams(max_tokens=8), lanes))
    assert [isinstance(s, Sample) for s in out] == [True] * 6
    assert len(server.requests) == 6
    assert peak[0] == 2
