"""The `otel` hook against Arize Phoenix: a run exported over OTLP/HTTP is listed, span by span,
by Phoenix's own API (`make integration`, its `phoenix` part, starts Phoenix and sets
LANEFOLD_PHOENIX_URL; without it these skip)."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import pytest

import lanefold

pytestmark = pytest.mark.integration

pytest.importorskip("opentelemetry.sdk")


@pytest.fixture
def phoenix() -> str:
    """Phoenix's root URL (its OTLP receiver is `<root>/v1/traces`, its API `<root>/v1/...`)."""
    url = os.environ.get("LANEFOLD_PHOENIX_URL")
    if not url:
        pytest.skip("LANEFOLD_PHOENIX_URL is not set: `make integration` starts Arize Phoenix and sets it")
    return url.removesuffix("/v1")


def _spans(phoenix: str, trace_id: str, want: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The trace's spans as Phoenix lists them, once `want` have arrived."""
    deadline = time.monotonic() + timeout_s
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        got = httpx.get(
            f"{phoenix}/v1/projects/default/spans", params={"trace_id": trace_id, "limit": 1000}, timeout=10
        )
        if got.status_code == 200:
            spans = got.json()["data"]
            if len(spans) >= want:
                return spans
        time.sleep(0.5)
    raise AssertionError(f"Phoenix listed {len(spans)} of the trace's {want} spans within {timeout_s} s")


def _config(k: int) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 3},
            "backend": {"kind": "simulated", "latency_ms": [0, 0], "prompt_tokens": 40, "output_tokens": 20},
        }
    )


def test_phoenix_lists_a_runs_spans_with_parents_and_token_attributes(phoenix: str, tmp_path: Any) -> None:
    from lanefold.telemetry import OtelHook, flush_all, trace_id_of

    hook = OtelHook(OtelHook.Params(endpoint=phoenix))
    result = lanefold.run_sync(_config(3), "What is 17 * 23?", runs_dir=tmp_path, hooks=[hook])
    assert flush_all(30.0)
    trace_id = f"{trace_id_of(result.run_id):032x}"
    spans = _spans(phoenix, trace_id, want=5)
    assert len(spans) == 1 + 1 + 3  # the run, its wave, three lane attempts

    def span_id(span: dict[str, Any]) -> str:
        return str(span["context"]["span_id"])

    (run,) = [s for s in spans if not s.get("parent_id")]
    (wave,) = [s for s in spans if s.get("parent_id") == span_id(run)]
    lanes = [s for s in spans if s.get("parent_id") == span_id(wave)]
    assert len(lanes) == 3
    assert run["attributes"]["lanefold.run_id"] == result.run_id
    inputs = sum(int(s["attributes"]["gen_ai.usage.input_tokens"]) for s in lanes)
    outputs = sum(int(s["attributes"]["gen_ai.usage.output_tokens"]) for s in lanes)
    assert inputs == result.usage.prefill_tokens + result.usage.cached_prefill_tokens
    assert outputs == result.usage.decode_tokens
    assert {int(s["attributes"]["lanefold.lane"]) for s in lanes} == {0, 1, 2}
