"""`OpenAIBackend`: the Backend protocol over any OpenAI-compatible HTTP endpoint.

One attempt per call, as the protocol asks: no retries, no budget, no logging here. A
request's lanes go out as requests of up to `max_n` lanes each (`n` > 1), so a server that
shares the prefix prefills once; with ``n = "auto"`` a server that refuses `n` or answers
with fewer choices turns merging off for the rest of the backend's life, and the backend
records one `backend.n_unsupported` event for the caller to drain and log. The HTTP requests
run in a task group inside `sample` and hand their answers over a memory stream, so each
lane is yielded the moment its request answers. The API key is checked when the backend is
built and cut out of everything the server sends back.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import ValidationError

from lanefold.backends.openai._config import OpenAIConfig, read_api_key
from lanefold.backends.openai._errors import (
    Redactor,
    error_from_status,
    first_line,
    invalid_body,
    n_limit,
    refuses_n,
    server_message,
)
from lanefold.backends.openai._transport import pooled_transport
from lanefold.backends.openai._usage import apportion
from lanefold.backends.openai._wire import build_body, parse_response
from lanefold.primitives import (
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    LaneFailure,
    LaneOutcome,
    RequestRejectedError,
    Sample,
    SampleRequest,
    ServerError,
    estimate_prompt_tokens,
    headers_from_env,
)

__all__ = ("BackendEvent", "OpenAIBackend")

# One HTTP request's answer: an outcome for each position (index into request.lanes) it carried.
_Batch = list[tuple[int, Sample | BackendError]]
_Sender = MemoryObjectSendStream[_Batch | None]


@dataclass(frozen=True, slots=True)
class BackendEvent:
    """Something the backend learnt that the caller should log, e.g. `backend.n_unsupported`."""

    type: str
    data: Mapping[str, object] = field(default_factory=dict)


class _MergeRefused(Exception):
    """An ``n > 1`` request got 400/422 under ``n = "auto"``; never leaves this module."""

    def __init__(self, error: BackendError, *, explicit: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.explicit = explicit  # the message itself says n is refused


class OpenAIBackend:
    """A Backend that samples lanes from an OpenAI-compatible server over httpx.

    Owns one `httpx.AsyncClient`, closed by `aclose` (or `async with`). The API key is read
    from the variable named by `config.api_key_env` in `environ` (default `os.environ`) when
    the backend is built; `clock` dates Retry-After; `transport` replaces the backend's own
    (aiohttp's pool on asyncio, httpx's on trio: `_transport.py`).
    """

    def __init__(
        self,
        config: OpenAIConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        environ = os.environ if environ is None else environ
        headers = dict(config.headers)
        secrets = headers_from_env(config.headers_env, environ)
        headers.update(secrets)
        key: str | None = None
        if config.api_key_env is not None:
            key = read_api_key(environ, config.api_key_env)
            headers["Authorization"] = f"Bearer {key}"
        self._redact = Redactor(key, *secrets.values())
        self._path = "chat/completions" if config.api == "chat" else "completions"
        self._where = f"POST {config.base_url}/{self._path}"
        self._client = httpx.AsyncClient(
            base_url=config.base_url + "/",
            headers=headers,
            # timeout_s bounds connect, read and write; a wait for a free connection is a
            # matter of max_connections and the loop's concurrency, not of the server.
            timeout=httpx.Timeout(config.timeout_s, pool=None),
            limits=httpx.Limits(
                max_connections=config.max_connections,
                max_keepalive_connections=config.max_connections,
            ),
            transport=transport or pooled_transport(config.max_connections),
        )
        # The endpoint merged with the base URL once, as httpx merges a relative one (which it
        # parses and checks again at every request: about 80 us of the event loop's a call).
        base = self._client.base_url
        self._url = base.copy_with(raw_path=base.raw_path + self._path.encode())
        self._merging = config.n != "never"
        self._max_n = config.max_n  # lowered where a server states a smaller limit
        self._events: list[BackendEvent] = []

    def __repr__(self) -> str:
        c = self._config
        return f"OpenAIBackend(base_url={c.base_url!r}, model={c.model!r}, api={c.api!r})"

    @property
    def name(self) -> str:
        """``openai:<model>``."""
        return f"openai:{self._config.model}"

    @property
    def max_lanes_per_request(self) -> int | None:
        """`max_n` while lanes merge into `n`, else 1: one backend call is one HTTP request
        (bar a fallback's re-requests), so the ledger's request count is the server's."""
        return self._max_n if self._merging else 1

    @property
    def merging(self) -> bool:
        """Whether lanes still go out merged into ``n > 1`` requests."""
        return self._merging

    @property
    def shares_prefix(self) -> bool:
        """While lanes go out merged as `n`, the server prefills the prompt once per request."""
        return self._merging

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        """A conservative bound, not a count: a remote server's tokenizer and chat template are
        not known before dispatch, so every byte sent counts as a token, plus the template's
        markers per request and per message (`estimate_prompt_tokens`); an actual count above
        it is recorded as `budget.overrun`."""
        return estimate_prompt_tokens(request)

    def drain_events(self) -> tuple[BackendEvent, ...]:
        """The events recorded since the last drain (at most one `backend.n_unsupported`)."""
        events, self._events = tuple(self._events), []
        return events

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        await self._client.aclose()

    async def __aenter__(self) -> OpenAIBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def sample(self, request: SampleRequest) -> AsyncGenerator[LaneOutcome, None]:
        """One attempt at every lane of `request`; each lane as soon as its HTTP request answers.

        Lanes are merged into ``n > 1`` requests only where `request.share_prefix` allows it;
        a merged request's lanes land together, a lane sent alone lands on its own. A failed
        lane is yielded as a `LaneFailure`. Raised instead: a fatal error (authentication),
        and an error that hit every lane at once (one request carried them all). Closing the
        iterator early cancels the requests still in flight.
        """
        count = len(request.lanes)
        if count == 1:  # one lane, one request: no stream and no task groups to carry it
            try:
                got = await self._request(request, [0])
            except BackendError as err:  # it hit every lane of the call: raised, as below
                raise err from None
            only = got.get(0)
            if only is None:
                raise self._bad("the response held no choice")
            yield only
            return
        send, receive = anyio.create_memory_object_stream[_Batch | None](math.inf)
        sunk: BackendError | None = None
        with send, receive:
            # Yielding inside the task group is safe only because the caller does synchronous
            # work between items and closes this iterator in its own task (the protocol's terms).
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_all, request, send)
                try:
                    while (batch := await receive.receive()) is not None:
                        sunk = _sinking(batch, count)
                        if sunk is not None:
                            break
                        for position, outcome in batch:
                            lane = request.lanes[position].lane
                            yield outcome if isinstance(outcome, Sample) else LaneFailure(lane, outcome)
                except GeneratorExit:
                    pass  # closed early: the finally below cancels what is still in flight
                finally:
                    tg.cancel_scope.cancel()
        if sunk is not None:
            raise sunk  # outside the task group, so the caller gets it bare, not in a group

    async def _send_all(self, request: SampleRequest, send: _Sender) -> None:
        """Every lane's requests; each answer sent on as it lands, then None."""
        positions = list(range(len(request.lanes)))
        async with anyio.create_task_group() as tg:
            if self._merging and request.share_prefix and len(positions) > 1:
                step = self._max_n
                for start in range(0, len(positions), step):
                    tg.start_soon(self._merged, request, positions[start : start + step], send)
            else:
                tg.start_soon(self._singles, request, positions, send)
        send.send_nowait(None)

    async def _singles(self, request: SampleRequest, positions: list[int], send: _Sender) -> None:
        async def one(position: int) -> None:
            outcome: Sample | BackendError
            try:
                got = await self._request(request, [position])
                outcome = got.get(position) or self._bad("the response held no choice")
            except BackendError as err:
                outcome = err
            send.send_nowait([(position, outcome)])

        async with anyio.create_task_group() as tg:
            for position in positions:
                tg.start_soon(one, position)

    async def _merged(self, request: SampleRequest, positions: list[int], send: _Sender) -> None:
        if len(positions) == 1:
            await self._singles(request, positions, send)
            return
        try:
            got = await self._request(request, positions)
        except _MergeRefused as refused:
            limit = n_limit(str(refused.error))
            if limit is not None and 1 < limit < len(positions):
                # The server takes n, up to a limit it states (llama-server: its slots): split.
                self._max_n = min(self._max_n, limit)
                async with anyio.create_task_group() as tg:
                    for start in range(0, len(positions), limit):
                        tg.start_soon(self._merged, request, positions[start : start + limit], send)
                return
            got = {}
            if not refused.explicit:
                # An unexplained 400: is it n? Ask for the first lane alone to find out.
                try:
                    got = await self._request(request, positions[:1])
                except BackendError as err:
                    send.send_nowait([(position, err) for position in positions])
                    return
            self._stop_merging("refused", len(positions), None, str(refused.error))
        except BackendError as err:
            send.send_nowait([(position, err) for position in positions])
            return
        landed: _Batch = list(got.items())
        missing = [p for p in positions if p not in got]
        if missing and self._config.n == "auto":
            self._stop_merging("fewer_choices", len(positions), len(got), None)
        elif missing:
            short = self._bad(f"{len(got)} of {len(positions)} choices returned for n")
            landed += [(position, short) for position in missing]
            missing = []
        if landed:
            send.send_nowait(sorted(landed, key=lambda item: item[0]))
        if missing:
            await self._singles(request, missing, send)

    def _stop_merging(self, reason: str, requested: int, received: int | None, message: str | None) -> None:
        if not self._merging:
            return
        self._merging = False
        data: dict[str, object] = {
            "backend": self.name,
            "reason": reason,
            "requested_n": requested,
            "received_choices": received,
        }
        if message is not None:
            data["message"] = message
        self._events.append(BackendEvent("backend.n_unsupported", data))

    async def _request(self, request: SampleRequest, positions: list[int]) -> dict[int, Sample]:
        """One HTTP request for the lanes at `positions`; the samples of the choices returned."""
        lanes = [request.lanes[p] for p in positions]
        n = len(lanes)
        max_tokens = min(lane.max_tokens for lane in lanes)  # no lane exceeds its allotment
        seed = lanes[0].seed
        body = build_body(self._config, request, n=n, seed=seed, max_tokens=max_tokens)
        status, headers, raw = await self._exchange(body)
        if not 200 <= status < 300:
            err = error_from_status(
                status, headers, raw, where=self._where, redact=self._redact, now=self._clock()
            )
            if n > 1 and self._config.n == "auto" and status in (400, 422):
                if type(err) is RequestRejectedError:
                    raise _MergeRefused(err, explicit=refuses_n(server_message(raw)))
            raise err
        try:
            choices, usage = parse_response(self._config.api, raw)
        except ValidationError as exc:
            raise self._bad(f"malformed body ({invalid_body(exc)})") from None
        except ValueError as exc:
            raise self._bad(f"malformed body ({first_line(exc, self._redact)})") from None
        slots: dict[int, int] = {}
        for order, choice in enumerate(choices):
            slot = order if choice.index is None else choice.index
            if slot >= n or slot in slots:
                raise self._bad(f"choice index {slot} for n={n}")
            slots[slot] = order
        ordered = sorted(slots.items())
        tallies = [choices[order].tally() for _, order in ordered]
        prompt_bytes = len((request.prompt + (self._config.system_prompt or "")).encode())
        split = apportion(
            tallies,
            prompt_tokens=usage.prompt_tokens if usage is not None else None,
            cached_tokens=usage.cached_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else None,
            max_tokens=max_tokens,
            prompt_bytes=prompt_bytes,
        )
        extra: dict[str, object] = {"usage_apportioned_by": split.method, "n": n, "seed": seed}
        if split.reported_completion_tokens not in (None, split.billed_completion_tokens):
            extra["usage_reported_completion_tokens"] = split.reported_completion_tokens
        samples: dict[int, Sample] = {}
        for (slot, order), lane_usage in zip(ordered, split.usages, strict=True):
            choice = choices[order]
            text = self._redact(choice.text)  # a server may echo the key in a completion too
            # Token texts only where they add up to the text as told: a redacted key's pieces
            # must not survive in them.
            tokens = choice.tokens if request.params.logprobs else None
            if tokens is not None and "".join(tokens) != text:
                tokens = None
            # Alternatives go with the token texts (the same redaction holds), trimmed to the
            # number asked for; a server that sends none leaves them None.
            top = None
            if tokens is not None and request.params.top_logprobs and choice.top_logprobs:
                top = tuple(step[: request.params.top_logprobs] for step in choice.top_logprobs)
            said = dict(extra)
            if choice.tool_calls:  # the lane's text is its first call; a second is dropped, and said
                said["tool_calls"] = choice.tool_calls
            samples[positions[slot]] = Sample(
                lane=lanes[slot].lane,
                text=text,
                finish_reason=self._redact(choice.finish_reason),
                usage=lane_usage,
                logprobs=choice.logprobs if request.params.logprobs else None,
                extra=said,
                tokens=tokens,
                top_logprobs=top,
            )
        return samples

    async def _exchange(self, body: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        """POST `body`; status, headers and the whole body, or a transport error mapped.

        httpx's exception is not chained (`from None`): its text may carry what the server
        sent, and a traceback prints a cause unredacted. Its first line, redacted, is kept.
        """
        try:
            async with self._client.stream("POST", self._url, json=body) as response:
                try:
                    raw = await response.aread()
                except httpx.TimeoutException:
                    raise BackendTimeoutError(f"{self._where}: timed out reading body") from None
                except httpx.TransportError as exc:
                    raise self._bad(f"truncated body ({first_line(exc, self._redact)})") from None
                except httpx.DecodingError as exc:
                    raise self._bad(f"undecodable body ({first_line(exc, self._redact)})") from None
                return response.status_code, response.headers, raw
        except httpx.TimeoutException:
            raise BackendTimeoutError(
                f"{self._where}: no answer within {self._config.timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise ServerError(f"{self._where}: {first_line(exc, self._redact)}") from None

    def _bad(self, what: str) -> BadResponseError:
        return BadResponseError(self._redact(f"{self._where}: {what}"))


def _sinking(batch: _Batch, count: int) -> BackendError | None:
    """The error in `batch` that sinks the rest of a call of `count` lanes: a fatal one, or
    one error that hit every lane of the call at once."""
    errors = [outcome for _, outcome in batch if isinstance(outcome, BackendError)]
    fatal = next((err for err in errors if err.fatal), None)
    if fatal is not None:
        return fatal
    if len(errors) == len(batch) == count and all(err is errors[0] for err in errors):
        return errors[0]
    return None
