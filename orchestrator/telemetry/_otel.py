"""Each run as an OpenTelemetry trace, exported over OTLP/HTTP by the SDK's own exporter.

A span per run (per process that ran it: a resumed run adds a span to the same trace), per
wave, per lane attempt and per judgement, timed by the events' own clocks and named and
attributed after the GenAI semantic conventions (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.usage.input_tokens`, ...) plus lanefold's (`lanefold.run_id`,
`lanefold.wave`, `lanefold.lane`, `lanefold.usage.cached_prefill_tokens`,
`lanefold.cost_usd`). The trace id is a function of the run id, so every process that
resumes the run continues its trace; a run that records a W3C trace context (a gateway
client's `traceparent`) is instead a child of that span, in the client's trace, each of its
segments alike. Prompts and answers go on spans only with `capture_content` (`_content`).

The hook builds spans as events arrive (a hook's own thread, never the dispatch path) and
hands them to the SDK's batch processor, whose thread exports them: an endpoint that is slow
or down costs the run nothing, and what cannot be sent is dropped by the SDK, not retried
forever. One exporter serves every hook with the same endpoint, headers and service name.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

from lanefold.primitives import (
    AnyEvent,
    ConfigError,
    Event,
    RunResult,
    check_headers,
    check_headers_env,
    headers_from_env,
    register_hook,
)
from lanefold.primitives.events import (
    JudgeCompleted,
    LaneCompleted,
    LaneDispatched,
    LaneFailed,
    LaneInterrupted,
    ReduceCompleted,
    ReduceStarted,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunResumed,
    RunStarted,
    WaveBarrier,
    WaveStarted,
)
from lanefold.telemetry._content import INPUT_MESSAGES, OUTPUT_MESSAGES, input_messages, output_messages
from lanefold.telemetry._export import flush_all, otlp_exporter, own_exporter
from lanefold.telemetry._propagation import client_span

__all__ = ("OtelHook", "flush_all", "trace_id_of")

try:  # the `otel` extra
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - said when a hook is built
    ReadableSpan = None  # type: ignore[assignment,misc]
    SpanExporter = object  # type: ignore[assignment,misc]

_SAMPLED = 1  # TraceFlags.SAMPLED: every span of a run is kept
_FLAGS = TraceFlags(_SAMPLED) if ReadableSpan is not None else None
_UNSET: Any = Status(StatusCode.UNSET) if ReadableSpan is not None else None


def trace_id_of(run_id: str) -> int:
    """The trace id of a run: 128 bits of the sha256 of its id (never 0)."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


def _ns(event: Event) -> int:
    return int(event.time.timestamp() * 1_000_000_000)


@dataclass(slots=True)
class _Open:
    """A span begun and not yet ended: what its ReadableSpan will be made of."""

    name: str
    context: Any  # its SpanContext
    parent: Any  # the parent's SpanContext, None for a run's
    start: int
    attributes: dict[str, Any]
    kind: Any = None
    status: Any = None


@dataclass
class _Run:
    """The open spans of one run in this process."""

    span: _Open
    model: str
    operation: str
    waves: dict[int, _Open] = field(default_factory=dict)
    purposes: dict[int, str] = field(default_factory=dict)
    lanes: dict[tuple[int, int, int], _Open] = field(default_factory=dict)
    reduce: _Open | None = None


