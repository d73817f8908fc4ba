"""The served app's logprobs: completions' `logprobs` up to 5 and chat's `top_logprobs` up to
20 in OpenAI's shapes, what a backend without alternatives answers, and the `openai` backend
carrying alternatives across the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from loopback import Loopback
from openai_stub import make_backend

from lanefold.primitives import (
    LaneOutcome,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    Usage,
    sample_all,
)
from lanefold.serve._app import create_app
from lanefold.serve._wire import chat_logprobs, completion_logprobs

pytestmark = pytest.mark.anyio

TOKENS = ("a", "bc", "d")
LOGPROBS = (-0.5, -1.5, -0.25)
# At each position: the likeliest first. At position 1 the sampled "bc" is not among the first
# two; at position 2 two ids share the text "x" (the likelier is told).
ALTERNATIVES = (
    (("a", -0.5), ("b", -1.25), ("c", -2.0), ("e", -3.0), ("f", -4.0)),
    (("z", -0.75), ("y", -1.0), ("bc", -1.5), ("w", -2.5), ("v", -5.0)),
    (("d", -0.25), ("x", -2.0), ("x", -3.0), ("u", float("-inf")), ("t", -9.0)),
)


class Alternating:
    """Three tokens a lane, with logprobs and, where asked and `alternatives`, five of the
    likeliest tokens at each position."""

    name = "fake"
    max_lanes_per_request = None

    def __init__(self, *, alternatives: bool = True) -> None:
        self.alternatives = alternatives
        self.requests: list[SampleRequest] = []

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 4

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.requests.append(request)
        params = request.params
        for lane in request.lanes:
            top = None
            if params.logprobs and params.top_logprobs and self.alternatives:
                top = tuple(step[: params.top_logprobs] for step in ALTERNATIVES)
            yield Sample(
                lane.lane,
                "".join(TOKENS),
                "stop",
                Usage(4, 0, 3),
                LOGPROBS if params.logprobs else None,
                tokens=TOKENS if params.logprobs else None,
                top_logprobs=top,
            )

    async def aclose(self) -> None:
        pass


async def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        return await client.post(path, json=body)


CHAT = {"messages": [{"role": "user", "content": "Q"}]}


async def test_completions_logprobs_n_gives_the_n_likeliest_and_the_sampled_token() -> None:
    fake = Alternating()
    r = await post(create_app(fake, model_name="m"), "/v1/completions", {"prompt": "Q", "logprobs": 2})
    assert r.status_code == 200, r.text
    (sent,) = fake.requests
    assert (sent.params.logprobs, sent.params.top_logprobs) == (True, 2)
    assert r.json()["choices"][0]["logprobs"] == {
        "tokens": ["a", "bc", "d"],
        "token_logprobs": [-0.5, -1.5, -0.25],
        "top_logprobs": [
            {"a": -0.5, "b": -1.25},
            {"z": -0.75, "y": -1.0, "bc": -1.5},
            {"d": -0.25, "x": -2.0},
        ],
        "text_offset": [0, 1, 3],
    }


async def test_completions_accept_up_to_5_and_tell_minus_infinity_as_minus_9999() -> None:
    app = create_app(Alternating(), model_name="m")
    r = await post(app, "/v1/completions", {"prompt": "Q", "logprobs": 5})
    assert r.status_code == 200, r.text
    top = r.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert [len(step) for step in top] == [5, 5, 4]  # the two "x" are one text
    assert top[2]["u"] == -9999.0  # JSON has no -inf
    r = await post(app, "/v1/completions", {"prompt": "Q", "logprobs": 6})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "logprobs"


async def test_completions_logprobs_0_gives_no_alternatives() -> None:
    fake = Alternating()
    r = await post(create_app(fake, model_name="m"), "/v1/completions", {"prompt": "Q", "logprobs": 0})
    assert fake.requests[0].params.top_logprobs == 0
    assert r.json()["choices"][0]["logprobs"]["top_logprobs"] is None


async def test_chat_top_logprobs_in_openais_shape() -> None:
    fake = Alternating()
    r = await post(
        create_app(fake, model_name="m"),
        "/v1/chat/completions",
        {**CHAT, "logprobs": True, "top_logprobs": 2},
    )
    assert r.status_code == 200, r.text
    assert fake.requests[0].params.top_logprobs == 2
    content = r.json()["choices"][0]["logprobs"]["content"]

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    assert content == [
        {**entry("a", -0.5), "top_logprobs": [entry("a", -0.5), entry("b", -1.25)]},
        {**entry("bc", -1.5), "top_logprobs": [entry("z", -0.75), entry("y", -1.0)]},
        {**entry("d", -0.25), "top_logprobs": [entry("d", -0.25), entry("x", -2.0)]},
    ]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"logprobs": True, "top_logprobs": 20}, 200),
        ({"logprobs": True, "top_logprobs": 21}, 400),
        ({"top_logprobs": 2}, 400),  # as OpenAI: alternatives need logprobs
        ({"logprobs": False, "top_logprobs": 1}, 400),
        ({"top_logprobs": 0}, 200),  # the no-op value common clients send
    ],
)
async def test_chat_top_logprobs_limits(body: dict[str, Any], status: int) -> None:
    fake = Alternating()
    r = await post(create_app(fake, model_name="m"), "/v1/chat/completions", {**CHAT, **body})
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "top_logprobs"
        assert fake.requests == []


async def test_a_backend_without_alternatives_answers_none_of_them() -> None:
    # The simulated backend, or an `openai` backend whose server sends none: each token's
    # logprob as it comes, and no alternatives (completions: null; chat: an empty list).
    app = create_app(Alternating(alternatives=False), model_name="m")
    r = await post(app, "/v1/completions", {"prompt": "Q", "logprobs": 3})
    lp = r.json()["choices"][0]["logprobs"]
    assert (lp["token_logprobs"], lp["top_logprobs"]) == ([-0.5, -1.5, -0.25], None)
    r = await post(app, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["top_logprobs"]) for c in content] == [("a", []), ("bc", []), ("d", [])]


def test_shapes_of_a_sample_without_token_texts() -> None:
    sample = Sample(0, "abcd", "stop", Usage(), LOGPROBS, top_logprobs=ALTERNATIVES)
    assert completion_logprobs(sample, 2) == {
        "tokens": None,
        "token_logprobs": list(LOGPROBS),
        "top_logprobs": None,
        "text_offset": None,
    }
    chat = chat_logprobs(sample, 1)
    assert chat is not None
    assert [c["top_logprobs"][0]["token"] for c in chat["content"]] == ["a", "z", "d"]


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_the_openai_backend_carries_alternatives_across_the_wire(
    loopback: Callable[[Any], Loopback], api: str
) -> None:
    fake = Alternating()
    server = loopback(create_app(fake, model_name="m"))
    params = SamplingParams(max_tokens=3, logprobs=True, top_logprobs=2)
    request = SampleRequest("Q", params, (LaneRequest(0, 7, 3), LaneRequest(1, 8, 3)))
    async with make_backend(server.base_url, model="m", api=api) as backend:
        out = await sample_all(backend, request)
    (sent,) = fake.requests  # both lanes as one request of n = 2
    assert (sent.params.logprobs, sent.params.top_logprobs, len(sent.lanes)) == (True, 2, 2)
    for sample in out:
        assert isinstance(sample, Sample)
        assert sample.tokens == TOKENS and sample.logprobs == LOGPROBS
        # Most likely first, two at each position (a completion's server also told the
        # sampled "bc" at position 1: it is not among the two asked for).
        assert sample.top_logprobs == tuple(step[:2] for step in ALTERNATIVES)


async def test_the_openai_backend_asks_for_no_alternatives_unless_told(
    loopback: Callable[[Any], Loopback],
) -> None:
    fake = Alternating()
    server = loopback(create_app(fake, model_name="m"))
    request = SampleRequest("Q", SamplingParams(max_tokens=3, logprobs=True), (LaneRequest(0, 7, 3),))
    async with make_backend(server.base_url, model="m", api="completions") as backend:
        (sample,) = await sample_all(backend, request)
    assert fake.requests[0].params.top_logprobs == 1  # `logprobs: 1` on the wire means "on"
    assert isinstance(sample, Sample) and sample.top_logprobs is None
