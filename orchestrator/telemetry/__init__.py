"""What the record looks like to other tools: each run exported as an OpenTelemetry trace.

`OtelHook` is a hook (`[[hooks]] kind = "otel"`, `--otel-endpoint URL`); it needs the `otel`
extra (`pip install 'lanefold[otel]'`). `trace_context_of` reads a request's W3C trace context
(`traceparent`, `tracestate`) as the header text a run records (`Session.run(trace_context=)`),
so that run's spans are children of the caller's span. See docs/otel.md.
"""

from __future__ import annotations

from lanefold.telemetry._otel import OtelHook, flush_all, trace_id_of
from lanefold.telemetry._propagation import trace_context_of

__all__ = ("OtelHook", "flush_all", "trace_context_of", "trace_id_of")
