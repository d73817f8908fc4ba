"""What the record looks like to other tools: each run exported as an OpenTelemetry trace.

`OtelHook` is a hook (`[[hooks]] kind = "otel"`, `--otel-endpoint URL`); it needs the `otel`
extra (`pip install 'lanefold[otel]'`). See docs/otel.md.
"""

from __future__ import annotations

from lanefold.telemetry._otel import OtelHook, flush_all, trace_id_of

__all__ = ("OtelHook", "flush_all", "trace_id_of")
