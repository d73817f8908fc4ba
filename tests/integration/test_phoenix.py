"""The `otel` hook against Arize Phoenix: a run exported over OTLP/HTTP is listed, span by span,
by Phoenix's own API (`make integration`, its `phoenix` part, starts Phoenix and sets
LANEFOLD_PHOENIX_URL; without it these skip)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import lanefold

pytestmark = pytest.mark.integration

pytest.importorskip("opentelemetry.sdk")

from lanefold.telemetry import OtelHook, flush_all, trace_id_of  # noqa: E402 (needs the otel extra)

Span = dict[str, Any]


@pytest.fixture
def phoenix() -> str:
    """Phoenix's root URL (its OTLP receiver is `<root>/v1/traces`, its API `<root>/v1/...`)."""
    url = os.environ.get("LANEFOLD_PHOENIX_URL")
    if not url:
        pytest.skip("LANEFOLD_PHOENIX_URL is not set: `make integration` starts Arize Phoenix and sets it")
    return url.removesuffix("/v1")


def _spans(
    phoenix: str, run_id: str, want: int, timeout_s: float = 60.0, trace_id: str | None = None
) -> list[Span]:
    """The run's trace (`trace_id`, by default the run's own) as Phoenix's REST API lists it,
    once `want` spans have arrived (Phoenix writes what it receives in batches, so a flushed
    span is listed a moment later)."""
    trace_id = trace_id or f"{trace_id_of(run_id):032x}"
    deadline = time.monotonic() + timeout_s
    spans: list[Span] = []
    while time.monotonic() < deadline:
        got = httpx.get(
            f"{phoenix}/v1/projects/default/spans", params={"trace_id": trace_id, "limit": 1000}, timeout=10
        )
        got.raise_for_status()
        spans = got.json()["data"]
        if len(spans) >= want:
            assert {s["context"]["trace_id"] for s in spans} == {trace_id}
            return spans
        time.sleep(0.5)
    raise AssertionError(f"Phoenix listed {len(spans)} of the trace's {want} spans within {timeout_s} s")


def _id(span: Span) -> str:
    return str(span["context"]["span_id"])


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.get("parent_id") == _id(parent)]


def _opened(runs_dir: Path, run_id: str) -> int:
    """How many spans the hook opened for the run: one per run segment (started or resumed), per
    wave started and per lane dispatched, read from the run's own log."""
    opening = {"run.started", "run.resumed", "wave.started", "lane.dispatched"}
    with (runs_dir / run_id / "events.jsonl").open() as log:
        return sum(json.loads(line)["type"] in opening for line in log if line.strip())


def _config(k: int) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 3},
            "backend": {"kind": "simulated", "latency_ms": [0, 0], "prompt_tokens": 40, "output_tokens": 20},
        }
    )


def test_phoenix_lists_a_runs_spans_with_parents_and_token_attributes(phoenix: str, tmp_path: Path) -> None:
    # The base URL, as `--otel-endpoint` takes it: the SDK's exporter posts to <phoenix>/v1/traces.
    hook = OtelHook(OtelHook.Params(endpoint=phoenix))
    result = lanefold.run_sync(_config(3), "What is 17 * 23?", runs_dir=tmp_path, hooks=[hook])
    assert flush_all(30.0)
    spans = _spans(phoenix, result.run_id, want=5)
    assert len(spans) == 1 + 1 + 3  # the run, its wave, three lane attempts
    assert {s["attributes"]["lanefold.run_id"] for s in spans} == {result.run_id}

    (run,) = [s for s in spans if not s.get("parent_id")]
    (wave,) = _children(spans, run)
    lanes = _children(spans, wave)
    assert run["name"].startswith("lanefold.run ")
    assert wave["name"] == "lanefold.wave sample"
    assert wave["attributes"]["lanefold.wave.k"] == 3
    assert wave["attributes"]["lanefold.wave.completed"] == 3
    assert sorted(int(s["attributes"]["lanefold.lane"]) for s in lanes) == [0, 1, 2]
    assert all(s["attributes"]["gen_ai.operation.name"] == "chat" for s in lanes)
    assert all(s["status_code"] != "ERROR" for s in spans)

    usage = result.usage
    inputs = [int(s["attributes"]["gen_ai.usage.input_tokens"]) for s in lanes]
    outputs = [int(s["attributes"]["gen_ai.usage.output_tokens"]) for s in lanes]
    assert all(n > 0 for n in inputs + outputs)
    assert sum(inputs) == usage.prefill_tokens + usage.cached_prefill_tokens
    assert sum(outputs) == usage.decode_tokens
    # The run's span carries the bill the lanes add up to.
    assert int(run["attributes"]["gen_ai.usage.input_tokens"]) == sum(inputs)
    assert int(run["attributes"]["gen_ai.usage.output_tokens"]) == sum(outputs)
    assert run["attributes"]["lanefold.status"] == "answered"


