"""`OpenAIBackend`: the Backend protocol over any OpenAI-compatible HTTP endpoint.

One attempt per call, as the protocol asks: no retries, no budget, no logging here. A
request's lanes go out as requests of up to `max_n` lanes each (`n` > 1), so a server that
shares the prefix prefills once; with ``n = "auto"`` a server that refuses `n` or answers
with fewer choices turns merging off for the rest of the backend's life, and the backend
records one `backend.n_unsupported` event for the caller to drain and log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import httpx
from pydantic import ValidationError

from backends.openai._config import OpenAIConfig
from backends.openai._errors import Redactor, error_from_status, n_limit, refuses_n, server_message
from backends.openai._usage import apportion
from backends.openai._wire import build_body, parse_response
from primitives import (
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    ConfigError,
    RequestRejectedError,
    Sample,
    SampleRequest,
    ServerError,
)

__all__ = ("BackendEvent", "OpenAIBackend")

_Outcomes = list[Sample | BackendError | None]


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
    the backend is built; `clock` dates Retry-After; `transport` replaces httpx's default.
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
        headers = dict(config.headers)
        key: str | None = None
        if config.api_key_env is not None:
            key = (os.environ if environ is None else environ).get(config.api_key_env)
            if not key:
                raise ConfigError(f"environment variable {config.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._redact = Redactor(key)
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
            transport=transport,
        )
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

    def count_prompt_tokens(self, prompt: str) -> int | None:
        """None: a remote server's tokenizer is not known before dispatch."""
        return None

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

    async def sample(self, request: SampleRequest) -> Sequence[Sample | BackendError]:
        """One attempt at every lane of `request`; one outcome per lane, in lane order.

        Lanes are merged into ``n > 1`` requests only where `request.share_prefix` allows
        it. Raises the error when every lane failed, or when one failure is fatal
        (authentication); otherwise failed lanes hold their error in place.
        """
        count = len(request.lanes)
        outcomes: _Outcomes = [None] * count
        positions = list(range(count))
        async with anyio.create_task_group() as tg:
            if self._merging and request.share_prefix and count > 1:
                step = self._max_n
                for start in range(0, count, step):
                    chunk = positions[start : start + step]
                    tg.start_soon(self._merged, request, chunk, outcomes)
            else:
                tg.start_soon(self._singles, request, positions, outcomes)
        done: list[Sample | BackendError] = [o for o in outcomes if o is not None]
        assert len(done) == count, "every lane has an outcome"
        errors = [o for o in done if isinstance(o, BackendError)]
        fatal = [e for e in errors if e.fatal]
        if fatal or (errors and len(errors) == count):
            raise (fatal or errors)[0]
        return done

    async def _singles(self, request: SampleRequest, positions: list[int], out: _Outcomes) -> None:
        async def one(position: int) -> None:
            try:
                got = await self._request(request, [position])
                out[position] = got.get(position) or BadResponseError(
                    f"{self._where}: the response held no choice"
                )
            except BackendError as err:
                out[position] = err

        async with anyio.create_task_group() as tg:
            for position in positions:
                tg.start_soon(one, position)

    async def _merged(self, request: SampleRequest, positions: list[int], out: _Outcomes) -> None:
        if len(positions) == 1:
            await self._singles(request, positions, out)
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
                        tg.start_soon(self._merged, request, positions[start : start + limit], out)
                return
            got = {}
            if not refused.explicit:
                # An unexplained 400: is it n? Ask for the first lane alone to find out.
                try:
                    got = await self._request(request, positions[:1])
                except BackendError as err:
                    for position in positions:
                        out[position] = err
                    return
            self._stop_merging("refused", len(positions), None, str(refused.error))
        except BackendError as err:
            for position in positions:
                out[position] = err
            return
        missing = [p for p in positions if p not in got]
        if missing and self._config.n == "auto":
            self._stop_merging("fewer_choices", len(positions), len(got), None)
        elif missing:
            short = BadResponseError(
                f"{self._where}: {len(got)} of {len(positions)} choices returned for n"
            )
            for position in missing:
                out[position] = short
            missing = []
        for position, sample in got.items():
            out[position] = sample
        if missing:
            await self._singles(request, missing, out)

    def _stop_merging(
        self, reason: str, requested: int, received: int | None, message: str | None
    ) -> None:
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
        except (ValidationError, ValueError) as exc:
            raise self._bad(f"malformed body ({_first_line(exc)})") from exc
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
            samples[positions[slot]] = Sample(
                lane=lanes[slot].lane,
                text=choice.text,
                finish_reason=choice.finish_reason,
                usage=lane_usage,
                logprobs=choice.logprobs if request.params.logprobs else None,
                extra=dict(extra),
            )
        return samples

    async def _exchange(self, body: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        """POST `body`; status, headers and the whole body, or a transport error mapped."""
        try:
            async with self._client.stream("POST", self._path, json=body) as response:
                try:
                    raw = await response.aread()
                except httpx.TimeoutException as exc:
                    raise BackendTimeoutError(f"{self._where}: timed out reading body") from exc
                except httpx.TransportError as exc:
                    raise self._bad(f"truncated body ({_first_line(exc)})") from exc
                return response.status_code, response.headers, raw
        except httpx.TimeoutException as exc:
            raise BackendTimeoutError(
                f"{self._where}: no answer within {self._config.timeout_s:g} s"
            ) from exc
        except httpx.TransportError as exc:
            raise ServerError(self._redact(f"{self._where}: {_first_line(exc)}")) from exc

    def _bad(self, what: str) -> BadResponseError:
        return BadResponseError(self._redact(f"{self._where}: {what}"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
