"""`offload`: a blocking call in a worker thread, or on the event loop where the caller is the
only request that a server owning the loop serves (`serving`); a cancelled caller never makes
the call. `tests/gateway/test_server_process.py` checks that a served process marks its
requests."""

from __future__ import annotations

import contextlib
import threading

import anyio
import pytest

from lanefold.primitives import offload
from lanefold.primitives.internal import serving

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _on_loop() -> bool:
    return threading.current_thread() is threading.main_thread()


async def _inline() -> bool:
    """Whether `offload` made its call on the caller's thread (the event loop's, the main one)."""
    loop_thread = threading.get_ident()
    return await offload(threading.get_ident) == loop_thread


async def test_a_call_outside_a_served_request_goes_to_a_worker_thread() -> None:
    assert _on_loop()
    assert not await _inline()  # a library caller's loop may have work of its own


async def test_a_lone_served_request_makes_its_calls_on_the_loop_and_its_tasks_too() -> None:
    with serving():
        assert await _inline()
        with serving():  # a block inside another counts once
            assert await _inline()
        found: list[bool] = []

        async def task() -> None:
            found.append(await _inline())

        async with anyio.create_task_group() as tg:
            tg.start_soon(task)
        assert found == [True]
    assert not await _inline()  # the request ended: nothing is served


async def test_two_requests_in_flight_both_go_to_worker_threads() -> None:
    both = anyio.Event()
    arrived: list[None] = []
    found: list[bool] = []

    async def request() -> None:
        with serving():
            arrived.append(None)
            if len(arrived) == 2:
                both.set()
            await both.wait()
            found.append(await _inline())

    async with anyio.create_task_group() as tg:
        tg.start_soon(request)
        tg.start_soon(request)
    assert found == [False, False]
    with serving():
        assert await _inline()  # both ended: counted out, even a request alone again


async def test_a_request_that_fails_is_counted_out() -> None:
    with pytest.raises(ValueError), serving():
        raise ValueError("the request failed")
    with serving():
        assert await _inline()


@pytest.mark.parametrize("served", [False, True])
async def test_a_cancelled_caller_never_makes_the_call(served: bool) -> None:
    made: list[None] = []
    with serving() if served else contextlib.nullcontext():
        with anyio.CancelScope() as scope:
            scope.cancel()
            await offload(made.append, None)
        assert scope.cancelled_caught
        assert made == []
