"""A client's W3C trace context, read and written by OpenTelemetry's own propagator.

What crosses into a run is header text (`traceparent`, and `tracestate` where sent), never an
OpenTelemetry object: the gateway reads a request's headers with `trace_context_of`, the run
records the text in its `run.started` (and each `run.resumed`), and the `otel` hook turns it
back into the client's span context with `client_span`. Parsing is the W3C propagator's
(`TraceContextTextMapPropagator`), so a malformed or all-zero header is no context at all, as
the W3C recommendation says: the run then begins a trace of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ("client_span", "trace_context_of")

try:  # opentelemetry-api: the `otel` extra
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _W3C: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - without the extra no request carries a context in
    _W3C = None


def _context_of(carrier: Mapping[str, str]) -> Any:
    """The propagator's context for `carrier` and the span context it holds, or None where it
    holds no valid one."""
    context = _W3C.extract(carrier)
    span = get_current_span(context).get_span_context()
    return (context, span) if span.is_valid else None


def trace_context_of(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The W3C trace context a request's `headers` carry, as the propagator writes it back
    (`traceparent`, and `tracestate` where one was sent): the header text a run records. None
    where they carry no valid `traceparent`, or where OpenTelemetry is not installed."""
    if _W3C is None:
        return None
    found = _context_of(headers)
    if found is None:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=found[0])
    return carrier


def client_span(trace_context: Mapping[str, str] | None) -> Any:
    """The remote `SpanContext` recorded header text names (the client's span, which the run's
    spans are children of), or None where there is none or it is not valid."""
    if not trace_context or _W3C is None:
        return None
    found = _context_of(trace_context)
    return found[1] if found is not None else None
