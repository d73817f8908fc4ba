"""Lanes land as their HTTP requests answer; closing the iterator cancels what is in flight.

The stub holds chosen requests back until the test lets them go, so the order in which lanes
land is fixed by the server, never by timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import aclosing

import anyio
import pytest
from openai_stub import Recorded, Stub, honour_n, make_backend
from starlette.responses import JSONResponse, Response

from lanefold.primitives import (
    AuthenticationError,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    sample_all,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def wave(k: int) -> SampleRequest:
    lanes = tuple(LaneRequest(lane=i, seed=1000 + i, max_tokens=16) for i in range(k))
    return SampleRequest("Q?", SamplingParams(max_tokens=16), lanes)


class Gated:
    """What the stub saw, by seed: requests arrived, answered, and given up by the client."""

    def __init__(self, server: Stub) -> None:
        self.server = server
        self.opened = threading.Event()  # set by the test's thread, read by the server's
        self.arrived: set[int] = set()
        self.answered: list[int] = []
        self.gone: set[int] = set()

    async def until(self, rec: Recorded, ready: Callable[[], bool]) -> bool:
        """Wait in the server until `ready()`; False if the client hung up first."""
        while not ready() and not self.server.release.is_set():
            if await rec.gone():
                self.gone.add(rec.body["seed"])
                return False
            await anyio.sleep(0.01)
        return True

    def reply(
        self,
        hold: Callable[[int], Callable[[], bool] | None],
        status: Callable[[int], int] = lambda seed: 200,
    ) -> None:
        """Answer each request once `hold(seed)` (if not None) says so, with `status`."""

        async def answer(rec: Recorded) -> Response:
            seed = rec.body["seed"]
            self.arrived.add(seed)
            ready = hold(seed)
            if ready is not None and not await self.until(rec, ready):
                return Response(status_code=499)
            self.answered.append(seed)
            if status(seed) != 200:
                return JSONResponse({"error": {"message": "no"}}, status_code=status(seed))
            return honour_n(rec)

        self.server.reply = answer


@pytest.fixture
def gated(stub: tuple[Stub, str]) -> Iterator[Gated]:
    yield Gated(stub[0])


async def eventually(check: Callable[[], bool]) -> None:
    """Wait for what the server's thread records (no anyio.Event crosses the threads)."""
    with anyio.fail_after(10):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_a_lane_sent_alone_lands_while_a_slower_one_is_still_open(
    stub: tuple[Stub, str], gated: Gated
) -> None:
    # Lane 0 answers once lane 1's request has arrived; lane 1 waits until the test opens it.
    gated.reply(lambda seed: (lambda: 1001 in gated.arrived) if seed == 1000 else gated.opened.is_set)
    with anyio.fail_after(10):
        async with make_backend(stub[1], n="never") as b, aclosing(b.sample(wave(2))) as lanes:
            first = await anext(lanes)
            assert isinstance(first, Sample)
            assert first.lane == 0
            assert gated.arrived == {1000, 1001}  # lane 1's request is open...
            assert gated.answered == [1000]  # ...and not answered
            gated.opened.set()
            second = await anext(lanes)
            assert isinstance(second, Sample)
            assert (second.lane, second.text) == (1, "seed 1001 choice 0")
            assert [outcome async for outcome in lanes] == []


async def test_a_merged_request_lands_its_lanes_together_when_it_answers(
    stub: tuple[Stub, str], gated: Gated
) -> None:
    gated.reply(lambda seed: gated.opened.is_set if seed == 1000 else None)
    with anyio.fail_after(10):
        async with make_backend(stub[1], max_n=2) as b, aclosing(b.sample(wave(4))) as lanes:
            early = [await anext(lanes), await anext(lanes)]
            assert gated.answered == [1002]
            gated.opened.set()
            late = [outcome async for outcome in lanes]
    assert [(s.lane, s.extra["n"]) for s in early if isinstance(s, Sample)] == [(2, 2), (3, 2)]
    assert [(s.lane, s.extra["n"]) for s in late if isinstance(s, Sample)] == [(0, 2), (1, 2)]


async def test_closing_early_cancels_the_requests_in_flight(stub: tuple[Stub, str], gated: Gated) -> None:
    gated.reply(lambda seed: None if seed == 1000 else gated.opened.is_set)
    async with make_backend(stub[1], n="never") as b:
        with anyio.fail_after(10):  # closing does not wait for the held requests
            async with aclosing(b.sample(wave(3))) as lanes:
                first = await anext(lanes)
        assert isinstance(first, Sample) and first.lane == 0
        await eventually(lambda: gated.gone == {1001, 1002})
    assert gated.answered == [1000]


async def test_a_callers_cancellation_cancels_the_requests_in_flight(
    stub: tuple[Stub, str], gated: Gated
) -> None:
    gated.reply(lambda seed: gated.opened.is_set)
    async with make_backend(stub[1], n="never") as b:
        with anyio.move_on_after(0.2) as scope:
            await sample_all(b, wave(2))
        assert scope.cancelled_caught
        await eventually(lambda: gated.gone == {1000, 1001})
    assert gated.answered == []


async def test_a_fatal_error_is_raised_bare_and_cancels_the_other_lanes(
    stub: tuple[Stub, str], gated: Gated
) -> None:
    # Lane 1 is refused once every lane's request is open; the others never answer.
    gated.reply(
        lambda seed: (lambda: len(gated.arrived) == 3) if seed == 1001 else gated.opened.is_set,
        status=lambda seed: 401,
    )
    async with make_backend(stub[1], n="never") as b:
        with anyio.fail_after(10), pytest.raises(AuthenticationError, match="HTTP 401"):
            await sample_all(b, wave(3))
        await eventually(lambda: gated.gone == {1000, 1002})
    assert gated.answered == [1001]
