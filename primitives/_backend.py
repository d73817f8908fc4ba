"""The Backend seam: what crosses between the dispatch path and an inference backend.

A backend makes ONE attempt at a request of K lanes that share a prompt and returns one
outcome per lane. Retries, budget, timeouts and logging live in the dispatch path above it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from primitives._errors import BackendError

__all__ = (
    "Backend",
    "LaneRequest",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "StreamingBackend",
    "TextDelta",
    "Usage",
)

Purpose = Literal["sample", "judge"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings shared by every lane of a request."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_tokens: int = 256  # the configured ceiling; each lane's carved allotment may be lower
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    ignore_eos: bool = False  # decode to max_tokens through end-of-sequence (benchmarks)


@dataclass(frozen=True, slots=True)
class LaneRequest:
    """One lane of a request: its index in the wave, its seed and its carved token allotment."""

    lane: int
    seed: int
    max_tokens: int
    attempt: int = 1  # 1 for the first dispatch of the lane; a retry or a resume raises it


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """K lanes that share one prompt.

    `share_prefix` says the backend may prefill the prompt once for all lanes; the ledger
    then prices the prompt once as prefill and the rest as cached prefill.
    """

    prompt: str
    params: SamplingParams
    lanes: tuple[LaneRequest, ...]
    share_prefix: bool = True
    purpose: Purpose = "sample"
    wave: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one lane (or a sum of lanes).

    `input_tokens` are prompt tokens computed (prefill); `cached_input_tokens` were served from
    a shared prefix or cache; `kv_token_seconds` is KV residency, where the backend measures it.
    """

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    kv_token_seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.output_tokens + other.output_tokens,
            self.kv_token_seconds + other.kv_token_seconds,
        )

    @property
    def computed_tokens(self) -> int:
        """Tokens the model computed: prefill plus decode (cached prefill excluded)."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Sample:
    """What one lane produced. `usage` is this lane's share of the request's usage."""

    lane: int
    text: str
    finish_reason: str  # "stop" | "length"
    usage: Usage
    logprobs: tuple[float, ...] | None = None
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text one lane produced since its previous delta (streaming)."""

    lane: int
    text: str


LaneOutcome = Sample | BackendError


@runtime_checkable
class Backend(Protocol):
    """An inference backend. One attempt per call; no retries, no budget, no logging."""

    @property
    def name(self) -> str:
        """A short name for events and logs, e.g. "simulated" or "engine:smollm2-135m"."""
        ...

    @property
    def max_lanes_per_request(self) -> int | None:
        """Largest number of lanes one request may carry (None: any)."""
        ...

    @property
    def shares_prefix(self) -> bool:
        """Whether the lanes of one request share the prompt's prefill (the ledger then
        reserves the prompt once as prefill and the rest as cached prefill)."""
        ...

    def count_prompt_tokens(self, prompt: str) -> int | None:
        """Exact prompt tokens before dispatch where the backend can count them, else None."""
        ...

    async def sample(self, request: SampleRequest) -> Sequence[Sample | BackendError]:
        """Run one attempt of every lane in `request`; one outcome per lane, in lane order.

        A lane that failed on its own is returned as a BackendError in its place; an error
        that sinks the whole request is raised.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads or device memory."""
        ...


@runtime_checkable
class StreamingBackend(Backend, Protocol):
    """A Backend that can also hand out each lane's text while the lane is being generated."""

    def stream(self, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
        """One attempt at every lane of `request`, as it happens.

        Yields a lane's `TextDelta`s in order, then its `Sample`; lanes interleave. A lane's
        deltas joined equal its Sample's text. An error that sinks the request is raised.
        Closing the iterator early cancels what is left of the request.
        """
        ...
