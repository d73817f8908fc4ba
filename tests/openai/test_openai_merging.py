"""n-merging against a real loopback server: request counts, fallback, re-requests, seeds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from openai_stub import Recorded, Stub, choices_body, honour_n
from openai_stub import make_backend as backend
from starlette.responses import JSONResponse, Response

from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
from lanefold.primitives import (
    AuthenticationError,
    Backend,
    BadResponseError,
    ChatMessage,
    ContextLengthError,
    LaneRequest,
    RequestRejectedError,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    sample_all,
)
from lanefold.primitives._backend import MESSAGE_MARGIN, REQUEST_MARGIN

pytestmark = pytest.mark.anyio

LLAMA_CPP_REFUSAL = {"error": {"code": 400, "message": "Only one completion choice is allowed", "type": "x"}}


def wave(k: int = 8, *, max_tokens: int = 32, first_lane: int = 0) -> SampleRequest:
    lanes = tuple(LaneRequest(lane=first_lane + i, seed=1000 + i, max_tokens=max_tokens) for i in range(k))
    return SampleRequest("What is 17 * 23?", SamplingParams(max_tokens=max_tokens), lanes)


def samples(outcomes: Any) -> list[Sample]:
    assert all(isinstance(o, Sample) for o in outcomes), outcomes
    return list(outcomes)


def refuse_n(rec: Recorded) -> Response:
    if rec.n > 1:
        return JSONResponse(LLAMA_CPP_REFUSAL, status_code=400)
    return honour_n(rec)


def refuse_n_above_3(rec: Recorded) -> Response:
    """llama-server with 3 slots: n is honoured up to them, refused above with the limit stated."""
    if rec.n > 3:
        message = f"Field 'n': Value must be between 1 <= value <= 3, but got {rec.n}"
        return JSONResponse(
            {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}, status_code=400
        )
    return honour_n(rec)


def one_choice_only(rec: Recorded) -> Response:
    """llama-cpp-python's server: `n` ignored, one choice, 200."""
    return JSONResponse(choices_body(rec, [f"seed {rec.body['seed']} choice 0"]))


async def test_backend_satisfies_the_protocol(stub: tuple[Stub, str]) -> None:
    async with OpenAIBackend(OpenAIConfig(base_url=stub[1], model="m")) as b:  # own transport
        assert isinstance(b, Backend)
        assert b.name == "openai:m"
        assert b.max_lanes_per_request == 16  # max_n while merging: one call, one HTTP request
        assert b.shares_prefix
        # No tokenizer here: a bound, every byte a token plus the template's markers
        plain = SampleRequest("anything", SamplingParams(), ())
        assert b.count_prompt_tokens(plain) == 8 + REQUEST_MARGIN + MESSAGE_MARGIN
        chat = dataclasses.replace(
            plain, messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hé"))
        )
        assert b.count_prompt_tokens(chat) == 8 + 3 + REQUEST_MARGIN + 2 * MESSAGE_MARGIN
    async with OpenAIBackend(OpenAIConfig(base_url=stub[1], model="m", n="never")) as b:
        assert (b.max_lanes_per_request, b.shares_prefix) == (1, False)


async def test_k8_against_a_server_honouring_n_is_one_request(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(8)))
        assert b.merging
        assert b.drain_events() == ()
    assert len(server.requests) == 1
    assert server.requests[0].body["n"] == 8
    assert server.requests[0].body["seed"] == 1000  # the first lane's seed
    assert [s.lane for s in out] == list(range(8))
    assert [s.text for s in out] == [f"seed 1000 choice {i}" for i in range(8)]
    assert all(s.extra["n"] == 8 for s in out)


