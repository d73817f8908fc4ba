"""The Backend seam: what crosses between the dispatch path and an inference backend.

A backend makes ONE attempt at a request of K lanes that share a prompt and hands back each
lane's outcome as soon as that lane lands. Retries, budget, timeouts and logging live in the
dispatch path above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Protocol, runtime_checkable

from pydantic import AfterValidator, Field

from lanefold.primitives._errors import BackendError, BadResponseError
from lanefold.primitives._since import at_most
from lanefold.primitives._tools import ToolSpec

__all__ = (
    "MAX_LANE_TOKENS",
    "Backend",
    "ChatMessage",
    "ContextWindow",
    "LaneFailure",
    "LaneOutcome",
    "LaneRequest",
    "LaneTokens",
    "Loadable",
    "MessageToolCall",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "StreamingBackend",
    "TextDelta",
    "Usage",
    "closing",
    "estimate_prompt_tokens",
    "sample_all",
)

# The conservative estimate of a request's prompt tokens where its backend cannot count them
# (a remote server's tokenizer and chat template are not known before dispatch): every byte of
# what is sent may be a token (a byte-level BPE token is at least one byte), and the template
# wraps it in markers: per request, up to `REQUEST_MARGIN` (the beginning of sequence, a
# default system turn such as SmolLM2's or Qwen2.5's, about 20 tokens, and the assistant's
# opening), and per message `MESSAGE_MARGIN` (a turn's start, role and end markers: 5 for
# ChatML and Llama 3).
REQUEST_MARGIN = 48
MESSAGE_MARGIN = 8


MAX_LANE_TOKENS = 2**31 - 1
"""The most tokens one lane may be given to write (and a prompt's or a canned output's size in a
config): the largest count a 32-bit signed integer holds, far past any model's context, and
small enough that a wave of 100,000 such lanes (2**48 tokens) is still a count a bill and a
JSON number carry exactly (`events.MAX_QUANTITY`, 2**53). A config past it is refused when read."""
LaneTokens = Annotated[
    int, Field(json_schema_extra={"maximum": MAX_LANE_TOKENS}), AfterValidator(at_most(MAX_LANE_TOKENS))
]
"""A config's count of a lane's tokens: at most `MAX_LANE_TOKENS` (a recorded config written
before the bound is let through, `reading_a_record`)."""


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
    # With `logprobs`: also this many most likely tokens at each output position, under the
    # same distribution as the sampled token's logprob (Sample.top_logprobs). 0: none.
    top_logprobs: int = 0


@dataclass(frozen=True, slots=True)
class LaneRequest:
    """One lane of a request: its index in the wave, its seed and its carved token allotment."""

    lane: int
    seed: int
    max_tokens: int
    attempt: int = 1  # 1 for the first dispatch of the lane; a retry or a resume raises it


@dataclass(frozen=True, slots=True)
class MessageToolCall:
    """A call an assistant turn made, as OpenAI's `tool_calls` items hold it: its `id`, the
    function's `name` and its `arguments` as JSON text (hashable, as a request must be)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation: `role` is "system", "developer", "user", "assistant" or
    "tool"."""

    role: str
    content: str
    tool_calls: tuple[MessageToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a "tool" turn: the call it answers
    name: str | None = None  # a "tool" turn: the function's name, where the client gave it


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """K lanes that share one prompt.

    `share_prefix` says the backend may prefill the prompt once for all lanes; the ledger
    then prices the prompt once as prefill and the rest as cached prefill. `messages`, where
    set, is the conversation `prompt` was flattened from (a chat request): a backend that knows
    its model's chat template renders the messages instead, one that does not sends `prompt`.

    `tools` and `tool_choice` are the run's (a server that takes tools natively, as OpenAI's
    API does, gets them as they are). `schema` is the JSON text of a JSON Schema every lane's
    output text must conform to (a call of the tools, `tools_schema`, or `[extract] schema`):
    a backend that can constrain decoding to it does, one that cannot passes it on (OpenAI's
    `response_format`) or ignores it, and the extractor then refuses what does not conform.
    """

    prompt: str
    params: SamplingParams
    lanes: tuple[LaneRequest, ...]
    share_prefix: bool = True
    purpose: str = "sample"  # what the loop calls the wave ("sample", "judge", ...)
    wave: int = 0
    messages: tuple[ChatMessage, ...] | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    # JSON text of a JSON Schema (draft 2020-12 subset) every lane's output text must conform
    # to; a backend that can constrain decoding to it does (the engine), one that cannot passes
    # it on (openai: response_format) or ignores it (the extractor then refuses non-conforming
    # text)
    schema: str | None = None


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
    tokens: tuple[str, ...] | None = None  # each output token's text, beside `logprobs`
    # Beside `logprobs`, where `params.top_logprobs` asked and the backend computes them: for
    # each output token, the most likely tokens there as (text, logprob), most likely first.
    top_logprobs: tuple[tuple[tuple[str, float], ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text one lane produced since its previous delta (streaming)."""

    lane: int
    text: str


