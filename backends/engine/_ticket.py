"""A `sample` or `stream` call as the engine thread sees it, and the pure pieces it hands out:
a finished lane as a Sample, and the part of a running lane's text no later token can change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from lanefold.backends.engine._sequence import EngineRequest
from lanefold.backends.engine._sequence import Sequence as Lane
from lanefold.primitives import Sample, SampleRequest, Usage

__all__ = ("Ticket", "lane_sample", "settled_text")


@dataclass(slots=True, eq=False)
class Ticket:
    """One `sample` or `stream` call as the engine thread sees it.

    The thread appends each finished lane's Sample to `landed` (a deque: the caller pops from
    it while the thread may append) and sets `done` once nothing more will land.
    """

    request: SampleRequest
    prompt_ids: list[int]
    streaming: bool = False
    engine_request: EngineRequest | None = None
    landed: deque[Sample] = field(default_factory=deque)
    partial: dict[int, str] = field(default_factory=dict)  # streaming: settled text per lane
    error: BaseException | None = None
    done: bool = False
    cancelled: bool = False


def settled_text(text: str, stops: Sequence[str]) -> str:
    """The part of a lane's text so far that no later token can change.

    Drops a trailing U+FFFD (a character whose bytes are not all decoded yet) and the longest
    tail that a stop string could still begin with (the engine would cut the text there).
    """
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, end), held, -1):
            if text.endswith(stop[:k], 0, end):
                held = k
                break
    return text[: end - held]


def lane_sample(request: SampleRequest, lane: Lane, paths: dict[str, object] | None = None) -> Sample:
    """A finished lane as a Sample: its own usage, its request's figures so far and, where
    given, the decode paths its steps took (`extra["decode_paths"]`, `_decode_paths`)."""
    return Sample(
        lane=lane.lane,
        text=lane.text,
        finish_reason=lane.finish_reason or "stop",
        usage=Usage(
            input_tokens=lane.input_tokens,
            cached_input_tokens=lane.cached_input_tokens,
            output_tokens=lane.num_generated,
            kv_token_seconds=lane.kv_token_seconds,
        ),
        logprobs=tuple(lane.logprobs) if request.params.logprobs else None,
        extra=lane.metrics.as_extra() | ({} if paths is None else {"decode_paths": paths}),
    )