async def test_max_n_splits_into_requests_each_seeded_by_its_first_lane(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    async with backend(url, max_n=3) as b:
        out = samples(await sample_all(b, wave(8)))
    got = sorted((r.body["seed"], r.n) for r in server.requests)
    assert got == [(1000, 3), (1003, 3), (1006, 2)]
    assert [s.text for s in out] == [f"seed {1000 + 3 * (i // 3)} choice {i % 3}" for i in range(8)]


async def test_refusal_costs_one_probe_then_single_lane_requests_forever(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    server.reply = refuse_n
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(8)))
        assert len(server.requests) == 9
        assert server.requests[0].n == 8
        singles = server.requests[1:]
        assert all("n" not in r.body for r in singles)
        assert sorted(r.body["seed"] for r in singles) == [1000 + i for i in range(8)]
        assert [s.text for s in out] == [f"seed {1000 + i} choice 0" for i in range(8)]
        assert not b.merging
        (event,) = b.drain_events()
        assert event.type == "backend.n_unsupported"
        assert event.data["reason"] == "refused"
        assert event.data["requested_n"] == 8
        assert "Only one completion choice" in str(event.data["message"])

        await sample_all(b, wave(8))  # no probe any more, and no second event
        assert len(server.requests) == 17
        assert all("n" not in r.body for r in server.requests[9:])
        assert b.drain_events() == ()


async def test_unexplained_400_on_merge_is_confirmed_with_one_lane_first(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub

    def reply(rec: Recorded) -> Response:
        if rec.n > 1:
            return JSONResponse({"error": {"message": "invalid request"}}, status_code=400)
        return honour_n(rec)

    server.reply = reply
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(8)))
        (event,) = b.drain_events()
    assert event.data["reason"] == "refused"
    assert len(server.requests) == 9  # probe, the first lane alone, then the other 7
    assert server.requests[1].body["seed"] == 1000
    assert [s.text for s in out] == [f"seed {1000 + i} choice 0" for i in range(8)]


