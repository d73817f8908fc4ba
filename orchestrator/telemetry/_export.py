"""Where the otel hook's spans go: one SDK batch processor per OTLP/HTTP endpoint, shared.

One exporter (and one SDK thread) serves every hook with the same endpoint, headers, service
name and timeout, however many runs build one; `_Breaker` leaves an endpoint that fails alone
for a while, so a dead receiver costs (almost) nothing. A hook given an SDK exporter of its own
(Python only) gets a processor of its own that hands each span over as it ends.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass
from typing import Any

from lanefold.config import VERSION
from lanefold.primitives import get_logger

__all__ = ("Exporter", "flush_all", "otlp_exporter", "own_exporter")

_log = get_logger("lanefold.otel")

try:  # the `otel` extra
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
except ImportError:  # pragma: no cover - said when a hook is built
    SpanExporter = object  # type: ignore[assignment,misc]

_SCOPE_NAME = "lanefold"
_RETRY_AFTER_S = (2.0, 60.0)  # how long a down endpoint is left alone: first, at most


class _Breaker(SpanExporter):
    """The SDK's exporter, left alone for a while after it fails: while an endpoint is down a
    batch is dropped at once, not encoded and retried, so a dead receiver costs (almost)
    nothing. The wait doubles per failure up to a minute and resets on a success."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.wait = _RETRY_AFTER_S[0]
        self.down_until = 0.0
        self.dropped = 0

    def export(self, spans: Any) -> Any:
        now = time.monotonic()
        if now < self.down_until:
            self.dropped += len(spans)
            return SpanExportResult.FAILURE
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            self.wait = _RETRY_AFTER_S[0]
        else:
            _log.warning("otel.endpoint_down", retry_after_s=self.wait, spans_dropped=len(spans))
            self.down_until = time.monotonic() + self.wait
            self.wait = min(self.wait * 2, _RETRY_AFTER_S[1])
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


@dataclass
class Exporter:
    """A span processor (what a finished span is handed to), the resource and the scope."""

    processor: Any
    resource: Any
    scope: Any


_EXPORTERS: dict[tuple[Any, ...], Exporter] = {}
_EXPORTERS_LOCK = threading.Lock()


def _made(processor: Any, service_name: str) -> Exporter:
    return Exporter(
        processor, Resource.create({"service.name": service_name}), InstrumentationScope(_SCOPE_NAME, VERSION)
    )


def otlp_exporter(endpoint: str, headers: dict[str, str], service_name: str, timeout_s: float) -> Exporter:
    """The shared batch exporter to `endpoint`/v1/traces (made on first use; its thread
    exports every half second, and what is left goes out at exit, within the timeout)."""
    key = (endpoint, tuple(sorted(headers.items())), service_name, timeout_s)
    with _EXPORTERS_LOCK:
        found = _EXPORTERS.get(key)
        if found is None:
            exporter = OTLPSpanExporter(
                endpoint=endpoint.rstrip("/") + "/v1/traces", headers=headers, timeout=timeout_s
            )
            processor = BatchSpanProcessor(_Breaker(exporter), schedule_delay_millis=500)
            atexit.register(processor.shutdown)
            found = _EXPORTERS[key] = _made(processor, service_name)
        return found


def own_exporter(exporter: Any, service_name: str) -> Exporter:
    """A processor of one hook's own that hands each span to the SDK `exporter` as it ends."""
    return _made(SimpleSpanProcessor(exporter), service_name)


def flush_all(timeout_s: float = 5.0) -> bool:
    """Export every span built so far, waiting at most `timeout_s` for each endpoint; whether
    all were sent. (At exit the SDK flushes by itself, bounded by the exporter's timeout.)"""
    with _EXPORTERS_LOCK:
        exporters = list(_EXPORTERS.values())
    return all(e.processor.force_flush(int(timeout_s * 1000)) for e in exporters)
