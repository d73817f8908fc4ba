"""`EngineBackend`: the Backend protocol over the in-process engine.

The engine steps in a worker thread (`anyio.to_thread.run_sync`), so the event loop never
blocks on the model. Concurrent `sample` calls share it: each posts its request to an inbox,
and whichever caller finds the engine idle drives it, in the thread, until some lane of any
request finishes; then every caller hands on the lanes of its own that landed, and one of
those still waiting drives on. Requests that arrive meanwhile join the running batch at the
next step.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.from_thread
import anyio.to_thread

from lanefold.backends.engine._config import EngineConfig
from lanefold.backends.engine._engine import Engine, ThreadTuner, load_tokenizer
from lanefold.backends.engine._sequence import Sequence as Lane
from lanefold.backends.engine._ticket import Ticket, lane_sample, settled_text
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.primitives import (
    BackendError,
    ConfigError,
    LanefoldError,
    LaneOutcome,
    RequestRejectedError,
    Sample,
    SampleRequest,
    ServerError,
    TextDelta,
    text_prompt,
    tool_choice_in_effect,
)

__all__ = ("EngineBackend",)


class EngineBackend:
    """Samples K lanes of a prompt with the bundled engine: the prompt is prefilled once.

    Each lane is handed back as soon as it stops, while the request's other lanes decode on.
    A request's `schema` holds every lane to it by constrained decoding (`_grammar`).
    """

    def __init__(self, config: EngineConfig | None = None, *, engine: Engine | None = None) -> None:
        self.config = config or EngineConfig()
        self._engine = engine
        self._tokenizer = engine.tokenizer if engine is not None else None
        self._inbox: list[Ticket] = []
        self._inbox_lock = threading.Lock()
        self._owners: dict[Lane, Ticket] = {}  # every lane still decoding, and whose it is
        self._load_lock: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._driving = False
        self._closed = False
        self._streams = 0  # live `stream` calls: while any, the driver hands back after each step
        self._tuner: ThreadTuner | None = None  # threads left to the default: kept up to date

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
        """The loaded engine, or None before the first `load` or `sample`."""
        return self._engine

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        """Exact prompt tokens of `request` as it is sent: the ids `sample` prefills (a chat's
        messages through the model's chat template), counted by the same function (the first
        call reads the tokenizer from the model file)."""
        return len(self._prompt_ids(request))

    def context_left(self, request: SampleRequest) -> int | None:
        """Tokens the model's context holds after `request`'s prompt; None before `load`."""
        if self._engine is None:
            return None
        return self._engine.model.args.max_position - len(self._prompt_ids(request))

    async def load(self) -> None:
        """Load the model now; `sample` loads it on first use otherwise.

        For callers that keep loading out of what they time (a run's `max_seconds`).
        """
        if self._closed:
            raise ConfigError("EngineBackend is closed")
        self._load_lock = self._load_lock or anyio.Lock()
        async with self._load_lock:
            if self._engine is None:
                self._engine = await anyio.to_thread.run_sync(
                    Engine.from_config, self.config, self._tokenizer
                )
                self._tokenizer = self._engine.tokenizer
                if self.config.threads is None and self._engine.runner.device.type == "cpu":
                    self._tuner = ThreadTuner()

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        """Generate every lane of `request`, yielding each lane's Sample as soon as it stops.

        Lanes come in the order they finish. A failed engine step raises for the lanes not yet
        yielded; closing the iterator early aborts them.
        """
        ticket = await self._submit(request)
        try:
            while True:
                done = ticket.done  # read first: every lane lands before `done` is set
                while ticket.landed:
                    yield ticket.landed.popleft()
                if done:
                    break
                await self._advance()
        finally:
            self._withdraw(ticket)
        if ticket.error is not None:
            raise ticket.error

    async def stream(self, request: SampleRequest) -> AsyncIterator[TextDelta | Sample]:
        """Generate every lane of `request`, yielding each lane's new text after every step.

        Text that may still turn out to be the start of a stop string, or half of a character
        spread over two tokens, is held back until a later step settles it. A lane's Sample
        follows its last delta as soon as the lane stops. Closing the iterator early aborts
        the request.
        """
        ticket = await self._submit(request, streaming=True)
        sent = {lane.lane: "" for lane in request.lanes}  # lanes whose Sample has not gone out
        self._streams += 1
        try:
            while True:
                done = ticket.done
                for lane, text in ticket.partial.items():
                    old = sent.get(lane)
                    if old is not None and len(text) > len(old) and text.startswith(old):
                        sent[lane] = text
                        yield TextDelta(lane, text[len(old) :])
                while ticket.landed:
                    sample = ticket.landed.popleft()
                    old = sent.pop(sample.lane, "")
                    if len(sample.text) > len(old):
                        yield TextDelta(sample.lane, sample.text[len(old) :])
                    yield sample
                if done:
                    break
                await self._advance()
        finally:
            self._streams -= 1
            self._withdraw(ticket)
        if ticket.error is not None:
            raise ticket.error

    async def aclose(self) -> None:
        """Drop the engine and its KV memory. Call it once no `sample` is in flight."""
        self._closed = True
        self._engine = None

    def prompt_text(self, request: SampleRequest) -> str:
        """The text the engine prefills for `request` (what `count_prompt_tokens` counts): its
        messages through the model's chat template with its tools (through the template where
        it reads `tools`, else in the system turn, `lanefold.primitives.tool_turns`); without
        messages (the "raw" form) or without a template, `text_prompt`'s text (the tools' block
        before the prompt), or with the deprecated `chat_template = true` that prompt as one
        user turn (a log recorded before the form). The first call reads the tokenizer."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config)
        tokenizer: Tokenizer = self._tokenizer
        choice = tool_choice_in_effect(request)
        if request.messages is not None and tokenizer.chat_template:
            return tokenizer.render_chat(request.messages, request.tools, choice)
        if request.messages is None and self.config.chat_template:
            return tokenizer.render_chat(request.prompt, request.tools, choice)
        return text_prompt(request)

    def _prompt_ids(self, request: SampleRequest) -> list[int]:
        text = self.prompt_text(request)
        assert self._tokenizer is not None
        return self._tokenizer.encode(text)

    async def _submit(self, request: SampleRequest, *, streaming: bool = False) -> Ticket:
        await self.load()
        ticket = Ticket(request, self._prompt_ids(request), streaming)
        if not ticket.prompt_ids:
            raise RequestRejectedError("the prompt encodes to no tokens")
        if request.schema is not None and self._engine is not None:
            # compiled here, off the event loop: a bad schema fails this call in one line, and
            # the engine thread finds it compiled when it queues the lanes
            await anyio.to_thread.run_sync(self._engine.compile_schema, request.schema)
        with self._inbox_lock:
            self._inbox.append(ticket)
        return ticket

    def _withdraw(self, ticket: Ticket) -> None:
        """Abort what is left of an abandoned ticket: now if the engine is idle, else at the
        driver's next step."""
        if ticket.done:
            return
        ticket.cancelled = True
        with self._inbox_lock:
            self._inbox.append(ticket)
        if not self._driving and self._engine is not None:  # no thread touches the engine
            self._take_inbox(self._engine)

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
        """In the worker thread: step the engine until some lane finishes or nothing is left."""
        engine = self._engine
        assert engine is not None
        while True:
            anyio.from_thread.check_cancelled()
            if self._take_inbox(engine) or not engine.has_work():
                return
            if self._tuner is not None:
                self._tuner.retune()  # other jobs came or went: the threads follow
            try:
                finished = engine.step()
            except Exception as exc:  # a failed step sinks every request in flight
                self._fail_all(engine, ServerError(f"engine step failed: {exc!r}"))
                return
            landed = bool(finished) and self._land(finished, engine.decode_paths().record())
            if self._streams:
                self._show_progress()
                return
            if landed:
                return

    def _land(self, finished: list[Lane], paths: dict[str, object]) -> bool:
        """Hand each finished lane to its ticket, with the decode paths its step took; True
        when any ticket got one."""
        landed = False
        for lane in finished:
            ticket = self._owners.pop(lane, None)
            if ticket is None or ticket.engine_request is None:
                continue
            sample = lane_sample(ticket.request, lane, paths)
            if sample.logprobs is not None and self._tokenizer is not None:
                text = _token_texts(self._tokenizer)
                tokens = tuple(text(i) for i in lane.output_ids[: len(sample.logprobs)])
                top = None
                if ticket.request.params.top_logprobs:
                    top = tuple(
                        tuple((text(i), value) for i, value in step)
                        for step in lane.top_logprobs[: len(sample.logprobs)]
                    )
                sample = dataclasses.replace(sample, tokens=tokens, top_logprobs=top)
            ticket.landed.append(sample)
            ticket.done = ticket.engine_request.finished
            landed = True
        return landed

    def _show_progress(self) -> None:
        """Publish the settled text of every streaming ticket's running lanes."""
        tokenizer = self._tokenizer
        assert tokenizer is not None
        texts: dict[Ticket, dict[int, str]] = {}
        for lane, ticket in self._owners.items():
            if ticket.streaming:
                text = settled_text(tokenizer.decode(lane.output_ids), lane.params.stop)
                texts.setdefault(ticket, {})[lane.lane] = text
        for ticket, partial in texts.items():
            ticket.partial = partial  # a new dict: the caller may be reading the old one

    def _take_inbox(self, engine: Engine) -> bool:
        """Apply posted adds and cancels; True when one of them settled a ticket."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        settled = False
        for ticket in inbox:
            if ticket.cancelled:
                if ticket.engine_request is not None:
                    engine.abort(ticket.engine_request)
                    for lane in ticket.engine_request.sequences:
                        self._owners.pop(lane, None)
                continue
            req = ticket.request
            if not req.lanes:
                ticket.done, settled = True, True
                continue
            try:
                ticket.engine_request = engine.add_request(
                    ticket.prompt_ids, req.params, req.lanes, share_prefix=req.share_prefix, schema=req.schema
                )
            except LanefoldError as exc:
                ticket.error, ticket.done, settled = exc, True, True
                continue
            for lane in ticket.engine_request.sequences:
                self._owners[lane] = ticket
        return settled

    def _fail_all(self, engine: Engine, error: BackendError) -> None:
        engine.reset()
        for ticket in set(self._owners.values()):
            ticket.error, ticket.done = error, True
        self._owners.clear()


def _token_texts(tokenizer: Tokenizer) -> Callable[[int], str]:
    """Each token id's own text, decoded once per lane however often it recurs (alternatives
    repeat the same few ids at many positions)."""
    seen: dict[int, str] = {}

    def text(token: int) -> str:
        found = seen.get(token)
        if found is None:
            found = seen[token] = tokenizer.decode([token])
        return found

    return text
