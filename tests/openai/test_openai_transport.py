"""The backend's own transport: aiohttp's pool on asyncio, httpx's on trio, httpx's default
where a proxy is set; the same answers and errors on each (test_openai_errors.py runs its
failures on both)."""

from __future__ import annotations

import gzip
import json

import pytest
from openai_stub import Recorded, Stub, choices_body, make_backend
from starlette.responses import Response

from lanefold.backends.openai import OpenAIBackend, OpenAIConfig, PooledTransport
from lanefold.backends.openai._transport import pooled_transport
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, sample_all

pytestmark = pytest.mark.anyio


def one_lane() -> SampleRequest:
    return SampleRequest("What is 17 * 23?", SamplingParams(max_tokens=8), (LaneRequest(0, 7, 8),))


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_each_loop_has_its_pool(stub: tuple[Stub, str], anyio_backend: str) -> None:
    server, url = stub
    b = make_backend(url)
    transport = b._client._transport
    assert isinstance(transport, PooledTransport)
    async with b:
        for _ in range(3):
            [out] = await sample_all(b, one_lane())
            assert isinstance(out, Sample)
        aiohttp_used = transport._session is not None
    assert aiohttp_used == (anyio_backend == "asyncio")
    assert transport._session is None  # closed with the backend
    assert len(server.requests) == 3
    assert server.requests[0].headers["content-type"] == "application/json"
    assert server.requests[0].headers["user-agent"].startswith("python-httpx/")  # httpx's headers, once


async def test_a_compressed_answer_is_decoded_once(stub: tuple[Stub, str]) -> None:
    """The body goes to httpx as sent; httpx decodes it (aiohttp's decoding is off)."""
    server, url = stub

    def gzipped(rec: Recorded) -> Response:
        body = gzip.compress(json.dumps(choices_body(rec, ["391"])).encode())
        return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip"})

    server.reply = gzipped
    async with make_backend(url) as b:
        [out] = await sample_all(b, one_lane())
    assert isinstance(out, Sample) and out.text == "391"


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_in_the_environment_keeps_httpx_default_transport(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """httpx's default transport honours HTTP(S)_PROXY and ALL_PROXY; aiohttp's pool would not."""
    assert isinstance(pooled_transport(4), PooledTransport)
    monkeypatch.setenv(variable, "http://127.0.0.1:3128")
    assert pooled_transport(4) is None
    backend = OpenAIBackend(OpenAIConfig(base_url="https://api.example.com/v1", model="m"))
    assert not isinstance(backend._client._transport, PooledTransport)
