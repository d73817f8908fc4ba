"""The served app: any Backend behind /v1, driven in-process and by OpenAIBackend end to end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from loopback import Loopback
from openai_stub import make_backend

from lanefold.primitives import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    ChatMessage,
    ConfigError,
    ContextLengthError,
    LaneFailure,
    LaneOutcome,
    LaneRequest,
    RateLimitError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    TextDelta,
    Usage,
    sample_all,
)
from lanefold.serve._app import create_app
from lanefold.serve._wire import flatten_messages

pytestmark = pytest.mark.anyio

PROMPT_TOKENS = 12
CACHED = 4


class FakeBackend:
    """Lane i answers "<prompt>|seed=<seed>" in 3 tokens; lane 0 prefills, the rest fork."""

    name = "fake"
    shares_prefix = True

    def __init__(
        self,
        *,
        error: BaseException | None = None,
        lane_error: BackendError | None = None,
        max_lanes: int | None = None,
        short: bool = False,
    ) -> None:
        self.requests: list[SampleRequest] = []
        self.error = error
        self.lane_error = lane_error
        self.max_lanes = max_lanes
        self.short = short
        self.closed = False

    @property
    def max_lanes_per_request(self) -> int | None:
        return self.max_lanes

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return PROMPT_TOKENS

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        out: list[LaneOutcome] = []
        for i, lane in enumerate(request.lanes):
            first = i == 0
            use = Usage(
                input_tokens=PROMPT_TOKENS - CACHED if first else 0,
                cached_input_tokens=CACHED if first else PROMPT_TOKENS,
                output_tokens=3,
            )
            logprobs = (-0.25, -0.5, -0.75) if request.params.logprobs else None
            text = f"{request.prompt}|seed={lane.seed}"
            tokens = (text[:1], text[1:3], text[3:]) if logprobs else None
            out.append(Sample(lane.lane, text, "stop", use, logprobs, tokens=tokens))
        if self.lane_error is not None:
            out[-1] = LaneFailure(out[-1].lane, self.lane_error)
        for outcome in out[:-1] if self.short else out:
            yield outcome

    async def aclose(self) -> None:
        self.closed = True


async def call(app: Any, path: str, body: Any = None, *, raw: bytes | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        if body is None and raw is None:
            return await client.get(path)
        return await client.post(path, json=body, content=raw)


def app_for(backend: FakeBackend, **kwargs: Any) -> Any:
    return create_app(backend, model_name="tiny", clock=lambda: 1234.9, **kwargs)


async def test_models() -> None:
    r = await call(app_for(FakeBackend()), "/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["tiny"]


async def test_completions_n_is_one_request_of_n_lanes() -> None:
    fake = FakeBackend()
    body = {
        "model": "tiny",
        "prompt": "Q",
        "n": 8,
        "seed": 100,
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.8,
        "stop": "END",
    }
    r = await call(app_for(fake), "/v1/completions", body)
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    assert sent.share_prefix
    assert sent.prompt == "Q"
    assert [lane.seed for lane in sent.lanes] == list(range(100, 108))
    assert [lane.max_tokens for lane in sent.lanes] == [20] * 8
    assert sent.params == SamplingParams(
        temperature=0.5, top_p=0.8, max_tokens=20, stop=("END",), logprobs=False
    )
    data = r.json()
    assert data["object"] == "text_completion"
    assert data["created"] == 1234
    assert [c["text"] for c in data["choices"]] == [f"Q|seed={100 + i}" for i in range(8)]
    assert [c["index"] for c in data["choices"]] == list(range(8))
    assert data["usage"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": 24,
        "total_tokens": PROMPT_TOKENS + 24,
        "prompt_tokens_details": {"cached_tokens": CACHED},
    }


async def test_defaults_and_a_drawn_seed() -> None:
    fake = FakeBackend()
    r = await call(app_for(fake, seed_source=lambda: 41), "/v1/completions", {"prompt": ["Q"]})
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    assert [lane.seed for lane in sent.lanes] == [41]
    assert sent.params == SamplingParams(temperature=1.0, top_p=1.0, max_tokens=256)


async def test_chat_carries_messages_and_returns_logprobs() -> None:
    fake = FakeBackend()
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "logprobs": True,
        "max_completion_tokens": 9,
        "stop": ["a", "b"],
        "n": 2,
    }
    r = await call(app_for(fake), "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    assert sent.prompt == "Hi"
    assert sent.messages == (ChatMessage("user", "Hi"),)
    assert sent.params.logprobs
    assert sent.params.stop == ("a", "b")
    assert sent.lanes[0].max_tokens == 9
    choice = r.json()["choices"][1]
    assert choice["message"] == {"role": "assistant", "content": f"Hi|seed={sent.lanes[1].seed}"}
    text = choice["message"]["content"]
    tokens = [text[:1], text[1:3], text[3:]]
    assert choice["logprobs"] == {
        "refusal": None,
        "content": [
            {"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
            for t, v in zip(tokens, (-0.25, -0.5, -0.75), strict=True)
        ],
    }
    assert r.json()["object"] == "chat.completion"


async def test_chat_keeps_a_system_turn_and_maps_developer_to_system() -> None:
    fake = FakeBackend()
    body = {
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
        ]
    }
    r = await call(app_for(fake), "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    assert sent.messages == (
        ChatMessage("system", "Be terse."),
        ChatMessage("user", "2+2?"),
        ChatMessage("assistant", "4"),
        ChatMessage("user", "3+3?"),
    )
    assert sent.prompt.startswith("system: Be terse.")  # for a backend without a template


async def test_completion_logprobs() -> None:
    fake = FakeBackend()
    r = await call(app_for(fake), "/v1/completions", {"prompt": "Q", "logprobs": 0})
    assert fake.requests[0].messages is None  # a completion's prompt goes as it is
    text = r.json()["choices"][0]["text"]
    assert r.json()["choices"][0]["logprobs"] == {
        "tokens": [text[:1], text[1:3], text[3:]],
        "token_logprobs": [-0.25, -0.5, -0.75],
        "top_logprobs": None,
        "text_offset": [0, 1, 3],
    }


def test_flatten_messages() -> None:
    assert flatten_messages([("user", "What is 2+2?")]) == "What is 2+2?"
    assert flatten_messages([("system", "Be terse."), ("user", "2+2?")]) == (
        "system: Be terse.\n\nuser: 2+2?\n\nassistant:"
    )


async def test_no_op_values_common_clients_send_are_accepted() -> None:
    fake = FakeBackend()
    noop = {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "user": "u-1"}
    r = await call(
        app_for(fake), "/v1/completions", {"prompt": "Q", "best_of": 1, "echo": False, "logprobs": 1, **noop}
    )
    assert r.status_code == 200, r.text
    r = await call(
        app_for(fake),
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Q"}],
            "top_logprobs": 0,
            "response_format": {"type": "text"},
            **noop,
        },
    )
    assert r.status_code == 200, r.text
    assert len(fake.requests) == 2


async def test_a_backend_smaller_than_n_gets_several_requests() -> None:
    fake = FakeBackend(max_lanes=3)
    r = await call(app_for(fake), "/v1/completions", {"prompt": "Q", "n": 8, "seed": 0})
    assert r.status_code == 200
    assert [[lane.seed for lane in req.lanes] for req in fake.requests] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    assert r.json()["usage"]["prompt_tokens"] == 3 * PROMPT_TOKENS


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "param"),
    [
        ("/v1/completions", None, b"{oops", 400, None),
        ("/v1/completions", {"prompt": "Q", "best_of": 2}, None, 400, "best_of"),
        ("/v1/completions", {"prompt": "Q", "frequency_penalty": 0.5}, None, 400, "frequency_penalty"),
        ("/v1/completions", {"prompt": "Q", "presence_penalty": -1}, None, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "Q", "logit_bias": {"50256": -100}}, None, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "Q", "logprobs": 6}, None, 400, "logprobs"),
        ("/v1/completions", {"prompt": "Q", "echo": True}, None, 400, "echo"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Q"}], "top_logprobs": 21},
            None,
            400,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Q"}], "response_format": {"type": "json_object"}},
            None,
            400,
            "response_format.type",
        ),
        ("/v1/completions", {"prompt": "Q", "n": 0}, None, 400, "n"),
        ("/v1/completions", {"prompt": "Q", "n": 129}, None, 400, "n"),
        ("/v1/completions", {"prompt": "Q", "temperature": 3}, None, 400, "temperature"),
        ("/v1/completions", {"prompt": ["a", "b"]}, None, 400, "prompt"),
        ("/v1/completions", {"prompt": "Q", "stream_options": {}}, None, 400, "stream_options"),
        (
            "/v1/completions",
            {"prompt": "Q", "stream": True, "stream_options": {"x": 1}},
            None,
            400,
            "stream_options.x",
        ),
        ("/v1/completions", {"prompt": "Q", "model": "gpt-9"}, None, 404, "model"),
        ("/v1/chat/completions", {"messages": []}, None, 400, "messages"),
        ("/v1/chat/completions", {"prompt": "Q"}, None, 400, "messages"),
    ],
)
async def test_bad_requests_get_openai_shaped_errors(
    path: str, body: Any, raw: bytes | None, status: int, param: str | None
) -> None:
    fake = FakeBackend()
    r = await call(app_for(fake), path, body, raw=raw)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    assert fake.requests == []


@pytest.mark.parametrize(
    ("raw", "param", "message"),
    [  # each used to be taken (a string coerced to 16) or told as a misleading bound
        (
            b'{"prompt": "Q", "max_tokens": "16"}',
            "max_tokens",
            'max_tokens: an integer was expected, got a string ("16")',
        ),
        (
            b'{"prompt": "Q", "max_tokens": 16.5}',
            "max_tokens",
            "max_tokens: an integer was expected, got a number (16.5)",
        ),
        (b'{"prompt": "Q", "n": true}', "n", "n: an integer was expected, got a boolean (true)"),
        (b'{"prompt": "Q", "stream": 1}', "stream", "stream: a boolean was expected, got an integer (1)"),
        (
            b'{"prompt": "Q", "temperature": "0.5"}',
            "temperature",
            'temperature: a number was expected, got a string ("0.5")',
        ),
        (b'{"prompt": "Q", "temperature": NaN}', "temperature", "temperature: NaN is not a number"),
        (b'{"prompt": "Q", "top_p": Infinity}', "top_p", "top_p: Infinity is not a finite number"),
        (
            b'{"prompt": "Q", "stop": ["ok", 7]}',
            "stop.1",
            "stop.1: a string was expected, got an integer (7)",
        ),
        (
            b'{"messages": [{"role": "user", "content": 5}]}',
            "messages.0.content",
            "messages.0.content: a string was expected, got an integer (5)",
        ),
    ],
)
async def test_types_are_as_the_json_says_them(raw: bytes, param: str, message: str) -> None:
    fake = FakeBackend()
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    r = await call(app_for(fake), path, raw=raw)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
    assert fake.requests == []


async def test_a_whole_number_is_a_number_and_null_leaves_a_default() -> None:
    fake = FakeBackend()
    r = await call(
        app_for(fake),
        "/v1/completions",
        {"prompt": "Q", "temperature": 1, "top_p": 1, "max_tokens": None, "seed": 3},
    )
    assert r.status_code == 200, r.text
    assert fake.requests[0].params.temperature == 1.0


@pytest.mark.parametrize(
    ("error", "status", "code", "retry_after"),
    [
        (RateLimitError("busy", retry_after=2.5), 429, "rate_limit_exceeded", "3"),
        (ServerError("down", retry_after=1), 503, None, "1"),
        (ServerError("down"), 503, None, None),
        (ContextLengthError("too long"), 400, "context_length_exceeded", None),
        (RequestRejectedError("no"), 400, None, None),
        (AuthenticationError("bad key"), 502, "upstream_authentication_failed", None),
        (BackendTimeoutError("slow"), 504, "timeout", None),
        (BadResponseError("garbled"), 502, "bad_upstream_response", None),
        (ConfigError("bad params"), 400, None, None),
        (RuntimeError("bug"), 500, None, None),
    ],
)
async def test_backend_errors_map_to_statuses(
    error: BaseException, status: int, code: str | None, retry_after: str | None
) -> None:
    r = await call(app_for(FakeBackend(error=error)), "/v1/completions", {"prompt": "Q"})
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert r.headers.get("retry-after") == retry_after
    if isinstance(error, BackendError | ConfigError):
        assert str(error) in r.json()["error"]["message"]
    else:
        assert "bug" not in r.text  # a crash says nothing of its insides


async def test_a_failed_lane_fails_the_response() -> None:
    fake = FakeBackend(lane_error=RateLimitError("lane 3 throttled", retry_after=4))
    r = await call(app_for(fake), "/v1/completions", {"prompt": "Q", "n": 4})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "4"


async def test_a_backend_losing_lanes_is_a_bad_gateway() -> None:
    r = await call(app_for(FakeBackend(short=True)), "/v1/completions", {"prompt": "Q", "n": 2})
    assert r.status_code == 502


# -- streaming -------------------------------------------------------------------------------------


class StreamingFake(FakeBackend):
    """Streams each lane's text a word at a time, lanes interleaved; can fail after `fail_after`
    deltas."""

    def __init__(
        self, *, fail_after: int | None = None, fail_with: Exception | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.fail_with = fail_with or ServerError("engine step failed")
        self.closed_streams = 0

    async def stream(self, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
        samples = [s for s in await sample_all(self, request) if isinstance(s, Sample)]
        words = {s.lane: [w + " " for w in s.text.split("|")] for s in samples}
        sent = 0
        try:
            for position in range(max(len(w) for w in words.values())):
                for lane, parts in words.items():
                    if position < len(parts):
                        if self.fail_after is not None and sent == self.fail_after:
                            raise self.fail_with
                        sent += 1
                        yield TextDelta(lane, parts[position])
            for sample in samples:
                yield Sample(
                    sample.lane, "".join(words[sample.lane]), "length", sample.usage, sample.logprobs
                )
        finally:
            self.closed_streams += 1


def events_of(r: httpx.Response) -> list[Any]:
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in r.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]


def joined(chunks: list[Any], field: Callable[[dict[str, Any]], str | None]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            out[choice["index"]] = out.get(choice["index"], "") + (field(choice) or "")
    return out


async def test_stream_completions_from_a_streaming_backend() -> None:
    fake = StreamingFake()
    r = await call(
        app_for(fake),
        "/v1/completions",
        {
            "prompt": "Q",
            "n": 3,
            "seed": 5,
            "stream": True,
            "logprobs": 0,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    chunks = events_of(r)
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert joined(chunks, lambda c: c["text"]) == {i: f"Q seed={5 + i} " for i in range(3)}
    finals = [c for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert [(c["index"], c["finish_reason"]) for c in finals] == [(i, "length") for i in range(3)]
    assert all(c["logprobs"]["token_logprobs"] == [-0.25, -0.5, -0.75] for c in finals)
    # Every chunk carries "usage": null but the last, which has no choices and the request's bill.
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": 9,
        "total_tokens": PROMPT_TOKENS + 9,
        "prompt_tokens_details": {"cached_tokens": CACHED},
    }
    assert fake.closed_streams == 1


async def test_stream_chat_from_a_backend_without_streaming() -> None:
    fake = FakeBackend(max_lanes=2)  # n = 3 -> two backend requests, streamed one after the other
    r = await call(
        app_for(fake),
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Q"}], "n": 3, "seed": 0, "stream": True},
    )
    chunks = events_of(r)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert all("usage" not in c for c in chunks)  # not asked for
    assert chunks[0]["choices"] == [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(3)
    ]
    # Without `stream` on the backend, each lane's whole text arrives as one delta.
    assert joined(chunks, lambda c: c["delta"].get("content")) == {i: f"Q|seed={i}" for i in range(3)}
    assert len(fake.requests) == 2


async def test_stream_error_before_the_first_chunk_keeps_its_status() -> None:
    fake = StreamingFake(error=RateLimitError("busy", retry_after=2))
    r = await call(app_for(fake), "/v1/completions", {"prompt": "Q", "stream": True})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "2"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    r = await call(
        app_for(FakeBackend(short=True)), "/v1/completions", {"prompt": "Q", "n": 2, "stream": True}
    )
    assert r.status_code == 502


async def test_stream_error_midway_is_reported_in_band_and_closes_the_stream() -> None:
    fake = StreamingFake(fail_after=2)
    r = await call(app_for(fake), "/v1/completions", {"prompt": "Q", "n": 2, "stream": True})
    assert r.status_code == 200
    chunks = events_of(r)
    assert joined(chunks[:-1], lambda c: c["text"]) == {0: "Q ", 1: "Q "}
    assert chunks[-1]["error"]["type"] == "server_error"
    assert chunks[-1]["error"]["status"] == 503
    assert "engine step failed" in chunks[-1]["error"]["message"]
    assert fake.closed_streams == 1
    crash = StreamingFake(fail_after=1, fail_with=RuntimeError("bug in line 3"))
    r = await call(app_for(crash), "/v1/completions", {"prompt": "Q", "stream": True})
    error = events_of(r)[-1]["error"]
    assert (error["status"], error["message"]) == (500, "internal server error")
    assert "bug" not in r.text


def wave(k: int, logprobs: bool = False) -> SampleRequest:
    lanes = tuple(LaneRequest(i, 1000 + i, 16) for i in range(k))
    return SampleRequest("Q?", SamplingParams(max_tokens=16, logprobs=logprobs), lanes)


@pytest.mark.parametrize(("api", "logprobs"), [("chat", False), ("completions", True)])
async def test_openai_backend_end_to_end(
    loopback: Callable[[Any], Loopback], api: str, logprobs: bool
) -> None:
    fake = FakeBackend()
    server = loopback(create_app(fake, model_name="tiny"))
    async with make_backend(server.base_url, model="tiny", api=api) as b:
        out = await sample_all(b, wave(8, logprobs))
        assert b.merging
    (sent,) = fake.requests  # n = 8 arrived as ONE request of 8 lanes
    assert len(sent.lanes) == 8
    assert [lane.seed for lane in sent.lanes] == [1000 + i for i in range(8)]
    samples = [s for s in out if isinstance(s, Sample)]
    assert [s.text for s in samples] == [f"Q?|seed={1000 + i}" for i in range(8)]
    assert samples[0].usage == Usage(PROMPT_TOKENS - CACHED, CACHED, 3)
    assert all(s.usage == Usage(0, 0, 3) for s in samples[1:])
    # A merged request always asks for logprobs, so each choice is billed by its own tokens;
    # the caller gets them back only where it asked.
    assert {s.extra["usage_apportioned_by"] for s in samples} == {"tokens"}
    assert all((s.logprobs is not None) == logprobs for s in samples)
    # The served token texts come back through the wire where asked, adding up to the text.
    assert all(s.tokens is None if not logprobs else "".join(s.tokens or ()) == s.text for s in samples)


async def test_a_conversation_crosses_the_wire_as_turns(loopback: Callable[[Any], Loopback]) -> None:
    fake = FakeBackend()
    server = loopback(create_app(fake, model_name="tiny"))
    turns = (ChatMessage("system", "Be terse."), ChatMessage("user", "2+2?"))
    request = SampleRequest(
        "flattened", SamplingParams(max_tokens=4), (LaneRequest(0, 1, 4),), messages=turns
    )
    async with make_backend(server.base_url, model="tiny", api="chat") as b:
        (out,) = await sample_all(b, request)
    assert isinstance(out, Sample)
    (sent,) = fake.requests
    assert sent.messages == turns  # not the flattened prompt: the server templates the turns


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (RateLimitError("busy", retry_after=2), RateLimitError),
        (ContextLengthError("too long"), ContextLengthError),
        (RequestRejectedError("no"), RequestRejectedError),
        (BackendTimeoutError("slow"), ServerError),  # 504 is a 5xx to the client
    ],
)
async def test_errors_cross_the_wire_as_their_class(
    loopback: Callable[[Any], Loopback], error: BackendError, cls: type[BackendError]
) -> None:
    server = loopback(create_app(FakeBackend(error=error), model_name="tiny"))
    async with make_backend(server.base_url, model="tiny") as b:
        with pytest.raises(BackendError) as caught:
            await sample_all(b, wave(2))
    assert type(caught.value) is cls
    assert caught.value.retry_after == error.retry_after
    assert b.merging  # an error that is not about n leaves merging on


SERVE_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from lanefold.serve._run import serve

class Backend:
    name = "tiny"
    max_lanes_per_request = None
    def count_prompt_tokens(self, prompt):
        return None
    async def sample(self, request):
        raise NotImplementedError
    async def aclose(self):
        print("closed", flush=True)

serve(Backend(), model_name="tiny", port={port}, log_level="warning")
"""


@pytest.mark.slow
def test_serve_runs_uvicorn_on_loopback_and_closes_the_backend() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = SERVE_SCRIPT.format(root=root, port=port)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.05)
        assert r.json()["data"][0]["id"] == "tiny"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "closed" in out
