"""A streamed answer carries the headers a plain one does (issue 41 item 2): the run's id, the
request's (`x-request-id`), and what a stored key has left (`x-ratelimit-*`,
`x-lanefold-budget-remaining-*`), all in the response start, before the first chunk; read by
the OpenAI SDK over loopback. The buckets' clock is held still, so every figure is exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from loopback import Loopback
from test_store_keys import Clock, _create, _loop

from lanefold.execution import Session, open_store
from lanefold.serve import StoreKeys
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, Keys

QUESTION: Any = [{"role": "user", "content": "What is 17 * 23?"}]
# The headers that say which run and request an answer is, and what its key has left.
ANSWER_HEADERS = {
    "x-lanefold-run-id",
    "x-request-id",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-lanefold-budget-remaining-tokens",
}


@pytest.fixture
def served(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[openai.OpenAI, str]]:
    """A gateway over a files store on loopback, one stored key with every kind of limit (its
    buckets' clock held still); the OpenAI SDK's client with that key, and the key."""
    runs = tmp_path / "runs"
    key = _create(
        capsys, ["--runs-dir", str(runs)], "alice", "--rpm", "10", "--tpm", "100000", "--max-tokens", "50000"
    )
    store = open_store(None, runs)
    keys = StoreKeys(store, clock=Clock(0.0))  # type: ignore[arg-type]
    keys.load()
    session = Session(store=store)
    app = create_gateway(
        session, {"vote": _loop()}, keys=keys, pools=KeyPools(Keys(()), store, every=True), clock=Clock()
    )
    try:
        with Loopback(app) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=30)
            with client:
                yield client, key
    finally:
        anyio.run(session.aclose)


def _answer_headers(headers: Any) -> dict[str, str]:
    return {name: headers[name] for name in ANSWER_HEADERS if name in headers}


def test_a_stream_carries_the_headers_of_a_plain_answer_before_its_first_chunk(
    served: tuple[openai.OpenAI, str],
) -> None:
    client, _ = served
    plain = client.chat.completions.with_raw_response.create(
        model="vote", messages=QUESTION, extra_headers={"X-Request-ID": "r-plain"}
    )
    told = _answer_headers(plain.headers)
    assert set(told) == ANSWER_HEADERS, plain.headers
    usage = plain.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    paid = usage.total_tokens - (usage.prompt_tokens_details.cached_tokens or 0)  # what a budget counts

    with client.chat.completions.with_streaming_response.create(
        model="vote", messages=QUESTION, stream=True, extra_headers={"X-Request-ID": "r-stream"}
    ) as streamed:
        # read before a chunk is: the headers came with the response start
        got = _answer_headers(streamed.headers)
        assert set(got) == ANSWER_HEADERS, streamed.headers
        assert streamed.headers["content-type"].startswith("text/event-stream")
        chunks = list(streamed.parse())
    run_id = got["x-lanefold-run-id"]
    assert {c.id for c in chunks} == {f"chatcmpl-{run_id}"} and run_id != told["x-lanefold-run-id"]
    assert (told["x-request-id"], got["x-request-id"]) == ("r-plain", "r-stream")
    assert told["x-ratelimit-limit-requests"] == got["x-ratelimit-limit-requests"] == "10"
    assert (told["x-ratelimit-remaining-requests"], got["x-ratelimit-remaining-requests"]) == ("9", "8")
    assert told["x-ratelimit-limit-tokens"] == got["x-ratelimit-limit-tokens"] == "100000"
    # the first request's hold was settled to what it paid before the stream was admitted
    assert int(told["x-ratelimit-remaining-tokens"]) - int(got["x-ratelimit-remaining-tokens"]) == paid
    assert told["x-lanefold-budget-remaining-tokens"] == "50000"
    assert int(got["x-lanefold-budget-remaining-tokens"]) == 50000 - paid


def test_a_retry_answered_from_the_record_names_its_run_and_request_streamed_or_not(
    served: tuple[openai.OpenAI, str],
) -> None:
    """An idempotent retry of a finished run computes nothing, so no bucket admits it: its
    headers, plain or streamed, name the run and this request, and no figures."""
    client, _ = served
    first = client.chat.completions.with_raw_response.create(
        model="vote", messages=QUESTION, extra_headers={"Idempotency-Key": "order-1"}
    )
    run_id = first.headers["x-lanefold-run-id"]
    for stream in (False, True):
        again = client.chat.completions.with_raw_response.create(
            model="vote",
            messages=QUESTION,
            stream=stream,
            extra_headers={"Idempotency-Key": "order-1", "X-Request-ID": f"retry-{stream}"},
        )
        assert _answer_headers(again.headers) == {
            "x-lanefold-run-id": run_id,
            "x-request-id": f"retry-{stream}",
        }