@pytest.mark.anyio
async def test_phoenix_shows_a_resumed_run_as_one_trace(phoenix: str, tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"k": 6, "max_concurrency": 2, "seed": 3},
            "backend": {"kind": "simulated", "latency_ms": [40, 60]},
        }
    )
    hook = OtelHook(OtelHook.Params(endpoint=phoenix))
    async with lanefold.Session(config, runs_dir=tmp_path, hooks=[hook]) as session:
        with anyio.move_on_after(0.1):  # cut off mid-wave: some lanes landed, some not
            await session.run("What is 5 + 5?", run_id="phoenix-cut")
        result = await session.resume("phoenix-cut")
    assert result.answer is not None
    assert flush_all(30.0)
    want = _opened(tmp_path, "phoenix-cut")  # two run segments, their waves, each lane attempt
    spans = _spans(phoenix, "phoenix-cut", want=want)
    assert len(spans) == want
    runs = [s for s in spans if not s.get("parent_id")]
    assert len(runs) == 2
    assert {s["attributes"]["lanefold.resumed"] for s in runs} == {False, True}
    assert {s["attributes"]["lanefold.status"] for s in runs} == {"interrupted", "answered"}
    assert {s["attributes"]["lanefold.run_id"] for s in spans} == {"phoenix-cut"}
    ids = {_id(s) for s in spans}
    assert all(s["parent_id"] in ids for s in spans if s.get("parent_id"))  # no orphans


def test_phoenix_finds_a_gateway_run_by_its_clients_trace_id(phoenix: str, tmp_path: Path) -> None:
    """A request to the gateway with a `traceparent`: Phoenix lists the run's spans under the
    client's trace id, the run's span a child of the client's span; `capture_content` puts the
    question on it by the GenAI name."""
    pytest.importorskip("starlette")
    from lanefold.execution import Session, open_store
    from lanefold.serve._gateway import create_gateway
    from tests.loopback import Loopback

    trace, client = 0x3D1F6C0E9A2B4C5D8E7F60718293A4B5, 0x1A2B3C4D5E6F7081
    hook = OtelHook(OtelHook.Params(endpoint=phoenix, capture_content=True))
    session = Session(store=open_store(None, tmp_path), hooks=[hook])
    app = create_gateway(session, {"vote": _config(3)})
    body = {"model": "vote", "messages": [{"role": "user", "content": "What is 19 * 21?"}]}
    with Loopback(app) as server:
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            json=body,
            headers={"traceparent": f"00-{trace:032x}-{client:016x}-01"},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    run_id = response.headers["x-lanefold-run-id"]
    assert flush_all(30.0)
    spans = _spans(phoenix, run_id, want=5, trace_id=f"{trace:032x}")
    assert len(spans) == 1 + 1 + 3
    assert {s["attributes"]["lanefold.run_id"] for s in spans} == {run_id}
    (run,) = [s for s in spans if s.get("parent_id") == f"{client:016x}"]
    assert run["name"].startswith("lanefold.run ")
    (asked,) = json.loads(run["attributes"]["gen_ai.input.messages"])
    assert asked["parts"][0]["content"] == "What is 19 * 21?"
    ids = {_id(s) for s in spans}
    assert all(s["parent_id"] in ids for s in spans if s is not run)
