"""The gateway continues a client's W3C trace, and spans carry prompts and answers only when
asked (issue 41 item 7).

Requests go through the real gateway app, served on loopback in this process; the `otel` hook
hands each span to the SDK's own `InMemorySpanExporter` as it ends. A run's hooks finish before
its request is answered, so every span is there when the response is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("starlette")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes

import lanefold
from lanefold.config import LoopConfig
from lanefold.execution import Session, open_store, read_state
from lanefold.serve._gateway import create_gateway
from lanefold.telemetry import OtelHook, trace_id_of
from tests.loopback import Loopback

TRACE, CLIENT = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE:032x}-{CLIENT:016x}-01"
QUESTION = "What is 17 * 23? (a question only the client knows)"
SYSTEM = "You are terse: a system turn only the client knows."


def _config(k: int = 3, latency_ms: tuple[int, int] = (0, 0)) -> LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 5, "max_concurrency": 2},
            "backend": {"kind": "simulated", "latency_ms": list(latency_ms)},
        }
    )


def _hook(exporter: InMemorySpanExporter, *, capture_content: bool = False) -> OtelHook:
    params = OtelHook.Params(endpoint="http://127.0.0.1:9", capture_content=capture_content)
    return OtelHook(params, exporter=exporter)


@contextmanager
def _gateway(tmp_path: Path, *, capture_content: bool = False) -> Iterator[tuple[httpx.Client, Any, Path]]:
    """The gateway serving `vote` on loopback with an otel hook; a client, the exporter, the runs."""
    exporter = InMemorySpanExporter()
    runs = tmp_path / "runs"
    session = Session(store=open_store(None, runs), hooks=[_hook(exporter, capture_content=capture_content)])
    app = create_gateway(session, {"vote": _config()}, heartbeat_s=0.05)
    with Loopback(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client, exporter, runs


def _chat(**fields: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    return {"model": "vote", "messages": messages, **fields}


def _of_run(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    spans = [
        s for s in exporter.get_finished_spans() if (s.attributes or {}).get("lanefold.run_id") == run_id
    ]
    assert spans
    return spans


def _roots(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    """The run's own spans (one per segment): those whose parent is not one of the run's."""
    ids = {s.context.span_id for s in spans}
    return [s for s in spans if s.parent is None or s.parent.span_id not in ids]


@pytest.mark.parametrize("stream", [False, True])
def test_a_clients_traceparent_makes_every_span_of_the_run_part_of_its_trace(
    tmp_path: Path, stream: bool
) -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc,other=1"}
    with _gateway(tmp_path) as (client, exporter, runs):
        response = client.post("/chat/completions", json=_chat(stream=stream), headers=headers)
        assert response.status_code == 200, response.text
        run_id = response.headers["x-lanefold-run-id"]
    spans = _of_run(exporter, run_id)
    assert len(spans) == 1 + 1 + 3  # the run, its wave, three lanes
    assert {s.context.trace_id for s in spans} == {TRACE}  # the client's trace id, on every span
    (run,) = _roots(spans)
    assert run.name.startswith("lanefold.run ")
    assert run.parent is not None and run.parent.span_id == CLIENT and run.parent.is_remote
    assert all(s.context.trace_state.get("vendor") == "abc" for s in spans)  # tracestate goes on
    # The run records the context as header text, as the propagator writes it.
    started = read_state(open_store(None, runs), run_id).started
    assert started is not None
    assert started.trace_context == {"traceparent": TRACEPARENT, "tracestate": "vendor=abc,other=1"}


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "not a traceparent",
        f"00-{0:032x}-{CLIENT:016x}-01",  # an all-zero trace id is invalid
        f"00-{TRACE:032x}-{0:016x}-01",  # as is an all-zero parent
        f"ff-{TRACE:032x}-{CLIENT:016x}-01",  # version ff is forbidden
    ],
)
def test_no_valid_traceparent_gives_the_run_a_trace_of_its_own(
    tmp_path: Path, traceparent: str | None
) -> None:
    headers = {"traceparent": traceparent} if traceparent is not None else {}
    with _gateway(tmp_path) as (client, exporter, runs):
        response = client.post("/chat/completions", json=_chat(), headers=headers)
        assert response.status_code == 200, response.text
        run_id = response.headers["x-lanefold-run-id"]
    spans = _of_run(exporter, run_id)
    assert {s.context.trace_id for s in spans} == {trace_id_of(run_id)}
    (run,) = _roots(spans)
    assert run.parent is None
    started = read_state(open_store(None, runs), run_id).started
    assert started is not None and started.trace_context is None


def _texts(runs: Path, run_id: str) -> set[str]:
    """What the client sent and what came back: the question, its system turn, every lane's
    text and every answer, as the record holds them."""
    state = read_state(open_store(None, runs), run_id)
    lanes = [lane for wave in state.waves.values() for lane in wave.lanes.values()]
    texts = {QUESTION, SYSTEM, *(lane.text for lane in lanes if lane.text)}
    answers = {lane.answer for lane in lanes if lane.answer}
    assert len(texts) > 2 and answers
    return texts | answers


def test_no_prompt_or_answer_is_on_any_span_without_capture_content(tmp_path: Path) -> None:
    with _gateway(tmp_path) as (client, exporter, runs):
        response = client.post("/chat/completions", json=_chat(), headers={"traceparent": TRACEPARENT})
        assert response.status_code == 200, response.text
        run_id = response.headers["x-lanefold-run-id"]
    spans = _of_run(exporter, run_id)
    content = _texts(runs, run_id) | {response.json()["choices"][0]["message"]["content"]}
    for span in spans:
        attributes = dict(span.attributes or {})
        assert not {"gen_ai.input.messages", "gen_ai.output.messages", "lanefold.answer"} & attributes.keys()
        for name, value in attributes.items():
            values = value if isinstance(value, tuple) else (value,)
            for one in values:
                if isinstance(one, str):
                    assert not any(_holds(one, text) for text in content), (span.name, name)
        assert span.status.description is None or not any(_holds(span.status.description, t) for t in content)


def _holds(value: str, text: str) -> bool:
    """Whether a span's `value` carries `text`: the text itself, or inside it where the text is
    long enough to be a prompt's or an answer's and not a few characters any id may hold (an
    answer "391" inside a run id's random hex is no content on a span)."""
    return value == text or (len(text) >= 8 and text in value)


def test_capture_content_puts_prompts_and_answers_on_spans_by_the_genai_names(tmp_path: Path) -> None:
    # The names are those the installed semantic conventions give (not the removed gen_ai.prompt).
    assert gen_ai_attributes.GEN_AI_INPUT_MESSAGES == "gen_ai.input.messages"
    assert gen_ai_attributes.GEN_AI_OUTPUT_MESSAGES == "gen_ai.output.messages"
    with _gateway(tmp_path, capture_content=True) as (client, exporter, runs):
        response = client.post("/chat/completions", json=_chat())
        assert response.status_code == 200, response.text
        run_id = response.headers["x-lanefold-run-id"]
    spans = _of_run(exporter, run_id)
    (run,) = _roots(spans)
    attributes = dict(run.attributes or {})
    assert json.loads(str(attributes["gen_ai.input.messages"])) == [
        {"role": "system", "parts": [{"type": "text", "content": SYSTEM}]},
        {"role": "user", "parts": [{"type": "text", "content": QUESTION}]},
    ]
    reply = response.json()
    (out,) = json.loads(str(attributes["gen_ai.output.messages"]))
    assert out["role"] == "assistant" and out["finish_reason"] == "stop"
    assert out["parts"] == [{"type": "text", "content": reply["choices"][0]["message"]["content"]}]
    assert attributes["lanefold.answer"] == reply["lanefold"]["answer"]
    state = read_state(open_store(None, runs), run_id)
    lanes = [s for s in spans if s.name.startswith("chat ")]
    assert len(lanes) == 3
    for span in lanes:
        lane_attributes = dict(span.attributes or {})
        recorded = state.waves[int(str(lane_attributes["lanefold.wave"]))].lanes[
            int(str(lane_attributes["lanefold.lane"]))
        ]
        (message,) = json.loads(str(lane_attributes["gen_ai.output.messages"]))
        assert message["parts"][0]["content"] == recorded.text
        assert message["finish_reason"] == lane_attributes["gen_ai.response.finish_reasons"][0]  # type: ignore[index]


@pytest.mark.anyio
async def test_each_segment_of_a_resumed_run_continues_the_trace_it_belongs_to(tmp_path: Path) -> None:
    """Resumed without a context of its own (the CLI's `resume`), a segment continues the one
    the run recorded; resumed by a request that sends one (a gateway retry), that request's."""
    exporter = InMemorySpanExporter()
    retry = 0x1111111111111111
    retried = {"traceparent": f"00-{TRACE:032x}-{retry:016x}-01"}
    async with Session(
        _config(k=16, latency_ms=(40, 60)), runs_dir=tmp_path, hooks=[_hook(exporter)]
    ) as session:
        for _ in range(2):  # cut off twice: once resumed as the CLI does, once as a retry does
            with anyio.move_on_after(0.1):
                if not exporter.get_finished_spans():
                    await session.run(QUESTION, run_id="cut", trace_context={"traceparent": TRACEPARENT})
                else:
                    await session.resume("cut")
        result = await session.resume("cut", trace_context=retried)
    assert result.answer is not None
    spans = _of_run(exporter, "cut")
    assert {s.context.trace_id for s in spans} == {TRACE}
    runs = sorted(_roots(spans), key=lambda s: s.start_time or 0)
    assert [s.parent.span_id if s.parent else None for s in runs] == [CLIENT, CLIENT, retry]
    assert [dict(s.attributes or {})["lanefold.resumed"] for s in runs] == [False, True, True]
    state = read_state(open_store(None, tmp_path), "cut")
    assert state.started is not None and state.started.trace_context == {"traceparent": TRACEPARENT}