@register_hook("otel")
class OtelHook:
    """Exports each run it sees as a trace to an OTLP/HTTP endpoint (`[[hooks]] kind =
    "otel"`, or `--otel-endpoint URL` on the command line)."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")

        endpoint: HttpUrl  # the OTLP/HTTP base URL: spans go to <endpoint>/v1/traces
        service_name: str = "lanefold"
        headers: dict[str, str] = Field(default_factory=dict)  # plain ones: no secret (recorded)
        # header -> the environment variable holding its value (an API key for the receiver):
        # read when the hook is built, in each process that builds it, never recorded
        headers_env: dict[str, str] = Field(default_factory=dict)
        timeout_s: float = Field(3.0, gt=0, le=60)  # one export's limit, retries included
        # prompts and answers on spans (gen_ai.input.messages, gen_ai.output.messages,
        # lanefold.answer): off unless asked, as what a run is asked may not leave the machine
        capture_content: bool = False

        @field_validator("headers")
        @classmethod
        def _plain(cls, value: dict[str, str]) -> dict[str, str]:
            return check_headers(value)

        @field_validator("headers_env")
        @classmethod
        def _named(cls, value: dict[str, str]) -> dict[str, str]:
            return check_headers_env(value)

    def __init__(self, params: OtelHook.Params, *, exporter: SpanExporter | None = None) -> None:
        """`exporter` (Python only): an SDK exporter of this process that is handed each span
        as it ends (a test's `InMemorySpanExporter`, a `ConsoleSpanExporter`) instead of the
        OTLP/HTTP one to `params.endpoint`; such a hook is not sent to an executor's workers."""
        if ReadableSpan is None:
            raise ConfigError("hooks: kind 'otel' needs the otel extra: pip install 'lanefold[otel]'")
        self.params = params
        self.own = exporter is not None
        if exporter is not None:
            self.exporter = own_exporter(exporter, params.service_name)
        else:
            secrets = headers_from_env(params.headers_env, os.environ, where="hooks: otel: headers_env")
            self.exporter = otlp_exporter(
                str(params.endpoint), {**params.headers, **secrets}, params.service_name, params.timeout_s
            )
        self.runs: dict[str, _Run] = {}

    def __reduce__(self) -> tuple[Any, ...]:  # travels to a worker as its params
        if self.own:
            raise TypeError("an otel hook given its own exporter stays in its process")
        return (OtelHook, (self.params,))

    # -- events -----------------------------------------------------------------------------

    def on_event(self, event: AnyEvent) -> None:
        """Each event by its class (a type checker holds each branch to its event's `data`);
        one this hook has no span for (a budget event, a loop's own) passes by."""
        if isinstance(event, RunStarted | RunResumed):
            self._start_run(event)
            return
        run = self.runs.get(event.run_id or "")
        if run is None:
            return  # a run this hook saw begin in no process of its own: nothing to parent it
        match event:
            case LaneDispatched():
                self._start_lane(run, event)
            case LaneCompleted() | LaneFailed() | LaneInterrupted():
                self._end_lane(run, event)
            case WaveStarted():
                self._start_wave(run, event)
            case WaveBarrier():
                self._end_wave(run, event)
            case JudgeCompleted():
                self._judgement(run, event)
            case ReduceStarted():
                run.reduce = self._open(
                    "lanefold.reduce",
                    run.span,
                    _ns(event),
                    {"lanefold.run_id": event.run_id, "lanefold.reducer": event.data.reducer},
                )
            case ReduceCompleted():
                if run.reduce is not None:
                    self._end(run.reduce, _ns(event))
                    run.reduce = None
            case RunCompleted() | RunFailed() | RunInterrupted():
                self._end_run(run, event)

    def on_run_end(self, result: RunResult) -> None:
        run = self.runs.pop(result.run_id, None)
        if run is not None:  # its end event never came (a hook that joined late): close it
            self._end(run.span, time.time_ns())

    # -- spans ------------------------------------------------------------------------------

    def _open(
        self, name: str, parent: _Open, start: int, attributes: dict[str, Any], kind: Any = None
    ) -> _Open:
        trace = parent.context
        context = SpanContext(trace.trace_id, random.getrandbits(64) or 1, False, _FLAGS, trace.trace_state)
        return _Open(name, context, trace, start, attributes, kind)

    def _end(self, span: _Open, end: int) -> None:
        """The span, finished, to the batch processor (its thread exports it)."""
        e = self.exporter
        readable = ReadableSpan(
            span.name,
            context=span.context,
            parent=span.parent,
            resource=e.resource,
            attributes=span.attributes,
            kind=span.kind or SpanKind.INTERNAL,
            status=span.status or _UNSET,
            start_time=span.start,
            end_time=max(end, span.start),
            instrumentation_scope=e.scope,
        )
        e.processor.on_end(readable)

    def _start_run(self, event: RunStarted | RunResumed) -> None:
        run_id = event.run_id or ""
        resumed = isinstance(event, RunResumed)
        attributes: dict[str, Any] = {"lanefold.run_id": run_id, "lanefold.resumed": resumed}
        model, loop = "", ""
        if isinstance(event, RunStarted):
            data = event.data
            model, loop = data.backend, data.coordinator
            attributes["gen_ai.request.model"] = model
            attributes["lanefold.loop"] = loop
            attributes["lanefold.config_hash"] = data.config_hash
            # who asked and what for, where a gateway's client did (never the key itself)
            for name, value in (
                ("lanefold.requested_model", data.model),
                ("lanefold.caller", data.caller),
                ("lanefold.request_id", data.request_id),
            ):
                if value is not None:
                    attributes[name] = value
            if self.params.capture_content:
                attributes[INPUT_MESSAGES] = input_messages(
                    data.conversation, data.question, data.turns_after
                )
        # A client's span (the W3C context the run records) is the run's parent, in its trace;
        # else the run is a trace of its own, its id a function of the run's.
        client = client_span(event.data.trace_context)
        trace_id, state = (client.trace_id, client.trace_state) if client else (trace_id_of(run_id), None)
        context = SpanContext(trace_id, random.getrandbits(64) or 1, False, _FLAGS, state)
        span = _Open(f"lanefold.run {loop}".strip(), context, client, _ns(event), attributes)
        self.runs[run_id] = _Run(span, model=model, operation="chat")

    def _start_wave(self, run: _Run, event: WaveStarted) -> None:
        data, wave = event.data, event.wave or 0  # a wave's events always carry their wave
        run.purposes[wave] = data.purpose
        run.waves[wave] = self._open(
            f"lanefold.wave {data.purpose}",
            run.span,
            _ns(event),
            {
                "lanefold.run_id": event.run_id,
                "lanefold.wave": event.wave,
                "lanefold.wave.purpose": data.purpose,
                "lanefold.wave.k": data.k,
                "lanefold.wave.k_requested": data.k_requested,
                "lanefold.wave.share_prefix": data.share_prefix,
            },
        )

    def _end_wave(self, run: _Run, event: WaveBarrier) -> None:
        wave = run.waves.pop(event.wave or 0, None)
        if wave is not None:
            wave.attributes["lanefold.wave.completed"] = len(event.data.completed)
            wave.attributes["lanefold.wave.failed"] = len(event.data.failed)
            self._end(wave, _ns(event))

    def _start_lane(self, run: _Run, event: LaneDispatched) -> None:
        wave = event.wave or 0
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": run.operation,
            "gen_ai.request.max_tokens": event.data.max_tokens,
            "gen_ai.request.seed": event.data.seed,
            "lanefold.run_id": event.run_id,
            "lanefold.wave": event.wave,
            "lanefold.lane": event.lane,
            "lanefold.attempt": event.attempt or 1,
            "lanefold.wave.purpose": run.purposes.get(wave, ""),
        }
        if run.model:
            attributes["gen_ai.request.model"] = run.model
        run.lanes[(wave, event.lane or 0, event.attempt or 1)] = self._open(
            f"{run.operation} {run.model}".strip(),
            run.waves.get(wave, run.span),
            _ns(event),
            attributes,
            SpanKind.CLIENT,
        )

    def _end_lane(self, run: _Run, event: LaneCompleted | LaneFailed | LaneInterrupted) -> None:
        span = run.lanes.pop((event.wave or 0, event.lane or 0, event.attempt or 1), None)
        if span is None:
            return
        attributes = span.attributes
        if isinstance(event, LaneCompleted):
            usage, cost = event.data.usage, event.data.cost_usd
            attributes["gen_ai.response.finish_reasons"] = (event.data.finish_reason,)
            if self.params.capture_content:
                attributes[OUTPUT_MESSAGES] = output_messages(event.data.text, event.data.finish_reason)
                if event.data.answer is not None:
                    attributes["lanefold.answer"] = event.data.answer
        elif isinstance(event, LaneFailed):
            usage, cost = event.data.billed, event.data.billed_cost_usd
            span.status = Status(StatusCode.ERROR, f"{event.data.error}: {event.data.message}")
            attributes["error.type"] = event.data.error
        else:
            usage, cost = event.data.billed, event.data.billed_cost_usd
            span.status = Status(StatusCode.ERROR, event.data.reason)
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens + usage.cached_input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
        attributes["lanefold.usage.prefill_tokens"] = usage.input_tokens
        attributes["lanefold.usage.cached_prefill_tokens"] = usage.cached_input_tokens
        attributes["lanefold.cost_usd"] = cost
        self._end(span, _ns(event))

    def _judgement(self, run: _Run, event: JudgeCompleted) -> None:
        data = event.data
        attributes: dict[str, Any] = {
            "lanefold.run_id": event.run_id,
            "lanefold.judge": data.judge,
            "lanefold.candidate_wave": data.candidate_wave,
            "lanefold.candidate_lane": data.candidate_lane,
            "lanefold.reduction": data.reduction,
        }
        if data.score is not None:
            attributes["lanefold.score"] = data.score
        if data.passed is not None:
            attributes["lanefold.passed"] = data.passed
        at = _ns(event)
        span = self._open("lanefold.judge", run.reduce or run.span, at, attributes)
        if data.error is not None:
            span.status = Status(StatusCode.ERROR, data.error)
        self._end(span, at)

    @staticmethod
    def _answer(attributes: dict[str, Any], result: dict[str, Any]) -> None:
        """The run's answer (content: only when captured): the winning lane's text as the
        output message (what a gateway client is sent), the extracted answer beside it."""
        if result.get("answer") is not None:
            attributes["lanefold.answer"] = result["answer"]
        text = result.get("winner_text") or result.get("answer")
        if text is not None:
            attributes[OUTPUT_MESSAGES] = output_messages(text, "stop")

    def _end_run(self, run: _Run, event: RunCompleted | RunFailed | RunInterrupted) -> None:
        self.runs.pop(event.run_id or "", None)
        at = _ns(event)
        for left in [*run.lanes.values(), *run.waves.values(), *([run.reduce] if run.reduce else [])]:
            self._end(left, at)  # what the run left open ends with it
        span, attributes = run.span, run.span.attributes
        attributes["lanefold.status"] = event.type.removeprefix("run.")  # its own word: completed, ...
        if isinstance(event, RunCompleted):
            result = event.data.result
            for key in ("status", "reducer", "agreement", "lanes_completed", "lanes_failed"):
                if result.get(key) is not None:
                    attributes[f"lanefold.{key}"] = result[key]
            if self.params.capture_content:
                self._answer(attributes, result)
            usage, cost = result.get("usage") or {}, result.get("cost") or {}
            prefill, cached = usage.get("prefill_tokens", 0), usage.get("cached_prefill_tokens", 0)
            attributes["gen_ai.usage.input_tokens"] = prefill + cached
            attributes["gen_ai.usage.output_tokens"] = usage.get("decode_tokens", 0)
            attributes["gen_ai.usage.cache_read.input_tokens"] = cached
            attributes["lanefold.usage.cached_prefill_tokens"] = cached
            attributes["lanefold.usage.verifier_tokens"] = usage.get("verifier_tokens", 0)
            attributes["lanefold.cost_usd"] = float(cost.get("total", 0.0))
        elif isinstance(event, RunFailed):
            span.status = Status(StatusCode.ERROR, f"{event.data.error}: {event.data.message}")
            attributes["error.type"] = event.data.error
        else:
            attributes["lanefold.interrupted_by"] = event.data.reason
        self._end(span, at)
