"""Each run as an OpenTelemetry trace, exported over OTLP/HTTP by the SDK's own exporter.

A span per run (per process that ran it: a resumed run adds a span to the same trace), per
wave, per lane attempt and per judgement, timed by the events' own clocks and named and
attributed after the GenAI semantic conventions (`gen_ai.operation.name`,
`gen_ai.request.model`, `gen_ai.usage.input_tokens`, ...) plus lanefold's (`lanefold.run_id`,
`lanefold.wave`, `lanefold.lane`, `lanefold.usage.cached_prefill_tokens`,
`lanefold.cost_usd`). The trace id is a function of the run id, so every process that
resumes the run continues its trace.

The hook builds spans as events arrive (a hook's own thread, never the dispatch path) and
hands them to the SDK's batch processor, whose thread exports them: an endpoint that is slow
or down costs the run nothing, and what cannot be sent is dropped by the SDK, not retried
forever. One exporter serves every hook with the same endpoint, headers and service name.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from lanefold.primitives import ConfigError, get_logger, register_hook

__all__ = ("OtelHook", "flush_all", "trace_id_of")

_log = get_logger("lanefold.otel")

try:  # the `otel` extra
    from opentelemetry import trace as trace_api
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - said when a hook is built
    trace_api = None  # type: ignore[assignment]
    IdGenerator = object  # type: ignore[assignment,misc]


class _RunIds(IdGenerator):
    """Random ids, except the trace id of a run's span: a function of its run id."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()
        self.next_trace_id: int | None = None  # set just before a run's span starts

    def generate_span_id(self) -> int:
        return self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        if self.next_trace_id is not None:
            trace_id, self.next_trace_id = self.next_trace_id, None
            return trace_id
        return self.random.generate_trace_id()


def trace_id_of(run_id: str) -> int:
    """The trace id of a run: 128 bits of the sha256 of its id (never 0)."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


@dataclass
class _Exporter:
    """One endpoint's provider, its id generator and the lock that serialises span starts."""

    provider: Any
    ids: _RunIds
    lock: threading.Lock = field(default_factory=threading.Lock)


_EXPORTERS: dict[tuple[Any, ...], _Exporter] = {}
_EXPORTERS_LOCK = threading.Lock()


def _exporter(params: OtelHook.Params) -> _Exporter:
    key = (str(params.endpoint), tuple(sorted(params.headers.items())), params.service_name, params.timeout_s)
    with _EXPORTERS_LOCK:
        found = _EXPORTERS.get(key)
        if found is None:
            ids = _RunIds()
            provider = TracerProvider(
                resource=Resource.create({"service.name": params.service_name}), id_generator=ids
            )
            exporter = OTLPSpanExporter(
                endpoint=str(params.endpoint).rstrip("/") + "/v1/traces",
                headers=dict(params.headers),
                timeout=params.timeout_s,
            )
            provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
            found = _EXPORTERS[key] = _Exporter(provider, ids)
        return found


def flush_all(timeout_s: float = 5.0) -> bool:
    """Export every span built so far, waiting at most `timeout_s` for each endpoint; whether
    all were sent. (At exit the SDK flushes by itself, bounded by the exporter's timeout.)"""
    with _EXPORTERS_LOCK:
        exporters = list(_EXPORTERS.values())
    return all(e.provider.force_flush(int(timeout_s * 1000)) for e in exporters)


def _ns(event: Any) -> int:
    return int(event.time.timestamp() * 1_000_000_000)


@dataclass
class _Run:
    """The open spans of one run in this process."""

    span: Any
    model: str
    operation: str
    waves: dict[int, Any] = field(default_factory=dict)
    purposes: dict[int, str] = field(default_factory=dict)
    lanes: dict[tuple[int, int, int], Any] = field(default_factory=dict)
    reduce: Any = None