@dataclass(frozen=True, slots=True)
class LaneFailure:
    """One lane's attempt failed on its own; the other lanes of its request may still land."""

    lane: int
    error: BackendError


LaneOutcome = Sample | LaneFailure
"""What a backend yields for each lane of a request: its sample, or its failure."""


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

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        """The prompt tokens `request` costs as this backend will send it (its `messages`
        through the model's chat template where the backend renders them), before dispatch:
        exact where the backend counts them (its tokenizer, its template), a conservative
        bound where it can only estimate, None where it cannot tell (the dispatch path then
        holds `estimate_prompt_tokens(request)`). `request.lanes` may be empty: the count is
        the prompt's, not the lanes'."""
        ...

    def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        """One attempt at every lane of `request`, each lane's outcome as soon as it lands.

        Yields one `Sample` or `LaneFailure` per lane, in the order the lanes finish; a
        backend that cannot tell lanes apart before the end yields them all at the end. An
        error that sinks what is left of the request is raised (lanes already yielded stand).
        The caller does only synchronous work between items and closes the iterator
        (`contextlib.aclosing`) when it stops early, which cancels the lanes still running.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads or device memory."""
        ...


@runtime_checkable
class Loadable(Protocol):
    """A backend with something to make ready before its first request (the bundled engine
    loads its model): the facade awaits `load()` once, before the run's first wave or before
    `serve` takes its first client, so a model that cannot load fails early, in one line."""

    async def load(self) -> None:
        """Make the backend ready; a second call returns at once."""
        ...


@runtime_checkable
class ContextWindow(Protocol):
    """A backend that knows its model's context window (the bundled engine does)."""

    def context_left(self, request: SampleRequest) -> int | None:
        """Tokens left for output after `request`'s prompt as this backend will encode it
        (chat template and all); None where it cannot tell yet."""
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


def estimate_prompt_tokens(request: SampleRequest) -> int:
    """A conservative count of `request`'s prompt tokens for a backend that cannot count them:
    the UTF-8 bytes of what is sent (the messages' contents and calls, else the prompt as one
    message, and the tools' JSON, which a server renders into the prompt) plus the chat template's
    markers (`REQUEST_MARGIN`, and `MESSAGE_MARGIN` per message). An actual count above it is
    recorded as `budget.overrun`, never silently."""
    if request.messages is None:
        texts: tuple[str, ...] = (request.prompt,)
    else:
        texts = tuple(_sent_text(m) for m in request.messages)
    tools = tuple(tool.name + tool.description + tool.parameters for tool in request.tools)
    body = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts + tools)
    return body + REQUEST_MARGIN + MESSAGE_MARGIN * len(texts)


def _sent_text(message: ChatMessage) -> str:
    """What of a turn is sent: its content, an assistant's calls (id, name, arguments), a tool
    turn's `tool_call_id` and `name`."""
    calls = "".join(call.id + call.name + call.arguments for call in message.tool_calls)
    return message.content + calls + (message.tool_call_id or "") + (message.name or "")


@contextlib.asynccontextmanager
async def closing(outcomes: AsyncIterator[LaneOutcome]) -> AsyncIterator[AsyncIterator[LaneOutcome]]:
    """`contextlib.aclosing` for any async iterator: closes it (when it can be closed) however
    the block ends, so a backend's generator never outlives the request it serves."""
    try:
        yield outcomes
    finally:
        aclose = getattr(outcomes, "aclose", None)
        if aclose is not None:
            await aclose()


async def sample_all(backend: Backend, request: SampleRequest) -> list[Sample | BackendError]:
    """Every lane's outcome of one `backend.sample` call, in lane order (for callers that want
    the whole request at once, such as a server answering `n` choices).

    A lane the backend never answered gets a `BadResponseError`; a request-sinking error is
    raised as the backend raised it.
    """
    landed: dict[int, Sample | BackendError] = {}
    async with closing(backend.sample(request)) as outcomes:
        async for outcome in outcomes:
            landed[outcome.lane] = outcome if isinstance(outcome, Sample) else outcome.error
    missing = BadResponseError(f"{backend.name} returned no outcome for the lane")
    return [landed.get(lane.lane, missing) for lane in request.lanes]