async def test_a_400_that_is_not_about_n_is_raised_and_keeps_merging(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    server.reply = lambda rec: JSONResponse(
        {"error": {"message": "temperature must be at most 2"}}, status_code=400
    )
    async with backend(url) as b:
        with pytest.raises(RequestRejectedError, match="temperature must be at most 2"):
            await sample_all(b, wave(8))
        assert b.merging
        assert b.drain_events() == ()
    assert [r.n for r in server.requests] == [8, 1]


async def test_a_context_error_on_a_merged_request_is_not_probed(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = lambda rec: JSONResponse(
        {"error": {"message": "x", "code": "context_length_exceeded"}}, status_code=400
    )
    async with backend(url) as b:
        with pytest.raises(ContextLengthError):
            await sample_all(b, wave(8))
        assert b.merging
    assert len(server.requests) == 1


async def test_fewer_choices_than_n_rerequests_the_missing_lanes(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = one_choice_only
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(8)))
        (event,) = b.drain_events()
        assert not b.merging
    assert event.data["reason"] == "fewer_choices"
    assert event.data["received_choices"] == 1
    assert len(server.requests) == 8  # the merged request, then lanes 1..7 alone
    assert server.requests[0].n == 8
    assert sorted(r.body["seed"] for r in server.requests[1:]) == [1001 + i for i in range(7)]
    # lane 0 keeps the choice it got; nothing was invented for the others
    assert [s.text for s in out] == [f"seed {1000 + i} choice 0" for i in range(8)]
    assert out[0].extra["n"] == 8
    assert all(s.extra["n"] == 1 for s in out[1:])


async def test_always_reports_missing_choices_as_lane_errors(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = one_choice_only
    async with backend(url, n="always") as b:
        out = await sample_all(b, wave(4))
        assert b.merging
        assert b.drain_events() == ()
    assert len(server.requests) == 1
    assert isinstance(out[0], Sample)
    assert all(isinstance(o, BadResponseError) for o in out[1:])
    assert "1 of 4 choices" in str(out[1])


async def test_n_above_a_stated_limit_is_split_not_given_up(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = refuse_n_above_3
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(8)))
        assert server.requests[0].n == 8
        assert sorted(r.n for r in server.requests[1:]) == [2, 3, 3]
        assert len(out) == 8 and b.merging and b.max_lanes_per_request == 3
        assert b.drain_events() == ()  # n is supported: nothing to record
        await sample_all(b, wave(6))
        assert [r.n for r in server.requests[4:]] == [3, 3]  # the limit is remembered


async def test_always_raises_a_refusal(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = refuse_n
    async with backend(url, n="always") as b:
        with pytest.raises(RequestRejectedError, match="Only one completion choice"):
            await sample_all(b, wave(4))
    assert len(server.requests) == 1


async def test_never_sends_one_request_per_lane(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with backend(url, n="never") as b:
        out = samples(await sample_all(b, wave(8)))
    assert len(server.requests) == 8
    assert all("n" not in r.body for r in server.requests)
    assert [s.text for s in out] == [f"seed {1000 + i} choice 0" for i in range(8)]


async def test_no_merging_where_the_request_forbids_sharing_the_prefix(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    request = dataclasses.replace(wave(4), share_prefix=False)
    async with backend(url) as b:
        samples(await sample_all(b, request))
        assert b.merging
    assert [r.n for r in server.requests] == [1, 1, 1, 1]


async def test_outcomes_follow_the_requests_lane_order(stub: tuple[Stub, str]) -> None:
    _, url = stub
    lanes = (LaneRequest(5, 50, 8), LaneRequest(2, 20, 8), LaneRequest(9, 90, 8))
    request = SampleRequest("p", SamplingParams(), lanes)
    for mode in ("auto", "never"):
        async with backend(url, n=mode) as b:
            out = samples(await sample_all(b, request))
        assert [s.lane for s in out] == [5, 2, 9]


async def test_merged_request_asks_for_the_smallest_allotment(stub: tuple[Stub, str]) -> None:
    server, url = stub
    lanes = (LaneRequest(0, 1, 40), LaneRequest(1, 2, 37), LaneRequest(2, 3, 40))
    async with backend(url) as b:
        await sample_all(b, SampleRequest("p", SamplingParams(max_tokens=40), lanes))
    assert server.requests[0].body["max_tokens"] == 37


def fail_seeds(failing: set[int], status: int) -> Callable[[Recorded], Response]:
    def reply(rec: Recorded) -> Response:
        if rec.body["seed"] in failing:
            return JSONResponse({"error": {"message": "no"}}, status_code=status)
        return honour_n(rec)

    return reply


async def test_a_failed_lane_holds_its_error_in_place(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = fail_seeds({1002}, 500)
    async with backend(url, n="never") as b:
        out = await sample_all(b, wave(4))
    assert [type(o) for o in out] == [Sample, Sample, ServerError, Sample]


async def test_lanes_failing_one_by_one_each_hold_their_own_error(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = fail_seeds({1000, 1001, 1002}, 500)
    async with backend(url, n="never") as b:
        out = await sample_all(b, wave(3))
    assert [type(o) for o in out] == [ServerError] * 3
    assert len({id(o) for o in out}) == 3  # each lane's own answer


async def test_one_error_for_every_lane_at_once_is_raised(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = fail_seeds({1000}, 500)  # the merged request carries the first lane's seed
    async with backend(url) as b:
        with pytest.raises(ServerError, match="HTTP 500"):
            await sample_all(b, wave(3))
    assert [r.n for r in server.requests] == [3]


async def test_an_authentication_failure_sinks_the_whole_request(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = fail_seeds({1001}, 401)
    async with backend(url, n="never") as b:
        with pytest.raises(AuthenticationError):
            await sample_all(b, wave(3))


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_runs_on_trio_too(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = refuse_n
    async with backend(url) as b:
        out = samples(await sample_all(b, wave(4)))
    assert len(out) == 4
    assert len(server.requests) == 5