@register_hook("otel")
class OtelHook:
    """Exports each run it sees as a trace to an OTLP/HTTP endpoint (`[[hooks]] kind =
    "otel"`, or `--otel-endpoint URL` on the command line)."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")

        endpoint: HttpUrl  # the OTLP/HTTP base URL: spans go to <endpoint>/v1/traces
        service_name: str = "lanefold"
        headers: dict[str, str] = Field(default_factory=dict)  # e.g. an API key for the receiver
        timeout_s: float = Field(3.0, gt=0, le=60)  # one export's limit, retries included

    def __init__(self, params: OtelHook.Params) -> None:
        if trace_api is None:
            raise ConfigError("hooks: kind 'otel' needs the otel extra: pip install 'lanefold[otel]'")
        self.params = params
        self.exporter = _exporter(params)
        self.tracer = self.exporter.provider.get_tracer("lanefold")
        self.runs: dict[str, _Run] = {}

    def __reduce__(self) -> tuple[Any, ...]:  # travels to a worker as its params
        return (OtelHook, (self.params,))

    # -- events -----------------------------------------------------------------------------

    def on_event(self, event: Any) -> None:
        kind = event.type
        if kind in ("run.started", "run.resumed"):
            self._start_run(event)
            return
        run = self.runs.get(event.run_id)
        if run is None:
            return  # a run this hook saw begin in no process of its own: nothing to parent it
        if kind == "wave.started":
            self._start_wave(run, event)
        elif kind == "lane.dispatched":
            self._start_lane(run, event)
        elif kind in ("lane.completed", "lane.failed", "lane.interrupted"):
            self._end_lane(run, event)
        elif kind == "wave.barrier":
            span = run.waves.pop(event.wave, None)
            if span is not None:
                span.set_attribute("lanefold.wave.completed", len(event.data.completed))
                span.set_attribute("lanefold.wave.failed", len(event.data.failed))
                span.end(end_time=_ns(event))
        elif kind == "judge.completed":
            self._judgement(run, event)
        elif kind == "reduce.started":
            run.reduce = self.tracer.start_span(
                "lanefold.reduce",
                context=trace_api.set_span_in_context(run.span),
                start_time=_ns(event),
                attributes={"lanefold.run_id": event.run_id, "lanefold.reducer": event.data.reducer},
            )
        elif kind == "reduce.completed":
            if run.reduce is not None:
                run.reduce.end(end_time=_ns(event))
                run.reduce = None
        elif kind in ("run.completed", "run.failed", "run.interrupted"):
            self._end_run(run, event)

    def on_run_end(self, result: Any) -> None:
        run = self.runs.pop(getattr(result, "run_id", ""), None)
        if run is not None:  # its end event never came (a hook that joined late): close it
            run.span.end()

    # -- spans ------------------------------------------------------------------------------

    def _start_run(self, event: Any) -> None:
        resumed = event.type == "run.resumed"
        attributes: dict[str, Any] = {"lanefold.run_id": event.run_id, "lanefold.resumed": resumed}
        model, loop = "", ""
        if not resumed:
            data = event.data
            model, loop = data.backend, data.coordinator
            attributes.update(
                {
                    "gen_ai.request.model": model,
                    "lanefold.loop": loop,
                    "lanefold.config_hash": data.config_hash,
                }
            )
        with self.exporter.lock:  # the id generator's next trace id is this span's
            self.exporter.ids.next_trace_id = trace_id_of(event.run_id)
            span = self.tracer.start_span(
                f"lanefold.run {loop}".strip(),
                context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
                kind=SpanKind.INTERNAL,
                start_time=_ns(event),
                attributes=attributes,
            )
            self.exporter.ids.next_trace_id = None
        self.runs[event.run_id] = _Run(span, model=model, operation="chat")

    def _start_wave(self, run: _Run, event: Any) -> None:
        data = event.data
        run.purposes[event.wave] = data.purpose
        run.waves[event.wave] = self.tracer.start_span(
            f"lanefold.wave {data.purpose}",
            context=trace_api.set_span_in_context(run.span),
            start_time=_ns(event),
            attributes={
                "lanefold.run_id": event.run_id,
                "lanefold.wave": event.wave,
                "lanefold.wave.purpose": data.purpose,
                "lanefold.wave.k": data.k,
                "lanefold.wave.k_requested": data.k_requested,
                "lanefold.wave.share_prefix": data.share_prefix,
            },
        )

    def _start_lane(self, run: _Run, event: Any) -> None:
        parent = run.waves.get(event.wave, run.span)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": run.operation,
            "gen_ai.request.max_tokens": event.data.max_tokens,
            "gen_ai.request.seed": event.data.seed,
            "lanefold.run_id": event.run_id,
            "lanefold.wave": event.wave,
            "lanefold.lane": event.lane,
            "lanefold.attempt": event.attempt or 1,
            "lanefold.wave.purpose": run.purposes.get(event.wave, ""),
        }
        if run.model:
            attributes["gen_ai.request.model"] = run.model
        run.lanes[(event.wave, event.lane, event.attempt or 1)] = self.tracer.start_span(
            f"{run.operation} {run.model}".strip(),
            context=trace_api.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            start_time=_ns(event),
            attributes=attributes,
        )

    def _end_lane(self, run: _Run, event: Any) -> None:
        span = run.lanes.pop((event.wave, event.lane, event.attempt or 1), None)
        if span is None:
            return
        data = event.data
        if event.type == "lane.completed":
            usage, cost = data.usage, data.cost_usd
            span.set_attribute("gen_ai.response.finish_reasons", [data.finish_reason])
            if data.answer is not None:
                span.set_attribute("lanefold.answer", data.answer)
        else:
            usage, cost = data.billed, data.billed_cost_usd
            what = f"{data.error}: {data.message}" if event.type == "lane.failed" else data.reason
            span.set_status(Status(StatusCode.ERROR, what))
            if event.type == "lane.failed":
                span.set_attribute("error.type", data.error)
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens + usage.cached_input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens)
        span.set_attribute("lanefold.usage.prefill_tokens", usage.input_tokens)
        span.set_attribute("lanefold.usage.cached_prefill_tokens", usage.cached_input_tokens)
        span.set_attribute("lanefold.cost_usd", cost)
        span.end(end_time=_ns(event))

    def _judgement(self, run: _Run, event: Any) -> None:
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
        span = self.tracer.start_span(
            "lanefold.judge",
            context=trace_api.set_span_in_context(run.reduce or run.span),
            start_time=at,
            attributes=attributes,
        )
        if data.error is not None:
            span.set_status(Status(StatusCode.ERROR, data.error))
        span.end(end_time=at)

    def _end_run(self, run: _Run, event: Any) -> None:
        self.runs.pop(event.run_id, None)
        for span in [*run.lanes.values(), *run.waves.values(), *([run.reduce] if run.reduce else [])]:
            span.end(end_time=_ns(event))  # what the run left open ends with it
        span = run.span
        span.set_attribute("lanefold.status", event.type.removeprefix("run."))
        data = event.data
        if event.type == "run.completed":
            result = data.result
            for key in ("answer", "status", "reducer", "agreement", "lanes_completed", "lanes_failed"):
                if result.get(key) is not None:
                    span.set_attribute(f"lanefold.{key}", result[key])
            usage, cost = result.get("usage") or {}, result.get("cost") or {}
            prefill, cached = usage.get("prefill_tokens", 0), usage.get("cached_prefill_tokens", 0)
            span.set_attribute("gen_ai.usage.input_tokens", prefill + cached)
            span.set_attribute("gen_ai.usage.output_tokens", usage.get("decode_tokens", 0))
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
            span.set_attribute("lanefold.usage.cached_prefill_tokens", cached)
            span.set_attribute("lanefold.usage.verifier_tokens", usage.get("verifier_tokens", 0))
            span.set_attribute("lanefold.cost_usd", float(cost.get("total", 0.0)))
        elif event.type == "run.failed":
            span.set_status(Status(StatusCode.ERROR, f"{data.error}: {data.message}"))
            span.set_attribute("error.type", data.error)
        else:
            span.set_attribute("lanefold.interrupted_by", data.reason)
        span.end(end_time=_ns(event))
