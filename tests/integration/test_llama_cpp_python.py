"""The `openai` backend against llama-cpp-python's server (`python -m llama_cpp.server`).

That server answers `n = 4` with one choice and 200, reports no cached tokens, serves one request
at a time, says 400 `context_length_exceeded` for long prompts, 500 for fields of the wrong type
and plain text for a body that is not JSON. A run must complete through the fallback path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from remote_tap import QUESTION, Tap, backend, loop_config, of_type, run_loop

from lanefold.primitives import (
    ContextLengthError,
    LaneRequest,
    RequestRejectedError,
    SampleRequest,
    SamplingParams,
    ServerError,
    sample_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def wave(prompt: str, k: int, max_tokens: int = 8) -> SampleRequest:
    lanes = tuple(LaneRequest(lane=i, seed=100 + i, max_tokens=max_tokens) for i in range(k))
    return SampleRequest(prompt, SamplingParams(max_tokens=max_tokens), lanes)


@pytest.mark.parametrize("k", [4, 5, 8])
async def test_a_run_completes_through_the_fallback(
    llama_cpp_python_url: str, tmp_path: Path, k: int
) -> None:
    tap = Tap()
    result, events = await run_loop(loop_config(llama_cpp_python_url, k=k), tap, tmp_path)

    # Every lane landed; whether the small model gave a number (`status`) is not the point.
    assert (result.lanes_completed, result.lanes_failed) == (k, 0)
    (noted,) = of_type(events, "backend.n_unsupported")
    assert noted.data.detail["reason"] == "fewer_choices"
    assert (noted.data.detail["requested_n"], noted.data.detail["received_choices"]) == (k, 1)

    # One merged probe answered with one choice, then one request per missing lane.
    first, *rest = tap.exchanges
    assert (first.n, len(first.choices)) == (k, 1)
    assert len(rest) == k - 1
    assert all(x.n == 1 and x.status == 200 and len(x.choices) == 1 for x in rest)

    # Never invented: every lane's text is a choice the server sent, each choice used once.
    sent = sorted(c["message"]["content"] for x in tap.exchanges for c in x.choices)
    texts = sorted(e.data.text for e in of_type(events, "lane.completed"))
    assert texts == sent

    # The bill is what the server reported: k prompts (it caches nothing it tells of), all
    # completion tokens.
    reported_prompt = sum(x.usage["prompt_tokens"] for x in tap.exchanges)
    reported_completion = sum(x.usage["completion_tokens"] for x in tap.exchanges)
    assert result.usage.prefill_tokens + result.usage.cached_prefill_tokens == reported_prompt
    assert result.usage.decode_tokens >= reported_completion


async def test_a_prompt_longer_than_the_context_is_a_context_length_error(
    llama_cpp_python_url: str,
) -> None:
    tap = Tap()
    async with backend(llama_cpp_python_url, tap) as b:
        with pytest.raises(ContextLengthError) as caught:
            await sample_all(b, wave("hello " * 3000, k=2))  # --n_ctx 2048
        assert b.merging  # a context error says nothing about n
    assert not caught.value.retryable
    assert "context" in str(caught.value).lower()
    (only,) = tap.exchanges  # not probed with one lane: the prompt would not fit either
    assert only.status == 400


async def test_a_field_of_the_wrong_type_is_an_error_carrying_the_servers_message(
    llama_cpp_python_url: str,
) -> None:
    # extra_body passes through; llama-cpp-python validates it and answers 500, not 422.
    tap = Tap()
    async with backend(llama_cpp_python_url, tap, extra_body={"repeat_penalty": "lots"}) as b:
        with pytest.raises((ServerError, RequestRejectedError)) as caught:
            await sample_all(b, wave(QUESTION, k=1))
    (exchange,) = tap.exchanges
    assert exchange.status in (400, 422, 500)
    assert "repeat_penalty" in str(caught.value)
    expected = ServerError if exchange.status >= 500 else RequestRejectedError
    assert type(caught.value) is expected


async def test_a_body_that_is_not_json_is_rejected_with_the_servers_text(
    llama_cpp_python_url: str,
) -> None:
    tap = Tap(rewrite=lambda body: body[: len(body) // 2])  # the request cut short
    async with backend(llama_cpp_python_url, tap) as b:
        with pytest.raises((RequestRejectedError, ServerError)) as caught:
            await sample_all(b, wave(QUESTION, k=1))
    (exchange,) = tap.exchanges
    assert exchange.status >= 400
    detail = exchange.body if isinstance(exchange.body, str) else json.dumps(exchange.body)
    assert detail.strip()[:40] in str(caught.value)  # the server's own words, not a guess


async def test_a_single_lane_is_billed_as_the_server_reports(llama_cpp_python_url: str) -> None:
    tap = Tap()
    async with backend(llama_cpp_python_url, tap) as b:
        (sample,) = await sample_all(b, wave(QUESTION, k=1))
    (exchange,) = tap.exchanges
    assert "n" not in exchange.request  # n = 1 is left out
    assert not isinstance(sample, Exception)
    assert sample.text == exchange.choices[0]["message"]["content"]
    assert sample.usage.input_tokens == exchange.usage["prompt_tokens"]
    assert sample.usage.output_tokens == exchange.usage["completion_tokens"]
    assert sample.extra["usage_apportioned_by"] == "single"
