"""Usage: the prompt billed once per HTTP request, completion tokens split, never under-billed."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai_stub import Recorded, Stub, make_backend, usage
from starlette.responses import JSONResponse, Response

from lanefold.backends.openai._usage import Tally, apportion, split
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, Usage, sample_all

pytestmark = pytest.mark.anyio


def request(k: int, *, logprobs: bool = False, max_tokens: int = 16) -> SampleRequest:
    lanes = tuple(LaneRequest(i, 10 + i, max_tokens) for i in range(k))
    return SampleRequest("p" * 40, SamplingParams(max_tokens=max_tokens, logprobs=logprobs), lanes)


def chat(
    texts: list[str],
    use: dict[str, Any] | None,
    *,
    token_counts: list[int] | None = None,
    finish: str = "stop",
) -> Response:
    choices = []
    for i, text in enumerate(texts):
        choice: dict[str, Any] = {"index": i, "message": {"content": text}, "finish_reason": finish}
        if token_counts is not None:
            entries = [{"token": "t", "logprob": -1.0}] * token_counts[i]
            choice["logprobs"] = {"content": entries}
        choices.append(choice)
    return JSONResponse({"choices": choices, "usage": use})


async def run(stub: tuple[Stub, str], reply: Any, req: SampleRequest) -> list[Sample]:
    server, url = stub
    server.reply = reply
    async with make_backend(url, n="always") as b:
        out = list(await sample_all(b, req))
    assert all(isinstance(o, Sample) for o in out)
    return out  # type: ignore[return-value]


async def test_prompt_billed_once_with_cached_prefill(stub: tuple[Stub, str]) -> None:
    out = await run(
        stub,
        lambda rec: chat(["a b", "c d e"], usage(100, 5, cached=60), token_counts=[2, 3]),
        request(2, logprobs=True),
    )
    assert out[0].usage == Usage(input_tokens=40, cached_input_tokens=60, output_tokens=2)
    assert out[1].usage == Usage(input_tokens=0, cached_input_tokens=0, output_tokens=3)
    assert [s.extra["usage_apportioned_by"] for s in out] == ["tokens", "tokens"]
    assert out[0].logprobs == (-1.0, -1.0)


async def test_a_server_counting_one_choice_is_not_believed(stub: tuple[Stub, str]) -> None:
    # llama-server with n > 1 reported the completion tokens of one choice only
    out = await run(
        stub,
        lambda rec: chat(["a b c", "d e f g h"], usage(20, 3), token_counts=[3, 5]),
        request(2, logprobs=True),
    )
    assert [s.usage.output_tokens for s in out] == [3, 5]
    assert out[0].extra["usage_reported_completion_tokens"] == 3


async def test_length_stopped_choices_evidently_hold_max_tokens(stub: tuple[Stub, str]) -> None:
    out = await run(
        stub,
        lambda rec: chat(["x" * 30, "y" * 50], usage(20, 16), finish="length"),
        request(2, max_tokens=16),
    )
    assert [s.usage.output_tokens for s in out] == [16, 16]
    assert [s.finish_reason for s in out] == ["length", "length"]


async def test_without_logprobs_tokens_are_split_by_characters(stub: tuple[Stub, str]) -> None:
    out = await run(stub, lambda rec: chat(["ab", "abcdefgh", ""], usage(20, 22)), request(3))
    assert [s.usage.output_tokens for s in out] == [5, 17, 0]
    assert {s.extra["usage_apportioned_by"] for s in out} == {"characters"}
    assert all(s.logprobs is None for s in out)


async def test_a_surplus_over_exact_counts_follows_their_shape(stub: tuple[Stub, str]) -> None:
    out = await run(
        stub,
        lambda rec: chat(["a", "b c d"], usage(20, 8), token_counts=[1, 3]),
        request(2, logprobs=True),
    )
    assert [s.usage.output_tokens for s in out] == [2, 6]
    assert "usage_reported_completion_tokens" not in out[0].extra


async def test_single_choice_takes_the_whole_usage(stub: tuple[Stub, str]) -> None:
    out = await run(stub, lambda rec: chat(["hello"], usage(9, 4, cached=2)), request(1))
    assert out[0].usage == Usage(input_tokens=7, cached_input_tokens=2, output_tokens=4)
    assert out[0].extra["usage_apportioned_by"] == "single"


async def test_missing_usage_is_estimated_from_bytes_never_zero(stub: tuple[Stub, str]) -> None:
    out = await run(stub, lambda rec: chat(["héllo", "hi"], None), request(2))
    assert out[0].usage == Usage(input_tokens=40, output_tokens=6)  # 40 prompt bytes
    assert out[1].usage == Usage(input_tokens=0, output_tokens=2)
    assert out[0].extra["usage_apportioned_by"] == "bytes_estimate"


async def test_fallback_lanes_each_carry_their_own_prompt(stub: tuple[Stub, str]) -> None:
    server, url = stub

    def one(rec: Recorded) -> Response:
        return chat(["ok"], usage(30, 1, cached=10))

    server.reply = one
    async with make_backend(url) as b:
        out = list(await sample_all(b, request(3)))
    assert len(server.requests) == 3  # 1 merged (1 choice) + 2 singles
    assert [s.usage.input_tokens for s in out if isinstance(s, Sample)] == [20, 20, 20]
    assert [s.usage.cached_input_tokens for s in out if isinstance(s, Sample)] == [10, 10, 10]


def test_split_examples() -> None:
    assert split(10, [1, 1]) == [5, 5]
    assert split(10, [1, 2]) == [3, 7]
    assert split(3, [0, 0, 0]) == [1, 1, 1]
    assert split(0, [4, 5]) == [0, 0]
    assert split(7, []) == []


@given(st.integers(0, 10_000), st.lists(st.integers(0, 1000), min_size=1, max_size=20))
def test_split_is_exact_and_proportional(total: int, weights: list[int]) -> None:
    parts = split(total, weights)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)
    whole = sum(weights) or len(weights)
    for p, w in zip(parts, weights or [1], strict=False):
        share = total * (w if sum(weights) else 1) / whole
        assert abs(p - share) < 1


tallies = st.builds(
    Tally,
    token_count=st.none() | st.integers(0, 64),
    chars=st.integers(0, 400),
    utf8_bytes=st.integers(0, 800),
    hit_length=st.booleans(),
)


@given(
    st.lists(tallies, min_size=1, max_size=16),
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.integers(0, 2000),
    st.integers(1, 64),
)
def test_apportion_never_under_bills(
    ts: list[Tally], prompt: int, cached: int, completion: int, max_tokens: int
) -> None:
    out = apportion(
        ts,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        max_tokens=max_tokens,
        prompt_bytes=1,
    )
    outputs = [u.output_tokens for u in out.usages]
    assert sum(outputs) == out.billed_completion_tokens >= completion
    assert all(o >= 0 for o in outputs)
    for t, o in zip(ts, outputs, strict=True):
        exact = t.token_count if t.token_count is not None else max_tokens if t.hit_length else None
        assert o >= (exact if exact is not None else min(t.chars, 1))
    assert sum(u.input_tokens + u.cached_input_tokens for u in out.usages) == prompt
    assert all(u.input_tokens == u.cached_input_tokens == 0 for u in out.usages[1:])
