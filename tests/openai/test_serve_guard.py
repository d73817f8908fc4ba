"""What guards the served port: the API key, the body cap, nested JSON, admission (429 with
Retry-After), `max_tokens` against the context window, a client hanging up and a server stop.

In-process through httpx's ASGI transport where the event loop is the test's; over real HTTP on
loopback (uvicorn in a thread) where the point is the socket: a streamed body, a hang-up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from loopback import Loopback
from test_serve_app import FakeBackend, call

from lanefold.primitives import LaneOutcome, Sample, SampleRequest, TextDelta, Usage
from lanefold.serve._app import create_app

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The app is anyio throughout, so in-process it runs on trio too (uvicorn needs asyncio)."""
    return str(request.param)


class Blocking(FakeBackend):
    """Every request waits until `release` is set, counting starts and cancellations; with
    `stream`, one delta first."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.started = 0
        self.cancelled = 0

    async def _wait(self) -> None:
        self.started += 1
        try:
            # `release` is set from another thread (and event loop) too, so it is polled
            while not self.release.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.01)
        except BaseException:  # cancelled, or closed by the caller
            self.cancelled += 1
            raise

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        await self._wait()
        async for outcome in super().sample(request):
            yield outcome


class BlockingStream(Blocking):
    async def stream(self, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
        yield TextDelta(0, "first ")
        await self._wait()
        yield Sample(0, "first ", "stop", Usage(1, 0, 1))


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 - polls state no event signals
            await anyio.sleep(0.01)


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


async def test_an_api_key_is_required_when_set() -> None:
    app = create_app(FakeBackend(), model_name="tiny", api_key="s3cret-key")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
            r = await client.post("/v1/completions", json={"prompt": "Q"}, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == "Bearer"
            assert "s3cret" not in r.text
        assert (await client.get("/v1/models")).status_code == 401
        good = {"Authorization": "Bearer s3cret-key"}
        assert (await client.get("/v1/models", headers=good)).status_code == 200
        r = await client.post("/v1/completions", json={"prompt": "Q"}, headers=good)
        assert r.status_code == 200


async def test_a_body_declared_too_large_is_refused_unread() -> None:
    fake = FakeBackend()
    app = create_app(fake, model_name="tiny", max_body_bytes=1000)
    r = await call(app, "/v1/completions", raw=b'{"prompt": "' + b"x" * 1000 + b'"}')
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    r = await call(app, "/v1/completions", raw=b'{"prompt": "' + b"x" * 900 + b'"}')
    assert r.status_code == 200
    assert len(fake.requests) == 1


def test_a_streamed_body_is_cut_off_as_it_passes_the_cap() -> None:
    sent = [0]

    def body() -> Iterator[bytes]:  # no Content-Length: chunked, 150 MB if read whole
        yield b'{"prompt": "'
        for _ in range(150 * 16):
            sent[0] += 64 * 1024
            yield b"x" * (64 * 1024)
        yield b'"}'

    with Loopback(create_app(FakeBackend(), model_name="tiny")) as server:
        try:
            r = httpx.post(f"{server.base_url}/completions", content=body(), timeout=30)
        except httpx.TransportError:  # the server answered and closed while we still wrote
            status = None
        else:
            status = r.status_code
    assert status in (413, None)
    assert sent[0] < 32 * 1024 * 1024  # it stopped reading long before 150 MB


async def test_deeply_nested_json_is_a_bad_request() -> None:
    for raw in (
        b"[" * 100_000 + b"]" * 100_000,
        b'{"prompt": "Q", "user": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ):
        r = await call(create_app(FakeBackend(), model_name="tiny"), "/v1/completions", raw=raw)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


async def test_beyond_the_running_batch_and_max_waiting_requests_get_429() -> None:
    fake = Blocking(max_lanes=2)  # the backend's batch: two lanes run at once
    app = create_app(fake, model_name="tiny", max_waiting=1)
    statuses: dict[str, int] = {}

    async def post(name: str, n: int) -> None:
        statuses[name] = (await call(app, "/v1/completions", {"prompt": "Q", "n": n})).status_code

    async with anyio.create_task_group() as tg:
        tg.start_soon(post, "running", 2)
        await until(lambda: fake.started == 1)
        tg.start_soon(post, "waiting", 1)
        await until(lambda: app.state.admission.waiting == 1)
        r = await call(app, "/v1/completions", {"prompt": "Q"})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert fake.started == 1  # the waiting one has not reached the backend
        fake.release.set()
    assert statuses == {"running": 200, "waiting": 200}
    assert app.state.admission.running == 0


class Windowed(FakeBackend):
    """A backend whose model holds 50 tokens: a prompt is one token per character."""

    def context_left(self, request: SampleRequest) -> int | None:
        return 50 - len(request.prompt)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Q", "max_tokens": 50}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Q"}], "max_completion_tokens": 1_000_000},
            "max_completion_tokens",
        ),
        ("/v1/completions", {"prompt": "Q" * 50}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Q" * 60}]}, "messages"),
    ],
)
async def test_max_tokens_beyond_the_context_left_is_refused(
    path: str, body: dict[str, Any], param: str
) -> None:
    fake = Windowed()
    r = await call(create_app(fake, model_name="tiny"), path, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert fake.requests == []


async def test_max_tokens_within_the_context_and_the_default_shrunk_to_it() -> None:
    fake = Windowed()
    app = create_app(fake, model_name="tiny")
    assert (await call(app, "/v1/completions", {"prompt": "Q", "max_tokens": 49})).status_code == 200
    assert (await call(app, "/v1/completions", {"prompt": "Q"})).status_code == 200
    assert [r.lanes[0].max_tokens for r in fake.requests] == [49, 49]  # the default 256 shrunk


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_hanging_up_cancels_its_request(stream: bool) -> None:
    fake = BlockingStream() if stream else Blocking()
    with Loopback(create_app(fake, model_name="tiny")) as server:
        body = {"prompt": "Q", "stream": stream}
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream(
                "POST", f"{server.base_url}/completions", json=body, timeout=httpx.Timeout(5, read=0.5)
            ) as response:
                for _ in response.iter_lines():
                    pass
        wait_for(lambda: fake.cancelled == 1)  # nobody waits, so the backend stops
    assert not fake.release.is_set()


async def test_a_server_stop_ends_requests_in_flight() -> None:
    fake = Blocking()
    app = create_app(fake, model_name="tiny")
    got: list[httpx.Response] = []

    async def post() -> None:
        got.append(await call(app, "/v1/completions", {"prompt": "Q"}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(post)
        await until(lambda: fake.started == 1)
        app.state.stopping.stop()
    assert got[0].status_code == 503
    assert got[0].json()["error"]["code"] == "server_shutting_down"
    assert fake.cancelled == 1


async def test_a_server_stop_ends_a_stream_with_an_error_event() -> None:
    fake = BlockingStream()
    app = create_app(fake, model_name="tiny")
    got: list[httpx.Response] = []

    async def post() -> None:
        got.append(await call(app, "/v1/completions", {"prompt": "Q", "stream": True}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(post)
        await until(lambda: fake.started == 1)
        app.state.stopping.stop()
    frames = [f for f in got[0].text.split("\n\n") if f]
    assert frames[0].startswith('data: {"id"') and '"first "' in frames[0]
    assert '"server_shutting_down"' in frames[-2]
    assert frames[-1] == "data: [DONE]"
    assert fake.cancelled == 1
