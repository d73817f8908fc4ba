"""What a hold counts is what the backend is sent (issue 38): the dispatch path asks the backend
to count the request itself (a chat's messages through its template), and a backend that cannot
count gets the one conservative estimate, margins for the template included."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from lanefold.backends.simulated import SimulatedBackend
from lanefold.config import parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import (
    ChatMessage,
    LaneOutcome,
    Sample,
    SampleRequest,
    SamplingParams,
    Usage,
    estimate_prompt_tokens,
)
from lanefold.primitives._backend import MESSAGE_MARGIN, REQUEST_MARGIN

TURNS = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello! Ask away.")]


def _config(**backend: Any) -> Any:
    return parse_config(
        {
            "loop": {"k": 3, "min_quorum": 1, "seed": 5},
            "sampling": {"max_tokens": 20},
            "backend": {"kind": "simulated", "prompt_tokens": 40, "output_tokens": 10, **backend},
        }
    )


def _chat(tmp_path: Path, backend: Any, config: Any, run_id: str = "chat") -> Any:
    async def go() -> Any:
        async with Session(config, backend=backend, runs_dir=tmp_path) as session:
            await session.run("What is 2 + 2?", conversation=TURNS, run_id=run_id)
        return read_state(open_store(None, tmp_path), run_id)

    return anyio.run(go)


def test_a_chats_hold_counts_the_simulated_template_per_message(tmp_path: Path) -> None:
    config = _config(template_tokens=7)
    state = _chat(tmp_path, SimulatedBackend(config.backend), config)
    (wave,) = state.waves.values()
    sent = 40 + 7 * (len(TURNS) + 1)  # the earlier turns and the question as the user's
    assert wave.info.prompt_tokens == sent
    first = wave.lanes[0].usage
    assert first is not None and first.input_tokens == sent
    assert wave.info.reservation.tokens == sent + 3 * 20


class Uncounted:
    """A backend that cannot count (None), billing exactly the estimate's bytes."""

    name = "uncounted"
    max_lanes_per_request = None
    shares_prefix = True

    def __init__(self) -> None:
        self.seen: list[SampleRequest] = []

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        return None

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.seen.append(request)
        for i, lane in enumerate(request.lanes):
            tokens = sum(len(m.content) for m in request.messages or ())
            usage = Usage(0, tokens, 4) if i else Usage(tokens, 0, 4)
            yield Sample(lane.lane, "Answer: 4", "stop", usage)

    async def aclose(self) -> None:
        return None


def test_a_backend_that_cannot_count_is_held_the_estimate_of_what_it_is_sent(tmp_path: Path) -> None:
    backend = Uncounted()
    state = _chat(tmp_path, backend, _config())
    (wave,) = state.waves.values()
    (sent,) = {dataclasses.replace(r, lanes=()) for r in backend.seen}
    assert sent.messages is not None and len(sent.messages) == len(TURNS) + 1
    assert wave.info.prompt_tokens == estimate_prompt_tokens(sent)
    assert all(lane.status == "completed" for lane in wave.lanes.values())


def test_the_estimate_is_every_byte_plus_the_templates_markers() -> None:
    plain = SampleRequest("Q: 2+2?", SamplingParams(), ())
    assert estimate_prompt_tokens(plain) == 7 + REQUEST_MARGIN + MESSAGE_MARGIN
    turns = (ChatMessage("system", "Sé breve."), ChatMessage("user", "Q: 2+2?"))
    chat = SampleRequest("Q: 2+2?", SamplingParams(), (), messages=turns)
    assert estimate_prompt_tokens(chat) == len("Sé breve.".encode()) + 7 + REQUEST_MARGIN + 2 * MESSAGE_MARGIN


def test_the_estimate_counts_a_historys_calls_and_results() -> None:
    """An assistant turn's calls are sent (and rendered by the server) as much as its words:
    each call's id, name and arguments count, and a tool turn's `tool_call_id` and `name`."""
    from lanefold.primitives import MessageToolCall

    call = MessageToolCall("call_1", "get_weather", '{"city": "Paris"}')
    turns = (
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather"),
    )
    chat = SampleRequest("Q", SamplingParams(), (), messages=turns)
    sent = len("call_1get_weather" + '{"city": "Paris"}') + len("18C" + "call_1" + "get_weather")
    assert estimate_prompt_tokens(chat) == sent + REQUEST_MARGIN + 2 * MESSAGE_MARGIN
