"""The `openai` backend against llama.cpp's own `llama-server` (8 slots, prompt cache on).

That server honours `n` up to its slots (`-np`), reports `prompt_tokens_details.cached_tokens`
and answers overflow with a JSON 400 (`exceed_context_size_error`). Its usage of an `n > 1`
request counts one choice only: the bill must count what was received instead.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from remote_tap import Tap, backend, loop_config, of_type, run_loop

from lanefold.primitives import ContextLengthError, LaneRequest, SampleRequest, SamplingParams, sample_all

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# A question SmolLM2 answers in a few tokens: lanes stop well before max_tokens, which is where
# a bill split by characters has least to go on.
SHORT = "Reply with one word only: what colour is the sky on a clear day?\n{question}"


async def token_counts(base_url: str, texts: list[str]) -> list[int]:
    """Tokens of each text by the server's own tokenizer (its `/tokenize` endpoint)."""
    counts = []
    async with httpx.AsyncClient(base_url=base_url.removesuffix("/v1")) as client:
        for text in texts:
            response = await client.post("/tokenize", json={"content": text, "add_special": False})
            response.raise_for_status()
            counts.append(len(response.json()["tokens"]))
    return counts


async def test_k8_goes_out_as_one_request_of_n8(llama_server_url: str, tmp_path: Path) -> None:
    tap = Tap()
    result, events = await run_loop(loop_config(llama_server_url, k=8), tap, tmp_path)

    # Every lane landed; whether the small model gave a number (`status`) is not the point.
    assert (result.lanes_completed, result.lanes_failed) == (8, 0)
    assert of_type(events, "backend.n_unsupported") == []
    (exchange,) = tap.exchanges
    assert (exchange.status, exchange.n, len(exchange.choices)) == (200, 8, 8)
    assert sorted(c["index"] for c in exchange.choices) == list(range(8))
    texts = [e.data.text for e in of_type(events, "lane.completed")]
    assert sorted(texts) == sorted(c["message"]["content"] for c in exchange.choices)
    assert len(set(texts)) > 1  # the server seeds each choice apart from the first lane's seed
    assert result.usage.requests == 1


async def test_cached_prompt_tokens_are_billed_as_cached_prefill(
    llama_server_url: str, tmp_path: Path
) -> None:
    config = loop_config(
        llama_server_url, k=4, max_tokens=8, template="Cache probe {question}: " + "lorem ipsum dolor " * 40
    )
    billed = []
    for attempt in range(2):  # the second run's prompt is in the server's prompt cache
        tap = Tap()
        result, _ = await run_loop(config, tap, tmp_path / str(attempt))
        (exchange,) = tap.exchanges
        usage = exchange.usage
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert result.usage.cached_prefill_tokens == cached
        assert result.usage.prefill_tokens == usage["prompt_tokens"] - cached
        billed.append(cached)
    assert billed[1] > 0
    assert billed[1] > billed[0]


async def test_the_bill_counts_every_choice_by_logprobs(llama_server_url: str, tmp_path: Path) -> None:
    tap = Tap()
    config = loop_config(llama_server_url, k=8, logprobs=True, template=SHORT)
    result, events = await run_loop(config, tap, tmp_path)
    (exchange,) = tap.exchanges
    own = [len(c["logprobs"]["content"]) for c in exchange.choices]
    reported = exchange.usage["completion_tokens"]
    assert result.usage.decode_tokens >= sum(own) >= reported
    lanes = of_type(events, "lane.completed")
    assert {e.data.backend.get("usage_apportioned_by") for e in lanes} == {"tokens"}
    assert sorted(e.data.usage.output_tokens for e in lanes) == sorted(own)


async def test_the_bill_counts_every_choice_without_logprobs(llama_server_url: str, tmp_path: Path) -> None:
    tap = Tap()
    config = loop_config(llama_server_url, k=8, template=SHORT)
    result, _ = await run_loop(config, tap, tmp_path)
    (exchange,) = tap.exchanges
    assert exchange.n == 8
    own = await token_counts(llama_server_url, [c["message"]["content"] for c in exchange.choices])
    assert result.usage.decode_tokens >= sum(own), (
        f"billed {result.usage.decode_tokens} decode tokens for choices of {own} tokens "
        f"(server reported {exchange.usage['completion_tokens']})"
    )


async def test_context_overflow_is_a_context_length_error(llama_server_url: str) -> None:
    tap = Tap()
    lanes = tuple(LaneRequest(lane=i, seed=i, max_tokens=8) for i in range(2))
    request = SampleRequest("hello " * 10_000, SamplingParams(max_tokens=8), lanes)
    async with backend(llama_server_url, tap) as b:
        with pytest.raises(ContextLengthError) as caught:
            await sample_all(b, request)
        assert b.merging
    assert not caught.value.retryable
    (exchange,) = tap.exchanges
    assert exchange.status == 400
    assert "exceed_context_size" in str(caught.value)


async def test_more_lanes_than_slots_with_max_n_at_the_slots(llama_server_url: str, tmp_path: Path) -> None:
    """`max_n = -np`: K = 12 goes out as n = 8 and n = 4, both honoured."""
    tap = Tap()
    config = loop_config(llama_server_url, k=12, max_tokens=8)
    config = config.model_copy(update={"backend": config.backend.model_copy(update={"max_n": 8})})
    result, events = await run_loop(config, tap, tmp_path)
    assert (result.lanes_completed, result.lanes_failed) == (12, 0)
    assert sorted((x.n, x.status, len(x.choices)) for x in tap.exchanges) == [(4, 200, 4), (8, 200, 8)]
    assert of_type(events, "backend.n_unsupported") == []


async def test_more_lanes_than_slots_still_completes(llama_server_url: str, tmp_path: Path) -> None:
    """n above `-np` is refused (400 "Field 'n': Value must be between 1 <= value <= 8"); the run
    still completes, and no lane is invented."""
    tap = Tap()
    result, events = await run_loop(loop_config(llama_server_url, k=12, max_tokens=8), tap, tmp_path)
    assert (result.lanes_completed, result.lanes_failed) == (12, 0)
    first = tap.exchanges[0]
    assert (first.n, first.status) == (12, 400)
    texts = sorted(e.data.text for e in of_type(events, "lane.completed"))
    assert texts == sorted(c["message"]["content"] for x in tap.exchanges for c in x.choices)


async def test_n_above_the_slots_is_split_not_given_up(llama_server_url: str, tmp_path: Path) -> None:
    tap = Tap()
    result, events = await run_loop(loop_config(llama_server_url, k=12, max_tokens=8), tap, tmp_path)
    assert (result.lanes_completed, result.lanes_failed) == (12, 0)
    answered = [x for x in tap.exchanges if x.status == 200]
    assert len(answered) <= 2, f"{len(answered)} requests for 12 lanes against 8 slots"
    assert of_type(events, "backend.n_unsupported") == []
