"""`EngineBackend`: the Backend protocol over the in-process engine.

The engine steps in a worker thread (`anyio.to_thread.run_sync`), so the event loop never
blocks on the model. Concurrent `sample` calls share it: each posts its request to an inbox,
and whichever caller finds the engine idle drives it, in the thread, until some request
finishes; then every caller looks at its own result and one of those still waiting drives on.
Requests that arrive meanwhile join the running batch at the next step.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.from_thread
import anyio.to_thread

from backends.engine._config import EngineConfig
from backends.engine._engine import Engine, load_tokenizer
from backends.engine._sequence import EngineRequest
from backends.engine._tokenizer import Tokenizer
from primitives import (
    BackendError,
    ConfigError,
    LanefoldError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    ServerError,
    TextDelta,
    Usage,
)

__all__ = ("EngineBackend",)


@dataclass(slots=True, eq=False)
class _Ticket:
    """One `sample` call as the engine thread sees it."""

    request: SampleRequest
    prompt_ids: list[int]
    engine_request: EngineRequest | None = None
    samples: list[Sample] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False
    cancelled: bool = False


class EngineBackend:
    """Samples K lanes of a prompt with the bundled engine: the prompt is prefilled once."""

    def __init__(self, config: EngineConfig | None = None, *, engine: Engine | None = None) -> None:
        self.config = config or EngineConfig()
        self._engine = engine
        self._tokenizer = engine.tokenizer if engine is not None else None
        self._inbox: list[_Ticket] = []
        self._inbox_lock = threading.Lock()
        self._tickets: dict[EngineRequest, _Ticket] = {}
        self._load_lock: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._driving = False
        self._closed = False
        self._streams = 0  # live `stream` calls: while any, the driver hands back after each step

    @property
    def name(self) -> str:
        """`engine:<model>`."""
        return f"engine:{self.config.model}"

    @property
    def max_lanes_per_request(self) -> int | None:
        """A request's lanes decode in one batch, so at most `max_batch_lanes` of them."""
        return self.config.max_batch_lanes

    @property
    def shares_prefix(self) -> bool:
        """A request's lanes fork one prefilled prompt: prefill once, cached for the rest."""
        return True

    @property
    def engine(self) -> Engine | None:
        """The loaded engine, or None before the first `sample`."""
        return self._engine

    def count_prompt_tokens(self, prompt: str) -> int | None:
        """Exact prompt tokens (the first call reads the tokenizer from the model file)."""
        return len(self._encode(prompt))

    async def sample(self, request: SampleRequest) -> Sequence[Sample | BackendError]:
        """Generate every lane of `request`; one Sample per lane, in lane order."""
        ticket = await self._submit(request)
        try:
            while not ticket.done:
                await self._advance()
        finally:
            self._withdraw(ticket)
        if ticket.error is not None:
            raise ticket.error
        return ticket.samples

    async def stream(self, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
        """Generate every lane of `request`, yielding each lane's new text after every step.

        Text that may still turn out to be the start of a stop string, or half of a character
        spread over two tokens, is held back until the next step settles it. A lane's Sample
        follows its last delta once the whole request is done. Closing the iterator early
        aborts the request.
        """
        ticket = await self._submit(request)
        tokenizer = self._tokenizer
        assert tokenizer is not None
        sent = {lane.lane: "" for lane in request.lanes}
        self._streams += 1
        try:
            while not ticket.done:
                await self._advance()
                if ticket.done or ticket.engine_request is None:
                    continue
                for seq in list(ticket.engine_request.sequences):
                    if seq.finish_reason is not None:  # finished in this step: text is final
                        text = seq.text
                    else:
                        text = settled_text(tokenizer.decode(seq.output_ids), request.params.stop)
                    old = sent[seq.lane]
                    if len(text) > len(old) and text.startswith(old):
                        sent[seq.lane] = text
                        yield TextDelta(seq.lane, text[len(old) :])
            if ticket.error is not None:
                raise ticket.error
            for sample in ticket.samples:
                if len(sample.text) > len(sent[sample.lane]):
                    yield TextDelta(sample.lane, sample.text[len(sent[sample.lane]) :])
                yield sample
        finally:
            self._streams -= 1
            self._withdraw(ticket)

    async def aclose(self) -> None:
        """Drop the engine and its KV memory. Call it once no `sample` is in flight."""
        self._closed = True
        self._engine = None

    async def _load(self) -> None:
        if self._closed:
            raise ConfigError("EngineBackend is closed")
        self._load_lock = self._load_lock or anyio.Lock()
        async with self._load_lock:
            if self._engine is None:
                self._engine = await anyio.to_thread.run_sync(
                    Engine.from_config, self.config, self._tokenizer
                )
                self._tokenizer = self._engine.tokenizer

    def _encode(self, prompt: str) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config)
        tokenizer: Tokenizer = self._tokenizer
        return tokenizer.encode(prompt, chat=self.config.chat_template)

    async def _submit(self, request: SampleRequest) -> _Ticket:
        await self._load()
        ticket = _Ticket(request, self._encode(request.prompt))
        if not ticket.prompt_ids:
            raise RequestRejectedError("the prompt encodes to no tokens")
        with self._inbox_lock:
            self._inbox.append(ticket)
        return ticket

    def _withdraw(self, ticket: _Ticket) -> None:
        if not ticket.done:  # cancelled: the engine thread drops it at its next step
            ticket.cancelled = True
            with self._inbox_lock:
                self._inbox.append(ticket)

    async def _advance(self) -> None:
        """Return once the engine has moved: drive it one round, or wait out another's round."""
        self._changed = self._changed or anyio.Event()
        if self._driving:
            await self._changed.wait()
            return
        self._driving = True
        try:
            await anyio.to_thread.run_sync(self._drive)
        finally:
            self._driving = False
            changed, self._changed = self._changed, anyio.Event()
            changed.set()

    def _drive(self) -> None:
        """In the worker thread: step the engine until some request finishes or none is left."""
        engine = self._engine
        assert engine is not None
        while True:
            anyio.from_thread.check_cancelled()
            if self._take_inbox(engine) or not engine.has_work():
                return
            try:
                finished = engine.step()
            except Exception as exc:  # a failed step sinks every request in flight
                self._fail_all(engine, ServerError(f"engine step failed: {exc!r}"))
                return
            for engine_request in finished:
                ticket = self._tickets.pop(engine_request)
                ticket.samples = _samples(ticket.request, engine_request)
                ticket.done = True
            if finished or self._streams:
                return

    def _take_inbox(self, engine: Engine) -> bool:
        """Apply posted adds and cancels; True when one of them settled a ticket."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        settled = False
        for ticket in inbox:
            if ticket.cancelled:
                if ticket.engine_request is not None:
                    engine.abort(ticket.engine_request)
                    self._tickets.pop(ticket.engine_request, None)
                continue
            req = ticket.request
            try:
                ticket.engine_request = engine.add_request(
                    ticket.prompt_ids, req.params, req.lanes, share_prefix=req.share_prefix
                )
            except LanefoldError as exc:
                ticket.error, ticket.done, settled = exc, True, True
                continue
            self._tickets[ticket.engine_request] = ticket
        return settled

    def _fail_all(self, engine: Engine, error: BackendError) -> None:
        engine.reset()
        for ticket in self._tickets.values():
            ticket.error, ticket.done = error, True
        self._tickets.clear()


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


def _samples(request: SampleRequest, done: EngineRequest) -> list[Sample]:
    extra = done.metrics.as_extra()
    return [
        Sample(
            lane=seq.lane,
            text=seq.text,
            finish_reason=seq.finish_reason or "stop",
            usage=Usage(
                input_tokens=seq.input_tokens,
                cached_input_tokens=seq.cached_input_tokens,
                output_tokens=seq.num_generated,
                kv_token_seconds=seq.kv_token_seconds,
            ),
            logprobs=tuple(seq.logprobs) if request.params.logprobs else None,
            extra=dict(extra),
        )
        for seq in done.sequences
    ]
